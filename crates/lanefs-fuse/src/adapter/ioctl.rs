//! ioctl commands lanefs answers (linux/fs.h, xfs_fs.h, ext4.h), and how.

use super::convert::errno;
use super::process::{capable, CAP_LINUX_IMMUTABLE, CAP_SYS_ADMIN};
use super::LaneFuse;
use crate::proto::{Errno, Request};
use lanefs::{InodeFlags, TrimRange};

/// `_IOR('X', 125, __u32)`: XFS_IOC_GOINGDOWN, the same number as EXT4_IOC_SHUTDOWN.
pub const GOINGDOWN: u32 = 0x8004_587d;
/// `_IOWR('X', 121, struct fstrim_range)`.
pub const FITRIM: u32 = 0xc018_5879;
/// `_IOR(0x94, 49, char[FSLABEL_MAX])`.
pub const FS_IOC_GETFSLABEL: u32 = 0x8100_9431;
/// `_IOW(0x94, 50, char[FSLABEL_MAX])`.
pub const FS_IOC_SETFSLABEL: u32 = 0x4100_9432;
/// The label buffer of the label ioctls.
pub const FSLABEL_MAX: usize = 256;
/// GOINGDOWN flags: make everything durable first (DEFAULT, LOGFLUSH), or not (NOLOGFLUSH).
pub const GOING_FLAGS_DEFAULT: u32 = 0;
pub const GOING_FLAGS_LOGFLUSH: u32 = 1;
pub const GOING_FLAGS_NOLOGFLUSH: u32 = 2;

/// The inode-attribute ioctls (x86-64 and every other Linux ABI with the generic `_IOC`
/// layout). The kernel sends them itself, as restricted FUSE_IOCTLs, from its
/// `fileattr_get`/`fileattr_set` (fs/fuse/ioctl.c): FS_IOC_GETFLAGS/SETFLAGS with a 4-byte
/// argument, FS_IOC_FSGETXATTR/FSSETXATTR with a `struct fsxattr`. Before a set it reads the
/// old flags with FSGETXATTR and checks CAP_LINUX_IMMUTABLE for a change of `i` or `a`.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601; // _IOR('f', 1, long)
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602; // _IOW('f', 2, long)
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f; // _IOR('X', 31, struct fsxattr)
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820; // _IOW('X', 32, struct fsxattr)
/// `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize (u32 each), 8 bytes of pad.
const FSXATTR_LEN: usize = 28;

impl LaneFuse {
    /// FUSE_IOCTL: the reply's data for command `cmd` on `ino` (at most `out_size` bytes are
    /// taken back by the kernel).
    pub(super) fn ioctl_reply(
        &self,
        req: &Request,
        ino: u64,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: u32,
    ) -> Result<Vec<u8>, Errno> {
        match cmd {
            GOINGDOWN => self.going_down(req, arg).map(|()| Vec::new()),
            FITRIM => self.fitrim(req, in_data),
            FS_IOC_GETFSLABEL => self.fs.label().map_err(errno).map(|mut l| {
                l.resize(FSLABEL_MAX, 0);
                l
            }),
            FS_IOC_SETFSLABEL => self.set_label(req, in_data).map(|()| Vec::new()),
            FS_IOC_GETFLAGS | FS_IOC_SETFLAGS | FS_IOC_FSGETXATTR | FS_IOC_FSSETXATTR => {
                self.inode_ioctl(req, ino, cmd, in_data, out_size)
            }
            // What the kernel's file systems say to a command they do not know.
            _ => Err(Errno::ENOTTY),
        }
    }

    /// FS_IOC_GETFLAGS / SETFLAGS / FSGETXATTR / FSSETXATTR on `ino`: the reply's data, exactly
    /// `out_size` bytes as the kernel expects. Changing the immutable or append flag needs
    /// CAP_LINUX_IMMUTABLE, which the kernel has checked before it sends the request; FUSE
    /// passes no capabilities, so the caller's effective set in /proc stands for it here
    /// ([`capable`]; library callers say it in `Fs::set_flags`).
    fn inode_ioctl(
        &self,
        req: &Request,
        ino: u64,
        cmd: u32,
        input: &[u8],
        out_size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let word = |at: usize| -> Result<u32, Errno> {
            let b = input.get(at..at + 4).ok_or(Errno::EINVAL)?;
            Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
        };
        let privileged = capable(req, CAP_LINUX_IMMUTABLE);
        let mut out = vec![0u8; out_size as usize];
        match cmd {
            FS_IOC_GETFLAGS => {
                let f = self.fs.get_flags(ino).map_err(errno)?;
                let v = f.bits().to_le_bytes();
                let n = out.len().min(4);
                out[..n].copy_from_slice(&v[..n]);
            }
            FS_IOC_SETFLAGS => {
                self.fs.set_flags(ino, InodeFlags(word(0)?), privileged).map_err(errno)?;
                self.attributes_changed(ino);
            }
            FS_IOC_FSGETXATTR => {
                let f = self.fs.get_flags(ino).map_err(errno)?;
                let mut x = [0u8; FSXATTR_LEN];
                x[..4].copy_from_slice(&f.xflags().to_le_bytes());
                let n = out.len().min(FSXATTR_LEN);
                out[..n].copy_from_slice(&x[..n]);
            }
            FS_IOC_FSSETXATTR => {
                if input.len() < FSXATTR_LEN {
                    return Err(Errno::EINVAL);
                }
                // No project quotas: only project 0. (Extent size hints need FS_XFLAG_EXTSIZE,
                // which from_xflags refuses.)
                if word(12)? != 0 {
                    return Err(Errno::from_i32(libc::EOPNOTSUPP));
                }
                let mut f = InodeFlags::from_xflags(word(0)?).map_err(errno)?;
                // fsx_xflags cannot say DIRSYNC: it stays as it was.
                let old = self.fs.get_flags(ino).map_err(errno)?;
                f = InodeFlags(f.bits() | (old.bits() & InodeFlags::DIRSYNC.bits()));
                self.fs.set_flags(ino, f, privileged).map_err(errno)?;
                self.attributes_changed(ino);
            }
            _ => return Err(Errno::from_i32(libc::ENOTTY)),
        }
        Ok(out)
    }

    /// XFS_IOC_GOINGDOWN / EXT4_IOC_SHUTDOWN. The kernel passes no input for this `_IOR`
    /// command, so the flags are read from the caller (`crate::caller`); when they cannot be,
    /// it is NOLOGFLUSH: a crash, the durability contract's test. With DEFAULT or LOGFLUSH,
    /// what was done is made durable first (a sync: more than XFS's log force, which keeps
    /// metadata only, and what a caller asking for it expects to find).
    pub(super) fn going_down(&self, req: &Request, arg: u64) -> Result<(), Errno> {
        if !capable(req, CAP_SYS_ADMIN) {
            return Err(Errno::EPERM);
        }
        if self.fs.is_shut_down() {
            return Ok(());
        }
        let flags = crate::caller::u32_at(req.pid(), arg).unwrap_or(GOING_FLAGS_NOLOGFLUSH);
        match flags {
            GOING_FLAGS_DEFAULT | GOING_FLAGS_LOGFLUSH => {
                if let Err(e) = self.fs.sync() {
                    // Going down all the same, as XFS does when its log force fails.
                    eprintln!("lanefs: sync before the shutdown failed: {e}");
                }
            }
            GOING_FLAGS_NOLOGFLUSH => {}
            _ => return Err(Errno::EINVAL),
        }
        self.fs.shutdown().map_err(errno)?;
        crate::syslog::open();
        crate::syslog::warning(&format!(
            "shut down by pid {} ({}): nothing more is written; unmount, and the next mount recovers",
            req.pid(),
            if flags == GOING_FLAGS_NOLOGFLUSH { "no flush, as a crash" } else { "after a sync" }
        ));
        Ok(())
    }

    /// FITRIM: `struct fstrim_range { u64 start, len, minlen }` in, the bytes trimmed in `len`
    /// out.
    pub(super) fn fitrim(&self, req: &Request, input: &[u8]) -> Result<Vec<u8>, Errno> {
        if !capable(req, CAP_SYS_ADMIN) {
            return Err(Errno::EPERM);
        }
        let word = |i: usize| -> Result<u64, Errno> {
            input
                .get(i * 8..i * 8 + 8)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .ok_or(Errno::EINVAL)
        };
        let range = TrimRange { start: word(0)?, len: word(1)?, minlen: word(2)? };
        let trimmed = self.fs.trim(range).map_err(errno)?;
        let mut out = input[..24].to_vec();
        out[8..16].copy_from_slice(&trimmed.to_ne_bytes());
        Ok(out)
    }

    /// FS_IOC_SETFSLABEL: a NUL-terminated label in a 256-byte buffer.
    pub(super) fn set_label(&self, req: &Request, input: &[u8]) -> Result<(), Errno> {
        if !capable(req, CAP_SYS_ADMIN) {
            return Err(Errno::EPERM);
        }
        // As btrfs: a buffer with no NUL holds no valid label.
        let end = input.iter().position(|&c| c == 0).ok_or(Errno::EINVAL)?;
        self.fs.set_label(&input[..end]).map_err(errno)
    }
}
