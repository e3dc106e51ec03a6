//! Replies: one type per kind of answer, each sent at most once.
//!
//! A handler gets a reply object with its request and must answer through it; the transport's
//! [`Sink`] carries the bytes back (a write to /dev/fuse, or a commit into an io_uring entry).
//! A reply dropped without an answer sends EIO, so a handler that returns early by mistake
//! fails the call instead of leaving the caller blocked for ever (the kernel waits for every
//! request that expects a reply).

use super::abi::Out;
use lanefs::format::node::Timespec;
use std::time::Duration;

/// Where a transport takes replies: `error` is 0 or a negative errno, `body` the reply's
/// bytes after the out header, in parts.
pub trait Sink {
    fn send(&self, unique: u64, error: i32, body: &[&[u8]]);
}

/// An errno for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    pub const ENXIO: Errno = Errno(libc::ENXIO);

    pub fn from_i32(n: i32) -> Errno {
        Errno(n)
    }
}

/// A kernel node id (lanefs's inode number; the root is 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct INodeNo(pub u64);

/// An open file or directory handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHandle(pub u64);

/// An inode's generation: (node id, generation) names one inode for the file system's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(pub u64);

/// A directory entry's type, as `d_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    NamedPipe,
    CharDevice,
    Directory,
    BlockDevice,
    RegularFile,
    Symlink,
    Socket,
}

impl FileType {
    fn dtype(self) -> u32 {
        (match self {
            FileType::NamedPipe => libc::S_IFIFO,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::Directory => libc::S_IFDIR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::RegularFile => libc::S_IFREG,
            FileType::Symlink => libc::S_IFLNK,
            FileType::Socket => libc::S_IFSOCK,
        }) >> 12
    }
}

/// `struct fuse_attr`: an inode's attributes as the kernel caches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileAttr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

/// Flags of an OPEN or CREATE reply (`abi::fopen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FopenFlags(pub u32);

fn put_attr(o: &mut Out, a: &FileAttr) {
    o.u64(a.ino).u64(a.size).u64(a.blocks);
    o.u64(a.atime.sec as u64).u64(a.mtime.sec as u64).u64(a.ctime.sec as u64);
    o.u32(a.atime.nsec).u32(a.mtime.nsec).u32(a.ctime.nsec);
    o.u32(a.mode).u32(a.nlink).u32(a.uid).u32(a.gid).u32(a.rdev).u32(a.blksize).u32(0);
}

/// `struct fuse_entry_out` (128 bytes).
fn put_entry(o: &mut Out, ttl: &Duration, a: &FileAttr, g: Generation) {
    let (s, ns) = (ttl.as_secs(), ttl.subsec_nanos());
    o.u64(a.ino).u64(g.0).u64(s).u64(s).u32(ns).u32(ns);
    put_attr(o, a);
}

/// The one answer a request gets; EIO if dropped unanswered.
struct Replier<'a> {
    unique: u64,
    sink: &'a dyn Sink,
    done: bool,
}

impl<'a> Replier<'a> {
    fn new(unique: u64, sink: &'a dyn Sink) -> Replier<'a> {
        Replier { unique, sink, done: false }
    }

    fn send(&mut self, error: i32, body: &[&[u8]]) {
        debug_assert!(!self.done, "request {} answered twice", self.unique);
        if !self.done {
            self.done = true;
            self.sink.send(self.unique, error, body);
        }
    }

    fn ok(&mut self, body: &[&[u8]]) {
        self.send(0, body)
    }

    fn error(&mut self, e: Errno) {
        // A positive errno becomes the negative one the kernel wants; 0 would read as success.
        let n = if e.0 > 0 { -e.0 } else { -libc::EIO };
        self.send(n, &[])
    }
}

impl Drop for Replier<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.error(Errno::EIO);
        }
    }
}

macro_rules! reply_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name<'a>(Replier<'a>);

        impl<'a> $name<'a> {
            pub fn new(unique: u64, sink: &'a dyn Sink) -> $name<'a> {
                $name(Replier::new(unique, sink))
            }

            pub fn error(mut self, e: Errno) {
                self.0.error(e)
            }
        }
    };
}

reply_type!(
    /// No body: success or an errno.
    ReplyEmpty
);
reply_type!(
    /// LOOKUP, MKNOD, MKDIR, SYMLINK, LINK: an entry.
    ReplyEntry
);
reply_type!(
    /// GETATTR, SETATTR.
    ReplyAttr
);
reply_type!(
    /// READ, READLINK: bytes.
    ReplyData
);
reply_type!(
    /// OPEN, OPENDIR: a handle.
    ReplyOpen
);
reply_type!(
    /// WRITE, COPY_FILE_RANGE: a byte count.
    ReplyWrite
);
reply_type!(
    /// CREATE: an entry and a handle.
    ReplyCreate
);
reply_type!(
    /// STATFS.
    ReplyStatfs
);
reply_type!(
    /// GETXATTR, LISTXATTR: a size (when asked with size 0) or the bytes.
    ReplyXattr
);
reply_type!(
    /// LSEEK: an offset.
    ReplyLseek
);
reply_type!(
    /// IOCTL: a result and output bytes.
    ReplyIoctl
);
reply_type!(
    /// INIT.
    ReplyInit
);
reply_type!(
    /// STATX: the attributes with the birth time.
    ReplyStatx
);

/// `STATX_BASIC_STATS | STATX_BTIME`: what a STATX reply fills.
const STATX_FILLED: u32 = 0x7ff | 0x800;

impl ReplyStatx<'_> {
    /// `struct fuse_statx_out` (288 bytes): the attributes, `btime`, and which of them are
    /// valid; `attributes` are statx's STATX_ATTR_* bits, of those in `attributes_mask`.
    pub fn statx(
        mut self,
        ttl: &Duration,
        a: &FileAttr,
        btime: Timespec,
        attributes: u64,
        attributes_mask: u64,
    ) {
        let mut o = Out::with_capacity(288);
        o.u64(ttl.as_secs()).u32(ttl.subsec_nanos()).u32(0).u64(0).u64(0);
        // struct fuse_statx: mask, blksize, attributes, nlink, uid, gid, mode, spare, ino, size,
        // blocks, attributes_mask, then atime, btime, ctime, mtime (sec, nsec, reserved), rdev
        // and dev majors and minors, 14 spare words.
        o.u32(STATX_FILLED).u32(a.blksize).u64(attributes).u32(a.nlink).u32(a.uid).u32(a.gid);
        o.u16(a.mode as u16).u16(0).u64(a.ino).u64(a.size).u64(a.blocks).u64(attributes_mask);
        for t in [a.atime, btime, a.ctime, a.mtime] {
            o.u64(t.sec as u64).u32(t.nsec).u32(0);
        }
        o.u32(libc::major(a.rdev as u64)).u32(libc::minor(a.rdev as u64)).u32(0).u32(0).bytes(&[0; 112]);
        debug_assert_eq!(o.buf.len(), 288);
        self.0.ok(&[&o.buf])
    }
}

impl ReplyEmpty<'_> {
    pub fn ok(mut self) {
        self.0.ok(&[])
    }
}

impl ReplyEntry<'_> {
    pub fn entry(mut self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        let mut o = Out::with_capacity(128);
        put_entry(&mut o, ttl, attr, generation);
        self.0.ok(&[&o.buf])
    }
}

impl ReplyAttr<'_> {
    pub fn attr(mut self, ttl: &Duration, attr: &FileAttr) {
        let mut o = Out::with_capacity(104);
        o.u64(ttl.as_secs()).u32(ttl.subsec_nanos()).u32(0);
        put_attr(&mut o, attr);
        self.0.ok(&[&o.buf])
    }
}

impl ReplyData<'_> {
    pub fn data(mut self, data: &[u8]) {
        self.0.ok(&[data])
    }
}

fn open_out(o: &mut Out, fh: FileHandle, flags: FopenFlags) {
    o.u64(fh.0).u32(flags.0).i32(0);
}

impl ReplyOpen<'_> {
    pub fn opened(mut self, fh: FileHandle, flags: FopenFlags) {
        let mut o = Out::with_capacity(16);
        open_out(&mut o, fh, flags);
        self.0.ok(&[&o.buf])
    }
}

impl ReplyWrite<'_> {
    pub fn written(mut self, size: u32) {
        let mut o = Out::with_capacity(8);
        o.u32(size).u32(0);
        self.0.ok(&[&o.buf])
    }
}

impl ReplyCreate<'_> {
    pub fn created(
        mut self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        let mut o = Out::with_capacity(144);
        put_entry(&mut o, ttl, attr, generation);
        open_out(&mut o, fh, flags);
        self.0.ok(&[&o.buf])
    }
}

impl ReplyStatfs<'_> {
    #[allow(clippy::too_many_arguments)]
    pub fn statfs(
        mut self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        let mut o = Out::with_capacity(80);
        o.u64(blocks).u64(bfree).u64(bavail).u64(files).u64(ffree);
        o.u32(bsize).u32(namelen).u32(frsize).u32(0).bytes(&[0; 24]);
        self.0.ok(&[&o.buf])
    }
}

impl ReplyXattr<'_> {
    pub fn size(mut self, size: u32) {
        let mut o = Out::with_capacity(8);
        o.u32(size).u32(0);
        self.0.ok(&[&o.buf])
    }

    pub fn data(mut self, data: &[u8]) {
        self.0.ok(&[data])
    }
}

impl ReplyLseek<'_> {
    pub fn offset(mut self, offset: i64) {
        self.0.ok(&[&offset.to_le_bytes()])
    }
}

impl ReplyIoctl<'_> {
    pub fn ioctl(mut self, result: i32, data: &[u8]) {
        let mut o = Out::with_capacity(16);
        o.i32(result).u32(0).u32(0).u32(0);
        self.0.ok(&[&o.buf, data])
    }
}

impl ReplyInit<'_> {
    pub fn init(mut self, body: &[u8]) {
        self.0.ok(&[body])
    }
}

/// READDIR: entries packed until the kernel's buffer is full.
pub struct ReplyDirectory<'a> {
    r: Replier<'a>,
    out: Out,
    max: usize,
}

impl<'a> ReplyDirectory<'a> {
    pub fn new(unique: u64, sink: &'a dyn Sink, size: u32) -> ReplyDirectory<'a> {
        let max = size as usize;
        ReplyDirectory { r: Replier::new(unique, sink), out: Out::with_capacity(max.min(1 << 16)), max }
    }

    /// Whether `len` more bytes fit in the kernel's buffer.
    fn fits(&self, len: usize) -> bool {
        self.out.buf.len() + len <= self.max
    }

    /// `struct fuse_dirent`, padded to 8 bytes.
    fn dirent(&mut self, ino: INodeNo, offset: u64, dtype: u32, name: &[u8]) {
        self.out.u64(ino.0).u64(offset).u32(name.len() as u32).u32(dtype).bytes(name).pad8();
    }

    /// Adds an entry whose cookie is `offset`; true if it did not fit (the reply is full).
    pub fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &std::ffi::OsStr) -> bool {
        let name = std::os::unix::ffi::OsStrExt::as_bytes(name);
        if !self.fits((24 + name.len()).next_multiple_of(8)) {
            return true;
        }
        self.dirent(ino, offset, kind.dtype(), name);
        false
    }

    pub fn ok(mut self) {
        let body = std::mem::take(&mut self.out.buf);
        self.r.ok(&[&body])
    }

    pub fn error(mut self, e: Errno) {
        self.r.error(e)
    }
}

/// READDIRPLUS: entries with their attributes, packed until the kernel's buffer is full.
pub struct ReplyDirectoryPlus<'a>(ReplyDirectory<'a>);

impl<'a> ReplyDirectoryPlus<'a> {
    pub fn new(unique: u64, sink: &'a dyn Sink, size: u32) -> ReplyDirectoryPlus<'a> {
        ReplyDirectoryPlus(ReplyDirectory::new(unique, sink, size))
    }

    /// Adds an entry whose cookie is `offset`; true if it did not fit (the reply is full).
    pub fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &std::ffi::OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        let name = std::os::unix::ffi::OsStrExt::as_bytes(name);
        if !self.0.fits((128 + 24 + name.len()).next_multiple_of(8)) {
            return true;
        }
        put_entry(&mut self.0.out, ttl, attr, generation);
        self.0.dirent(ino, offset, attr.mode >> 12 & 0o17, name);
        false
    }

    pub fn ok(self) {
        self.0.ok()
    }

    pub fn error(self, e: Errno) {
        self.0.error(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[derive(Default)]
    struct Recorded(RefCell<Vec<(u64, i32, Vec<u8>)>>);

    impl Sink for Recorded {
        fn send(&self, unique: u64, error: i32, body: &[&[u8]]) {
            self.0.borrow_mut().push((unique, error, body.concat()));
        }
    }

    fn attr(mode: u32) -> FileAttr {
        let t = Timespec { sec: 1, nsec: 2 };
        FileAttr {
            ino: 5,
            size: 6,
            blocks: 7,
            atime: t,
            mtime: t,
            ctime: t,
            mode,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        }
    }

    #[test]
    fn replies_have_the_kernels_sizes_and_errors_are_negative() {
        let s = Recorded::default();
        ReplyEntry::new(1, &s).entry(&Duration::from_secs(3), &attr(libc::S_IFREG | 0o644), Generation(9));
        ReplyAttr::new(2, &s).attr(&Duration::from_secs(3), &attr(libc::S_IFREG));
        ReplyOpen::new(3, &s).opened(FileHandle(4), FopenFlags(1));
        ReplyCreate::new(4, &s).created(
            &Duration::ZERO,
            &attr(libc::S_IFREG),
            Generation(0),
            FileHandle(0),
            FopenFlags(0),
        );
        ReplyStatfs::new(5, &s).statfs(1, 2, 3, 4, 5, 4096, 255, 4096);
        ReplyStatx::new(8, &s).statx(
            &Duration::ZERO,
            &attr(libc::S_IFDIR | 0o755),
            Timespec { sec: 9, nsec: 8 },
            0,
            0,
        );
        ReplyEmpty::new(6, &s).error(Errno::ENOTDIR);
        drop(ReplyData::new(7, &s));
        let got = s.0.borrow();
        let sizes: Vec<_> = got.iter().map(|(u, e, b)| (*u, *e, b.len())).collect();
        assert_eq!(
            sizes,
            [
                (1, 0, 128),
                (2, 0, 104),
                (3, 0, 16),
                (4, 0, 144),
                (5, 0, 80),
                (8, 0, 288),
                (6, -libc::ENOTDIR, 0),
                (7, -libc::EIO, 0)
            ]
        );
        assert_eq!(
            &got[0].2[..16],
            &[5, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0],
            "node id, then generation"
        );
    }

    #[test]
    fn a_directory_reply_stops_at_the_kernels_size() {
        let s = Recorded::default();
        let mut r = ReplyDirectory::new(1, &s, 64);
        assert!(!r.add(INodeNo(2), 1, FileType::Directory, "a".as_ref()), "32 bytes fit");
        assert!(!r.add(INodeNo(3), 2, FileType::RegularFile, "bcdefghi".as_ref()), "32 more fit");
        assert!(r.add(INodeNo(4), 3, FileType::RegularFile, "c".as_ref()), "a third does not");
        r.ok();
        let got = s.0.borrow();
        assert_eq!(got[0].2.len(), 64);
        assert_eq!(u32::from_le_bytes(got[0].2[20..24].try_into().unwrap()), libc::S_IFDIR >> 12);
    }
}
