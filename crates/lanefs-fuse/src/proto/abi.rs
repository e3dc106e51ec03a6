//! The kernel's FUSE ABI (include/uapi/linux/fuse.h, protocol 7.42): opcodes, flag bits, the
//! sizes of the fixed argument structs, and a bounds-checked little-endian reader and writer.
//!
//! Nothing here trusts a length the kernel sends: every read of a request goes through
//! [`Bytes`], which answers `None` past the end instead of panicking, so a short or garbled
//! request becomes an EINVAL reply, never a crash of the daemon.

/// The protocol version lanefs speaks; the kernel uses the smaller minor of the two.
pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 42;

/// `struct fuse_in_header`: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding.
pub const IN_HEADER_LEN: usize = 40;
/// `struct fuse_out_header`: len, error, unique.
pub const OUT_HEADER_LEN: usize = 16;
/// `struct fuse_out_header` of a reply whose body is `body_len` bytes (`error`: 0 or a
/// negative errno; with `unique` 0, a notification's code).
pub fn out_header(body_len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER_LEN] {
    let mut h = [0u8; OUT_HEADER_LEN];
    h[0..4].copy_from_slice(&((OUT_HEADER_LEN + body_len) as u32).to_le_bytes());
    h[4..8].copy_from_slice(&error.to_le_bytes());
    h[8..16].copy_from_slice(&unique.to_le_bytes());
    h
}

/// The kernel wants a read buffer of at least this many bytes.
pub const MIN_READ_BUFFER: usize = 8192;

pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    /// open(2) with O_TMPFILE (protocol 7.34 on): CREATE's body and reply, for a file with no
    /// name (the kernel sends its dentry's, "/").
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
}

/// Size of the fixed argument struct that opens the body of a request with `opcode` (0 for the
/// requests whose body is only names, or nothing). With FUSE over io_uring the kernel puts this
/// struct in the ring entry's `op_in` and the rest in the payload buffer; over /dev/fuse both
/// come in one stream, so the split is made here.
pub fn arg_size(op: u32) -> usize {
    use opcode::*;
    match op {
        FORGET => 8,
        GETATTR => 16,
        SETATTR => 88,
        MKNOD => 16,
        MKDIR => 8,
        RENAME => 8,
        LINK => 8,
        OPEN | OPENDIR => 8,
        READ | READDIR | READDIRPLUS | WRITE => 40,
        RELEASE | RELEASEDIR | FLUSH => 24,
        FSYNC | FSYNCDIR => 16,
        // FUSE_SETXATTR_EXT is not negotiated: the short form.
        SETXATTR => 8,
        GETXATTR | LISTXATTR => 8,
        INIT => 64,
        ACCESS => 8,
        CREATE | TMPFILE => 16,
        INTERRUPT => 8,
        IOCTL => 32,
        BATCH_FORGET => 8,
        FALLOCATE => 32,
        RENAME2 => 16,
        LSEEK => 24,
        COPY_FILE_RANGE => 56,
        STATX => 24,
        _ => 0,
    }
}

/// INIT flags (`flags` | `flags2 << 32`).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const ALLOW_IDMAP: u64 = 1 << 40;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// OPEN / CREATE reply flags.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    /// Keep what the kernel caches of the file (a directory's listing) across opens.
    pub const KEEP_CACHE: u32 = 1 << 1;
    /// Let the kernel cache a directory's listing (FOPEN_CACHE_DIR).
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
}

/// `fuse_read_in.read_flags`: the reader's lock owner is sent. The kernel's direct I/O path sets
/// it (the owner is the caller's file table); its page-cache reads (readpage, readahead, a page
/// fault's read) never do.
pub const READ_LOCKOWNER: u32 = 1 << 1;
/// `fuse_write_in.write_flags`: the write must drop set-ID bits.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_fsync_in.fsync_flags`: data only.
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
/// `fuse_getattr_in.getattr_flags`: `fh` is valid.
pub const GETATTR_FH: u32 = 1 << 0;
/// `fuse_ioctl_in.flags`: the ioctl is on a directory.
pub const IOCTL_DIR: u32 = 1 << 4;

/// Unsolicited notifications (the `error` field of an out header with `unique` 0).
pub const NOTIFY_INVAL_INODE: i32 = 2;
pub const NOTIFY_INVAL_ENTRY: i32 = 3;

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
pub const DEV_IOC_CLONE: u32 = (2 << 30) | (4 << 16) | (229 << 8);

/// A bounds-checked cursor over the bytes of a request.
pub struct Bytes<'a> {
    b: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(b: &'a [u8]) -> Bytes<'a> {
        Bytes { b }
    }

    /// The next `n` bytes, or None if fewer are left.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_le_bytes([s[0], s[1]]))
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    pub fn u64(&mut self) -> Option<u64> {
        let lo = self.u32()? as u64;
        let hi = self.u32()? as u64;
        Some(lo | (hi << 32))
    }

    /// A NUL-terminated name (without its NUL).
    pub fn name(&mut self) -> Option<&'a [u8]> {
        let end = self.b.iter().position(|&c| c == 0)?;
        let n = self.take(end)?;
        self.take(1)?;
        Some(n)
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
}

/// Little-endian writer for reply bodies.
#[derive(Default)]
pub struct Out {
    pub buf: Vec<u8>,
}

impl Out {
    pub fn with_capacity(n: usize) -> Out {
        Out { buf: Vec::with_capacity(n) }
    }

    pub fn u16(&mut self, v: u16) -> &mut Out {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Out {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Out {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Out {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Out {
        self.buf.extend_from_slice(b);
        self
    }

    /// Zero bytes up to the next multiple of 8 (directory entries are 8-byte aligned).
    pub fn pad8(&mut self) -> &mut Out {
        while !self.buf.len().is_multiple_of(8) {
            self.buf.push(0);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_request_reads_none_instead_of_panicking() {
        let mut b = Bytes::new(&[1, 0, 0]);
        assert_eq!(b.u32(), None);
        let mut b = Bytes::new(&[1, 0, 0, 0, 2, 0, 0, 0, 3]);
        assert_eq!(b.u32(), Some(1));
        assert_eq!(b.u64(), None);
        let mut b = Bytes::new(b"abc");
        assert_eq!(b.name(), None, "a name without its NUL");
        let mut b = Bytes::new(b"ab\0cd\0");
        assert_eq!((b.name(), b.name(), b.name()), (Some(&b"ab"[..]), Some(&b"cd"[..]), None));
    }

    #[test]
    fn the_clone_ioctl_number_is_the_kernels() {
        // _IOR('\xe5', 0, uint32_t) on x86_64 and aarch64: dir 2 (read), size 4, type 229, nr 0.
        assert_eq!(DEV_IOC_CLONE, 0x8004_e500);
    }
}
