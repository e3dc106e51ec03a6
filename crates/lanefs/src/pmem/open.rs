//! Creating, checking and mapping a region file: everything that runs before the region is
//! usable, and every way it can fail, as a typed error that names the file.
//!
//! A region file that exists was completely formatted (it is written under a temporary name
//! and renamed into place); an open checks the header before it maps anything, and holds an
//! exclusive `flock` for as long as the region is open, so two mounts never share one.

use super::crash::Recorder;
use crate::error::{Error, RegionFault, Result};
use crate::sync::rank::{Mutex, Rank};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use super::{
    header, io_fault, Mapping, PersistMethod, PmemRegion, RegionHeader, RegionOptions, HEADER_BYTES,
    MAX_REGION_SIZE,
};

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Maps `len` bytes of `file`: MAP_SYNC first when asked, else (or when refused) MAP_SHARED.
fn map_file(file: &File, len: usize, try_sync: bool) -> io::Result<(NonNull<u8>, Mapping, Option<String>)> {
    use rustix::mm::{mmap, MapFlags, ProtFlags};
    let prot = ProtFlags::READ | ProtFlags::WRITE;
    let mut refused = None;
    if try_sync {
        // SAFETY: a new mapping at an address the kernel chooses; it aliases no Rust object.
        // The file is at least `len` bytes long (checked by the caller), so no access within
        // `len` faults with SIGBUS unless another process truncates the file, which the
        // exclusive flock and the region's documented ownership rule out.
        match unsafe {
            mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED_VALIDATE | MapFlags::SYNC, file, 0)
        } {
            Ok(p) => {
                return Ok((NonNull::new(p.cast()).expect("mmap never returns null"), Mapping::Sync, None))
            }
            Err(e) => refused = Some(io::Error::from(e).to_string()),
        }
    }
    // SAFETY: as above, with a plain shared mapping.
    let p = unsafe { mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, file, 0) }?;
    Ok((NonNull::new(p.cast()).expect("mmap never returns null"), Mapping::Shared, refused))
}

/// Opens the region file at `path` for reading and writing and takes its exclusive lock: one
/// open of a region at a time (two mounts writing one region would corrupt it).
fn open_exclusive(path: &Path) -> Result<File> {
    let file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::region(path, RegionFault::Missing, "no such file"))
        }
        Err(e) => return Err(io_fault(path, "cannot open", e)),
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(Error::region(
            path,
            RegionFault::InUse,
            "in use (locked by another open of it, such as the mount of its image): unmount the \
             image first; `lanefs inspect` without --nvm works on a mounted image",
        )),
        Err(e) => Err(io_fault(path, "cannot lock", e.into())),
    }
}

/// The header of the region file `file` at `path`, checked against the file (a regular file of
/// exactly the size the header gives) and, with `expect_uuid`, against the image.
fn read_header(path: &Path, file: &File, expect_uuid: Option<[u8; 16]>) -> Result<RegionHeader> {
    let meta = file.metadata().map_err(|e| io_fault(path, "cannot stat", e))?;
    if !meta.is_file() {
        return Err(Error::region(path, RegionFault::NotRegion, "not a regular file"));
    }
    let flen = meta.len();
    if flen < HEADER_BYTES as u64 {
        return Err(Error::region(
            path,
            RegionFault::Truncated,
            format!("file is {flen} bytes, shorter than the {HEADER_BYTES}-byte region header"),
        ));
    }
    let mut hb = vec![0u8; HEADER_BYTES];
    file.read_exact_at(&mut hb, 0).map_err(|e| io_fault(path, "cannot read the header", e))?;
    let header = RegionHeader::decode(&hb, path)?;
    if flen < header.size {
        return Err(Error::region(
            path,
            RegionFault::Truncated,
            format!("file is {flen} bytes, its header says {}", header.size),
        ));
    }
    if flen > header.size {
        return Err(Error::region(
            path,
            RegionFault::Corrupt,
            format!("file is {flen} bytes, longer than the {} its header says", header.size),
        ));
    }
    if let Some(want) = expect_uuid.filter(|want| *want != header.uuid) {
        return Err(Error::region(
            path,
            RegionFault::WrongImage,
            format!(
                "bound to image {}, not to this image ({})",
                crate::format::superblock::uuid_str(&header.uuid),
                crate::format::superblock::uuid_str(&want)
            ),
        ));
    }
    Ok(header)
}

/// How stores to the mapping are made durable: the method asked for (refused if this CPU lacks
/// it), else a cache flush where it is enough (a MAP_SYNC mapping, or tmpfs, where the page
/// cache is the medium), else msync.
fn persist_method(asked: Option<PersistMethod>, mapping: Mapping, on_tmpfs: bool) -> Result<PersistMethod> {
    Ok(match asked {
        Some(m) if !m.available() => {
            return Err(Error::InvalidArgument(format!("{m} is not available on this CPU")))
        }
        Some(m) => m,
        None => match PersistMethod::best_cache_flush() {
            Some(m) if mapping == Mapping::Sync || on_tmpfs => m,
            _ => PersistMethod::Msync,
        },
    })
}

impl PmemRegion {
    /// Creates a new region of `size` bytes at `path`, bound to the image with `uuid`, and
    /// opens it. Fails if `path` exists. The file appears complete or not at all.
    pub fn create(path: &Path, size: u64, uuid: [u8; 16], opts: &RegionOptions) -> Result<PmemRegion> {
        if size > MAX_REGION_SIZE || !size.is_multiple_of(header::REGION_ALIGN) {
            return Err(Error::InvalidArgument(format!(
                "{}: a region size must be a whole number of 4 KiB pages up to {MAX_REGION_SIZE} (not {size})",
                path.display()
            )));
        }
        header::check_size(path, size)?;
        let name =
            path.file_name().ok_or_else(|| Error::region(path, RegionFault::Io, "the path names no file"))?;
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let hdr = RegionHeader { size, uuid, created: now_secs() };
        let made = (|| -> io::Result<()> {
            let f = OpenOptions::new().read(true).write(true).create_new(true).open(&tmp)?;
            f.set_len(size)?;
            f.write_all_at(&hdr.encode(), 0)?;
            f.sync_all()?;
            // Refuse to replace an existing file (a region or anything else).
            std::fs::hard_link(&tmp, path)?;
            std::fs::remove_file(&tmp)?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_fault(path, "cannot create the region", e));
        }
        Self::open(path, Some(uuid), opts)
    }

    /// Opens the region at `path`, creating it with `size` bytes if it does not exist. Returns
    /// whether it was created.
    pub fn open_or_create(
        path: &Path,
        size: u64,
        uuid: [u8; 16],
        opts: &RegionOptions,
    ) -> Result<(PmemRegion, bool)> {
        match Self::open(path, Some(uuid), opts) {
            Err(Error::Region { fault: RegionFault::Missing, .. }) => {
                Ok((Self::create(path, size, uuid, opts)?, true))
            }
            r => r.map(|r| (r, false)),
        }
    }

    /// Opens an existing region. With `expect_uuid`, a region bound to another image is refused
    /// (`RegionFault::WrongImage`); `None` accepts any (inspection, benchmarks).
    pub fn open(path: &Path, expect_uuid: Option<[u8; 16]>, opts: &RegionOptions) -> Result<PmemRegion> {
        let file = open_exclusive(path)?;
        let header = read_header(path, &file, expect_uuid)?;
        let len = usize::try_from(header.size).map_err(|_| {
            Error::region(path, RegionFault::TooSmall, "size does not fit this machine's address space")
        })?;
        // The header's decoder refused any other size; `words` relies on it.
        assert!(len >= HEADER_BYTES && len.is_multiple_of(header::REGION_ALIGN as usize));
        let backing = match rustix::fs::fstatfs(&file) {
            // f_type is a signed word on some targets; the magics are 32-bit.
            Ok(st) => (st.f_type as u64) & 0xFFFF_FFFF,
            Err(_) => 0,
        };
        let on_tmpfs = backing == crate::device::TMPFS_MAGIC;
        let (base, mapping, sync_refused) =
            map_file(&file, len, opts.try_map_sync).map_err(|e| io_fault(path, "cannot map", e))?;
        let method = match persist_method(opts.persist, mapping, on_tmpfs) {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: the mapping was just made and nothing refers to it.
                let _ = unsafe { rustix::mm::munmap(base.as_ptr().cast(), len) };
                return Err(e);
            }
        };
        let mut region = PmemRegion {
            path: path.to_path_buf(),
            _file: file,
            base,
            len,
            header,
            mapping,
            sync_refused,
            method,
            backing: crate::device::fs_name(backing),
            recorder: None,
            halt: None,
        };
        if opts.record {
            let mut image = vec![0u8; len];
            region.read_raw(0, &mut image);
            region.recorder =
                Some(Arc::new(Mutex::new(Rank::PmemRecorder, Recorder::new(image, opts.clock.clone()))));
        }
        Ok(region)
    }
}
