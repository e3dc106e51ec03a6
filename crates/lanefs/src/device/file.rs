//! Image files and block devices.
//!
//! [`FileDevice::open`] picks the I/O path once, from facts measured on the target machines
//! (figures in `bench.rs`): io_uring with O_DIRECT beats one `pwrite` per block by 2.2-3x on a
//! 64-block scattered batch when direct I/O is real (a block device, or a file on
//! ext4/xfs/btrfs), but on buffered files io_uring punts every request to a kernel worker thread
//! and loses to plain syscalls by about 2x. So `Auto` takes O_DIRECT + io_uring only where direct I/O is real (tmpfs accepts
//! O_DIRECT since Linux 6.6 and ignores it), and the sync path everywhere else.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, IoSliceMut, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;

use rustix::fs::{FallocateFlags, OFlags};

use super::plan::{self, Plan};
use super::uring::UringBackend;
use super::{BlockDevice, IoMode, ReadReq, WriteReq, BLOCK_SIZE};

/// Which I/O path [`FileDevice::open`] should take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoChoice {
    /// io_uring + O_DIRECT where direct I/O is real (block devices, ext4, xfs, btrfs), vectored
    /// sync I/O elsewhere or when io_uring or O_DIRECT is refused.
    #[default]
    Auto,
    /// io_uring, with O_DIRECT where it is real and buffered otherwise (see
    /// [`FileDevice::describe`]); fails if io_uring cannot be set up.
    Uring,
    /// Buffered `pwritev`/`preadv`, one call per contiguous run.
    Sync,
}

impl std::str::FromStr for IoChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(IoChoice::Auto),
            "uring" | "io_uring" | "iouring" => Ok(IoChoice::Uring),
            "sync" => Ok(IoChoice::Sync),
            other => Err(format!("unknown I/O choice {other:?} (auto, uring, sync)")),
        }
    }
}

/// Options for [`FileDevice::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceOptions {
    /// Which I/O path to use: io_uring with O_DIRECT, vectored sync I/O, or chosen per device.
    pub io: IoChoice,
}

/// Creates an image file of `size_bytes` if it is missing, or grows a smaller regular file to
/// that size (sparse, with `set_len`). Never shrinks a file and leaves block devices alone, so it
/// is safe to call on an existing image.
pub fn create_image(path: impl AsRef<Path>, size_bytes: u64) -> io::Result<()> {
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
    let meta = file.metadata()?;
    if meta.file_type().is_file() && meta.len() < size_bytes {
        file.set_len(size_bytes)?;
    }
    Ok(())
}

// statfs f_type magics (linux/magic.h).
const EXT4_SUPER_MAGIC: u64 = 0xEF53;
const XFS_SUPER_MAGIC: u64 = 0x5846_5342;
const BTRFS_SUPER_MAGIC: u64 = 0x9123_683E;
pub(crate) const TMPFS_MAGIC: u64 = 0x0102_1994;
const OVERLAYFS_SUPER_MAGIC: u64 = 0x794C_7630;
const F2FS_SUPER_MAGIC: u64 = 0xF2F5_2010;
const NFS_SUPER_MAGIC: u64 = 0x6969;

pub(crate) fn fs_name(magic: u64) -> String {
    match magic {
        EXT4_SUPER_MAGIC => "ext4".into(),
        XFS_SUPER_MAGIC => "xfs".into(),
        BTRFS_SUPER_MAGIC => "btrfs".into(),
        TMPFS_MAGIC => "tmpfs".into(),
        OVERLAYFS_SUPER_MAGIC => "overlayfs".into(),
        F2FS_SUPER_MAGIC => "f2fs".into(),
        NFS_SUPER_MAGIC => "nfs".into(),
        other => format!("fs 0x{other:x}"),
    }
}

/// What the descriptor refers to; decides whether O_DIRECT means anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// `logical` is the logical block size, when the kernel told us.
    BlockDevice {
        logical: Option<u32>,
    },
    File {
        fs_magic: u64,
    },
}

impl Backing {
    fn direct_is_real(self) -> bool {
        match self {
            // A device whose sectors are larger than our blocks cannot take 4 KiB direct I/O.
            Backing::BlockDevice { logical } => match logical {
                Some(l) => l as usize <= BLOCK_SIZE,
                None => true,
            },
            Backing::File { fs_magic } => {
                matches!(fs_magic, EXT4_SUPER_MAGIC | XFS_SUPER_MAGIC | BTRFS_SUPER_MAGIC)
            }
        }
    }

    fn label(self) -> String {
        match self {
            Backing::BlockDevice { .. } => "block device".into(),
            Backing::File { fs_magic } => fs_name(fs_magic),
        }
    }
}

/// An image file or a block device, read and written in whole 4 KiB blocks.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    blocks: u64,
    backing: Backing,
    direct: bool,
    uring: Option<UringBackend>,
    description: String,
}

/// Turns on O_DIRECT on an open descriptor. `Ok(false)` when the file system refuses it (EINVAL).
fn enable_direct(file: &File) -> io::Result<bool> {
    let flags = rustix::fs::fcntl_getfl(file)?;
    match rustix::fs::fcntl_setfl(file, flags | OFlags::DIRECT) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::INVAL) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn disable_direct(file: &File) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(file)?;
    rustix::fs::fcntl_setfl(file, flags - OFlags::DIRECT)?;
    Ok(())
}

impl FileDevice {
    /// Opens an image file or a block device for reading and writing and picks the I/O path
    /// (see [`IoChoice`]). Fails on anything that is neither a regular file nor a block device.
    pub fn open(path: impl AsRef<Path>, opts: DeviceOptions) -> io::Result<FileDevice> {
        Self::open_with(path.as_ref(), opts, true)
    }

    /// As [`FileDevice::open`], for reading only: every write fails (EBADF). For a read-only
    /// mount of an image that cannot be opened for writing (a write-protected device, a file on
    /// a read-only file system).
    pub fn open_read_only(path: impl AsRef<Path>, opts: DeviceOptions) -> io::Result<FileDevice> {
        Self::open_with(path.as_ref(), opts, false)
    }

    fn open_with(path: &Path, opts: DeviceOptions, writable: bool) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        let meta = file.metadata()?;
        let ft = meta.file_type();
        let (backing, bytes) = if ft.is_block_device() {
            let logical = rustix::fs::ioctl_blksszget(&file).ok();
            // lseek(SEEK_END) on a block device returns its size, the same figure as the
            // BLKGETSIZE64 ioctl, without an `unsafe` ioctl call here.
            let bytes = (&file).seek(SeekFrom::End(0))?;
            (Backing::BlockDevice { logical }, bytes)
        } else if ft.is_file() {
            let st = rustix::fs::fstatfs(&file)?;
            // f_type is a signed word on some targets; the magics are 32-bit.
            let fs_magic = (st.f_type as u64) & 0xFFFF_FFFF;
            (Backing::File { fs_magic }, meta.len())
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file or a block device", path.display()),
            ));
        };
        let blocks = bytes / BLOCK_SIZE as u64;
        let label = backing.label();

        let sync = |file: File, description: String| FileDevice {
            file,
            blocks,
            backing,
            direct: false,
            uring: None,
            description,
        };

        match opts.io {
            IoChoice::Sync => Ok(sync(file, format!("sync-vectored ({label})"))),
            IoChoice::Auto => {
                if !backing.direct_is_real() {
                    return Ok(sync(file, format!("sync-vectored ({label})")));
                }
                if !enable_direct(&file)? {
                    return Ok(sync(file, format!("sync-vectored ({label}: O_DIRECT refused)")));
                }
                match UringBackend::new() {
                    Ok(uring) => Ok(FileDevice {
                        file,
                        blocks,
                        backing,
                        direct: true,
                        description: format!("io_uring+O_DIRECT ({label}, {} rings)", uring.ring_count()),
                        uring: Some(uring),
                    }),
                    Err(e) => {
                        // Buffered sync beats O_DIRECT sync for one-block pwrites on most setups,
                        // and the sync path assumes nothing about buffer alignment.
                        disable_direct(&file)?;
                        Ok(sync(file, format!("sync-vectored ({label}: io_uring unavailable: {e})")))
                    }
                }
            }
            IoChoice::Uring => {
                let (direct, note) = if !backing.direct_is_real() {
                    (false, "buffered: O_DIRECT is not real here")
                } else if enable_direct(&file)? {
                    (true, "")
                } else {
                    (false, "buffered: O_DIRECT refused")
                };
                let uring = UringBackend::new()?;
                let description = if direct {
                    format!("io_uring+O_DIRECT ({label}, {} rings)", uring.ring_count())
                } else {
                    format!("io_uring {note} ({label}, {} rings)", uring.ring_count())
                };
                Ok(FileDevice { file, blocks, backing, direct, uring: Some(uring), description })
            }
        }
    }

    /// One line on the I/O path and why it was chosen, e.g. `io_uring+O_DIRECT (block device,
    /// 2 rings)` or `sync-vectored (tmpfs)`; for `lanefs inspect`.
    pub fn describe(&self) -> String {
        self.description.clone()
    }

    /// Whether the descriptor has O_DIRECT (buffers then bounce unless 4 KiB aligned).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether the device is a block device rather than an image file.
    pub fn is_block_device(&self) -> bool {
        matches!(self.backing, Backing::BlockDevice { .. })
    }

    /// Size in bytes (whole blocks only).
    pub fn size_bytes(&self) -> u64 {
        self.blocks * BLOCK_SIZE as u64
    }
}

impl BlockDevice for FileDevice {
    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        let shape: Vec<(u64, usize)> = reqs.iter().map(|r| (r.addr, r.buf.len())).collect();
        let plan = plan::plan(&shape, self.blocks, false)?;
        if reqs.is_empty() {
            return Ok(());
        }
        match &self.uring {
            Some(u) => u.read_batch(self.file.as_raw_fd(), reqs, &plan, self.direct),
            None => sync_read(&self.file, reqs, &plan),
        }
    }

    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> io::Result<()> {
        let shape: Vec<(u64, usize)> = reqs.iter().map(|r| (r.addr, r.data.len())).collect();
        let plan = plan::plan(&shape, self.blocks, true)?;
        if reqs.is_empty() {
            return Ok(());
        }
        match &self.uring {
            Some(u) => u.write_batch(self.file.as_raw_fd(), reqs, &plan, self.direct),
            None => sync_write(&self.file, reqs, &plan),
        }
    }

    fn flush(&self) -> io::Result<()> {
        if self.flush_is_free() {
            // tmpfs's fsync does nothing (there is no media); skip the system call.
            return Ok(());
        }
        // fdatasync: the image's size never changes, so the data and the block map suffice; on a
        // block device it flushes the device's volatile cache.
        loop {
            match self.file.sync_data() {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn flush_is_free(&self) -> bool {
        // An image in tmpfs: fdatasync has no media to reach. (A block device cannot tell; a
        // loop device over tmpfs counts as a real one.)
        matches!(self.backing, Backing::File { fs_magic: TMPFS_MAGIC })
    }

    fn io_mode(&self) -> IoMode {
        if self.uring.is_some() {
            IoMode::Uring
        } else {
            IoMode::Sync
        }
    }

    /// Punches a hole (files: fallocate) or discards the range (block devices: BLKDISCARD); the
    /// blocks' contents are unspecified afterwards. Devices that cannot do it keep the data,
    /// which is allowed: discard is advice.
    fn discard(&self, addr: u64, blocks: u64) -> io::Result<()> {
        if blocks == 0 {
            return Ok(());
        }
        let len = usize::try_from(blocks)
            .ok()
            .and_then(|b| b.checked_mul(BLOCK_SIZE))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "discard too large"))?;
        plan::check_request(addr, len, self.blocks)?;
        if self.is_block_device() {
            return match super::uring::blk_discard(self.file.as_fd(), addr * BLOCK_SIZE as u64, len as u64) {
                Ok(()) => Ok(()),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOTTY)) => Ok(()),
                Err(e) => Err(e),
            };
        }
        let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(&self.file, mode, addr * BLOCK_SIZE as u64, len as u64) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::NOSYS) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// One system call per run (at most IOV_MAX iovecs), continuing after short writes. A run of one
/// request, the common case for scattered batches, takes plain `pwrite`: `pwritev` would cost an
/// iovec import per call for nothing.
fn sync_write(file: &File, reqs: &[WriteReq<'_>], plan: &Plan) -> io::Result<()> {
    let mut bufs: Vec<&[u8]> = Vec::new();
    for run in &plan.runs {
        let off = run.addr * BLOCK_SIZE as u64;
        let members = &plan.order[run.members.clone()];
        if let [only] = members {
            file.write_all_at(reqs[*only].data, off)?;
            continue;
        }
        bufs.clear();
        bufs.extend(members.iter().map(|&i| reqs[i].data));
        pwritev_all(file, &bufs, off)?;
    }
    Ok(())
}

fn pwritev_all(file: &File, bufs: &[&[u8]], mut off: u64) -> io::Result<()> {
    let (mut idx, mut skip) = (0usize, 0usize);
    while idx < bufs.len() {
        let mut iov = Vec::with_capacity(bufs.len() - idx);
        iov.push(IoSlice::new(&bufs[idx][skip..]));
        iov.extend(bufs[idx + 1..].iter().map(|b| IoSlice::new(b)));
        let n = match rustix::io::pwritev(file, &iov, off) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "pwritev wrote 0 bytes")),
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        off += n as u64;
        advance(bufs.iter().map(|b| b.len()), &mut idx, &mut skip, n);
    }
    Ok(())
}

/// One system call per run (`pread` for a single request), continuing after short reads.
fn sync_read(file: &File, reqs: &mut [ReadReq<'_>], plan: &Plan) -> io::Result<()> {
    // Each request belongs to exactly one run, so each slot is taken once.
    let mut slots: Vec<Option<&mut [u8]>> = reqs.iter_mut().map(|r| Some(&mut *r.buf)).collect();
    for run in &plan.runs {
        let off = run.addr * BLOCK_SIZE as u64;
        let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(run.members.len());
        for &i in &plan.order[run.members.clone()] {
            if let Some(b) = slots.get_mut(i).and_then(Option::take) {
                bufs.push(b);
            }
        }
        if let [only] = bufs.as_mut_slice() {
            // read_exact_at retries EINTR and short reads, and reports EOF as UnexpectedEof.
            file.read_exact_at(only, off)?;
            continue;
        }
        preadv_all(file, &mut bufs, off)?;
    }
    Ok(())
}

fn preadv_all(file: &File, bufs: &mut [&mut [u8]], mut off: u64) -> io::Result<()> {
    let (mut idx, mut skip) = (0usize, 0usize);
    while idx < bufs.len() {
        let lens: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        let res = {
            let Some((head, tail)) = bufs[idx..].split_first_mut() else {
                break;
            };
            let mut iov = Vec::with_capacity(tail.len() + 1);
            iov.push(IoSliceMut::new(&mut head[skip..]));
            iov.extend(tail.iter_mut().map(|b| IoSliceMut::new(b)));
            rustix::io::preadv(file, &mut iov, off)
        };
        let n = match res {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("preadv hit end of file at byte {off}"),
                ))
            }
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        off += n as u64;
        advance(lens.into_iter(), &mut idx, &mut skip, n);
    }
    Ok(())
}

/// Moves the cursor (`idx`, `skip` bytes into `bufs[idx]`) forward by `n` bytes.
fn advance(lens: impl Iterator<Item = usize>, idx: &mut usize, skip: &mut usize, mut n: usize) {
    for len in lens.skip(*idx) {
        let left = len - *skip;
        if n >= left {
            n -= left;
            *idx += 1;
            *skip = 0;
        } else {
            *skip += n;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_walks_across_buffers() {
        let lens = [4usize, 4, 4];
        let (mut i, mut s) = (0, 0);
        advance(lens.iter().copied(), &mut i, &mut s, 3);
        assert_eq!((i, s), (0, 3));
        advance(lens.iter().copied(), &mut i, &mut s, 1);
        assert_eq!((i, s), (1, 0));
        advance(lens.iter().copied(), &mut i, &mut s, 6);
        assert_eq!((i, s), (2, 2));
        advance(lens.iter().copied(), &mut i, &mut s, 2);
        assert_eq!((i, s), (3, 0));
    }

    #[test]
    fn fs_magic_policy() {
        assert!(Backing::File { fs_magic: EXT4_SUPER_MAGIC }.direct_is_real());
        assert!(Backing::File { fs_magic: XFS_SUPER_MAGIC }.direct_is_real());
        assert!(!Backing::File { fs_magic: TMPFS_MAGIC }.direct_is_real());
        assert!(!Backing::File { fs_magic: OVERLAYFS_SUPER_MAGIC }.direct_is_real());
        assert!(Backing::BlockDevice { logical: Some(512) }.direct_is_real());
        assert!(!Backing::BlockDevice { logical: Some(8192) }.direct_is_real());
        assert_eq!("URING".parse::<IoChoice>().unwrap(), IoChoice::Uring);
        assert!("fast".parse::<IoChoice>().is_err());
    }
}
