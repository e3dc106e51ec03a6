//! A kernel request decoded: its header and its operation with typed arguments.
//!
//! [`decode`] takes the request the way either transport holds it: the in header, the fixed
//! argument struct (`arg`, [`abi::arg_size`] bytes) and what follows it (`rest`: names, write
//! data, xattr values). Every field is read through [`abi::Bytes`]: a request too short for
//! what its opcode needs decodes to `Err(EINVAL)`, and an unknown opcode to `Op::Unknown`
//! (answered ENOSYS), so no request the kernel (or a bug) sends can crash the daemon.

use super::abi::{self, fattr, opcode, Bytes};
use lanefs::format::node::Timespec;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// The fields of `struct fuse_in_header` a handler uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Length of the extensions at the end of the request, in 8-byte units.
    pub total_extlen: u16,
}

impl Header {
    /// Decodes the 40-byte in header.
    pub fn parse(b: &[u8]) -> Option<Header> {
        let mut r = Bytes::new(b.get(..abi::IN_HEADER_LEN)?);
        let h = Header {
            len: r.u32()?,
            opcode: r.u32()?,
            unique: r.u64()?,
            nodeid: r.u64()?,
            uid: r.u32()?,
            gid: r.u32()?,
            pid: r.u32()?,
            total_extlen: r.u16()?,
        };
        Some(h)
    }
}

impl Header {
    /// `body` (what follows the fixed argument) without the extensions the kernel appends to
    /// a request (`total_extlen` 8-byte units).
    pub fn without_extensions<'a>(&self, body: &'a [u8]) -> &'a [u8] {
        &body[..body.len().saturating_sub(self.total_extlen as usize * 8)]
    }
}

/// Who asked: what a handler may read of the request's header.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    header: Header,
}

impl Request {
    pub fn new(header: Header) -> Request {
        Request { header }
    }

    pub fn unique(&self) -> u64 {
        self.header.unique
    }

    pub fn uid(&self) -> u32 {
        self.header.uid
    }

    pub fn gid(&self) -> u32 {
        self.header.gid
    }

    pub fn pid(&self) -> u32 {
        self.header.pid
    }

    pub fn opcode(&self) -> u32 {
        self.header.opcode
    }

    pub fn nodeid(&self) -> u64 {
        self.header.nodeid
    }
}

/// A time in SETATTR: a given one, or the server's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeOrNow {
    Specific(Timespec),
    Now,
}

/// SETATTR's arguments: `None` leaves an attribute alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetattrIn {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<Timespec>,
    /// The atime field as sent, whatever the flags: with FATTR_ATIME_NOW it is the kernel's
    /// own reading of the clock, which the adapter compares with an explicit mtime to tell a
    /// touch under the writeback cache (see `LaneFuse::setattr`).
    pub atime_sent: Timespec,
    pub fh: Option<u64>,
    /// FATTR_KILL_SUIDGID: the kernel asks the server to drop set-ID bits (a truncate by a
    /// caller without CAP_FSETID, a chown), under FUSE_HANDLE_KILLPRIV_V2.
    pub kill_suidgid: bool,
}

/// INIT's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags | flags2 << 32` (flags2 only with FUSE_INIT_EXT).
    pub flags: u64,
}

/// A READ, READDIR or READDIRPLUS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    /// `read_flags` (`abi::READ_LOCKOWNER`).
    pub read_flags: u32,
    /// The file's open flags.
    pub flags: i32,
}

/// One request's operation and arguments.
#[derive(Debug, PartialEq, Eq)]
pub enum Op<'a> {
    Lookup {
        name: &'a OsStr,
    },
    Forget {
        nlookup: u64,
    },
    BatchForget {
        count: u32,
    },
    Getattr {
        fh: Option<u64>,
    },
    /// statx(2) asked for more than GETATTR gives (the birth time).
    Statx {
        fh: Option<u64>,
        mask: u32,
    },
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    Mknod {
        name: &'a OsStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Rename {
        name: &'a OsStr,
        newdir: u64,
        newname: &'a OsStr,
        flags: u32,
    },
    Link {
        oldnodeid: u64,
        newname: &'a OsStr,
    },
    Open {
        flags: i32,
    },
    Read(ReadIn),
    Write {
        fh: u64,
        offset: u64,
        data: &'a [u8],
        write_flags: u32,
        flags: i32,
    },
    Statfs,
    Release {
        fh: u64,
        flags: i32,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Setxattr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: i32,
    },
    Getxattr {
        name: &'a OsStr,
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Flush {
        fh: u64,
    },
    Init(InitIn),
    Opendir {
        flags: i32,
    },
    Readdir(ReadIn),
    Readdirplus(ReadIn),
    Releasedir {
        fh: u64,
        flags: i32,
    },
    Fsyncdir {
        fh: u64,
        datasync: bool,
    },
    Access {
        mask: u32,
    },
    Create {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    },
    /// An O_TMPFILE open of the directory `nodeid`; the name the kernel sends is no name the
    /// file gets, and is dropped.
    Tmpfile {
        mode: u32,
        umask: u32,
        flags: i32,
    },
    Interrupt,
    Destroy,
    Ioctl {
        fh: u64,
        flags: u32,
        cmd: u32,
        /// The caller's argument as it passed it: for most commands a pointer in its memory.
        arg: u64,
        in_data: &'a [u8],
        out_size: u32,
    },
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    },
    Lseek {
        fh: u64,
        offset: i64,
        whence: i32,
    },
    CopyFileRange {
        fh_in: u64,
        off_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    },
    /// An opcode lanefs does not serve (answered ENOSYS, so the kernel stops asking where it
    /// can).
    Unknown,
}

/// Why a request could not be decoded (answered EINVAL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

fn time(sec: u64, nsec: u32) -> Timespec {
    Timespec { sec: sec as i64, nsec }
}

/// Decodes the operation of a request with header `h`: `arg` is its fixed argument struct,
/// `rest` what follows (see the module doc).
pub fn decode<'a>(h: &Header, arg: &'a [u8], rest: &'a [u8]) -> Result<Op<'a>, Malformed> {
    decode_op(h.opcode, &mut Bytes::new(arg), &mut Bytes::new(rest)).ok_or(Malformed)
}

/// One arm per opcode, in the protocol's order: long, but a table read as one is where a
/// wrong field order shows (each arm reads its struct's fields in the kernel's order).
fn decode_op<'a>(op: u32, a: &mut Bytes<'a>, r: &mut Bytes<'a>) -> Option<Op<'a>> {
    use opcode::*;
    Some(match op {
        LOOKUP => Op::Lookup { name: os(r.name()?) },
        FORGET => Op::Forget { nlookup: a.u64()? },
        BATCH_FORGET => Op::BatchForget { count: a.u32()? },
        GETATTR => {
            let flags = a.u32()?;
            a.u32()?;
            let fh = a.u64()?;
            Op::Getattr { fh: (flags & abi::GETATTR_FH != 0).then_some(fh) }
        }
        STATX => {
            let flags = a.u32()?;
            a.u32()?;
            let (fh, _sx_flags, mask) = (a.u64()?, a.u32()?, a.u32()?);
            Op::Statx { fh: (flags & abi::GETATTR_FH != 0).then_some(fh), mask }
        }
        SETATTR => Op::Setattr(setattr(a)?),
        READLINK => Op::Readlink,
        SYMLINK => Op::Symlink { name: os(r.name()?), target: os(r.name()?) },
        MKNOD => {
            let (mode, rdev, umask) = (a.u32()?, a.u32()?, a.u32()?);
            Op::Mknod { name: os(r.name()?), mode, rdev, umask }
        }
        MKDIR => {
            let (mode, umask) = (a.u32()?, a.u32()?);
            Op::Mkdir { name: os(r.name()?), mode, umask }
        }
        UNLINK => Op::Unlink { name: os(r.name()?) },
        RMDIR => Op::Rmdir { name: os(r.name()?) },
        RENAME => {
            let newdir = a.u64()?;
            Op::Rename { name: os(r.name()?), newdir, newname: os(r.name()?), flags: 0 }
        }
        RENAME2 => {
            let (newdir, flags) = (a.u64()?, a.u32()?);
            Op::Rename { name: os(r.name()?), newdir, newname: os(r.name()?), flags }
        }
        LINK => Op::Link { oldnodeid: a.u64()?, newname: os(r.name()?) },
        OPEN => Op::Open { flags: a.u32()? as i32 },
        OPENDIR => Op::Opendir { flags: a.u32()? as i32 },
        READ => Op::Read(read_in(a)?),
        READDIR => Op::Readdir(read_in(a)?),
        READDIRPLUS => Op::Readdirplus(read_in(a)?),
        WRITE => {
            let (fh, offset, size, write_flags) = (a.u64()?, a.u64()?, a.u32()?, a.u32()?);
            let (_lock_owner, flags) = (a.u64()?, a.u32()?);
            Op::Write { fh, offset, data: r.take(size as usize)?, write_flags, flags: flags as i32 }
        }
        STATFS => Op::Statfs,
        RELEASE | RELEASEDIR => {
            let (fh, flags) = (a.u64()?, a.u32()? as i32);
            if op == RELEASE {
                Op::Release { fh, flags }
            } else {
                Op::Releasedir { fh, flags }
            }
        }
        FSYNC | FSYNCDIR => {
            let (fh, datasync) = (a.u64()?, a.u32()? & abi::FSYNC_FDATASYNC != 0);
            if op == FSYNC {
                Op::Fsync { fh, datasync }
            } else {
                Op::Fsyncdir { fh, datasync }
            }
        }
        SETXATTR => {
            let (size, flags) = (a.u32()?, a.u32()? as i32);
            Op::Setxattr { name: os(r.name()?), value: r.take(size as usize)?, flags }
        }
        GETXATTR => {
            let size = a.u32()?;
            Op::Getxattr { name: os(r.name()?), size }
        }
        LISTXATTR => Op::Listxattr { size: a.u32()? },
        REMOVEXATTR => Op::Removexattr { name: os(r.name()?) },
        FLUSH => Op::Flush { fh: a.u64()? },
        INIT => init_in(a)?,
        ACCESS => Op::Access { mask: a.u32()? },
        CREATE => {
            let (flags, mode, umask) = (a.u32()? as i32, a.u32()?, a.u32()?);
            Op::Create { name: os(r.name()?), mode, umask, flags }
        }
        TMPFILE => {
            let (flags, mode, umask) = (a.u32()?, a.u32()?, a.u32()?);
            r.name()?;
            Op::Tmpfile { mode, umask, flags: flags as i32 }
        }
        INTERRUPT => Op::Interrupt,
        DESTROY => Op::Destroy,
        IOCTL => {
            let (fh, flags, cmd, arg) = (a.u64()?, a.u32()?, a.u32()?, a.u64()?);
            let (in_size, out_size) = (a.u32()?, a.u32()?);
            Op::Ioctl { fh, flags, cmd, arg, in_data: r.take(in_size as usize)?, out_size }
        }
        FALLOCATE => {
            let (fh, offset, length, mode) = (a.u64()?, a.u64()?, a.u64()?, a.u32()? as i32);
            Op::Fallocate { fh, offset, length, mode }
        }
        LSEEK => Op::Lseek { fh: a.u64()?, offset: a.u64()? as i64, whence: a.u32()? as i32 },
        COPY_FILE_RANGE => Op::CopyFileRange {
            fh_in: a.u64()?,
            off_in: a.u64()?,
            nodeid_out: a.u64()?,
            fh_out: a.u64()?,
            off_out: a.u64()?,
            len: a.u64()?,
        },
        _ => Op::Unknown,
    })
}

fn read_in(a: &mut Bytes<'_>) -> Option<ReadIn> {
    let (fh, offset, size, read_flags) = (a.u64()?, a.u64()?, a.u32()?, a.u32()?);
    let (_lock_owner, flags) = (a.u64()?, a.u32()?);
    Some(ReadIn { fh, offset, size, read_flags, flags: flags as i32 })
}

fn init_in<'a>(a: &mut Bytes<'a>) -> Option<Op<'a>> {
    let (major, minor, max_readahead, flags) = (a.u32()?, a.u32()?, a.u32()?, a.u32()?);
    let mut flags = flags as u64;
    // flags2 exists only in 7.36 and later INITs, and counts only with FUSE_INIT_EXT.
    if flags & abi::init::INIT_EXT != 0 {
        flags |= (a.u32()? as u64) << 32;
    }
    Some(Op::Init(InitIn { major, minor, max_readahead, flags }))
}

fn setattr(a: &mut Bytes<'_>) -> Option<SetattrIn> {
    let valid = a.u32()?;
    a.u32()?;
    let (fh, size, _lock_owner) = (a.u64()?, a.u64()?, a.u64()?);
    let (atime, mtime, ctime) = (a.u64()?, a.u64()?, a.u64()?);
    let (atimensec, mtimensec, ctimensec) = (a.u32()?, a.u32()?, a.u32()?);
    let (mode, _unused4, uid, gid) = (a.u32()?, a.u32()?, a.u32()?, a.u32()?);
    let has = |bit: u32| valid & bit != 0;
    let t = |set: u32, now: u32, sec: u64, nsec: u32| {
        if has(now) {
            Some(TimeOrNow::Now)
        } else if has(set) {
            Some(TimeOrNow::Specific(time(sec, nsec)))
        } else {
            None
        }
    };
    Some(SetattrIn {
        mode: has(fattr::MODE).then_some(mode),
        uid: has(fattr::UID).then_some(uid),
        gid: has(fattr::GID).then_some(gid),
        size: has(fattr::SIZE).then_some(size),
        atime: t(fattr::ATIME, fattr::ATIME_NOW, atime, atimensec),
        mtime: t(fattr::MTIME, fattr::MTIME_NOW, mtime, mtimensec),
        ctime: has(fattr::CTIME).then(|| time(ctime, ctimensec)),
        atime_sent: time(atime, atimensec),
        fh: has(fattr::FH).then_some(fh),
        kill_suidgid: has(fattr::KILL_SUIDGID),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::abi::Out;

    fn header(opcode: u32) -> Header {
        Header { len: 0, opcode, unique: 7, nodeid: 1, uid: 0, gid: 0, pid: 1, total_extlen: 0 }
    }

    #[test]
    fn the_in_header_round_trips() {
        let mut o = Out::default();
        o.u32(40).u32(opcode::LOOKUP).u64(9).u64(1).u32(1000).u32(100).u32(42).u16(0).u16(0);
        let h = Header::parse(&o.buf).unwrap();
        assert_eq!(
            (h.opcode, h.unique, h.nodeid, h.uid, h.gid, h.pid),
            (opcode::LOOKUP, 9, 1, 1000, 100, 42)
        );
        assert_eq!(Header::parse(&o.buf[..39]), None);
    }

    #[test]
    fn names_and_data_are_bounded_by_the_request() {
        let h = header(opcode::RENAME2);
        let mut a = Out::default();
        a.u64(5).u32(1).u32(0);
        assert_eq!(
            decode(&h, &a.buf, b"old\0new\0"),
            Ok(Op::Rename { name: os(b"old"), newdir: 5, newname: os(b"new"), flags: 1 })
        );
        assert_eq!(decode(&h, &a.buf, b"old\0new"), Err(Malformed), "the second name's NUL is missing");
        assert_eq!(decode(&h, &a.buf[..8], b"old\0new\0"), Err(Malformed), "a short argument");
        let h = header(opcode::WRITE);
        let mut a = Out::default();
        a.u64(0).u64(4096).u32(4).u32(abi::WRITE_KILL_SUIDGID).u64(0).u32(2).u32(0);
        let w = decode(&h, &a.buf, b"abcdef").unwrap();
        assert_eq!(
            w,
            Op::Write { fh: 0, offset: 4096, data: b"abcd", write_flags: abi::WRITE_KILL_SUIDGID, flags: 2 }
        );
        assert_eq!(decode(&h, &a.buf, b"abc"), Err(Malformed), "fewer bytes than the size says");
        assert_eq!(decode(&header(9999), &[], &[]), Ok(Op::Unknown));
    }

    #[test]
    fn tmpfile_reads_create_in_and_drops_the_name() {
        let h = header(opcode::TMPFILE);
        let mut a = Out::default();
        a.u32((libc::O_TMPFILE | libc::O_RDWR) as u32).u32(0o100600).u32(0o022).u32(0);
        assert_eq!(a.buf.len(), abi::arg_size(opcode::TMPFILE));
        assert_eq!(
            decode(&h, &a.buf, b"/\0"),
            Ok(Op::Tmpfile { mode: 0o100600, umask: 0o022, flags: libc::O_TMPFILE | libc::O_RDWR })
        );
        assert_eq!(decode(&h, &a.buf, b"/"), Err(Malformed), "the name's NUL is missing");
        assert_eq!(decode(&h, &a.buf, b""), Err(Malformed), "no name");
        // flags, mode and umask are what it reads of the 16 bytes.
        for short in 0..12 {
            assert_eq!(decode(&h, &a.buf[..short], b"/\0"), Err(Malformed), "{short} argument bytes");
        }
    }

    #[test]
    fn setattr_reads_each_valid_bit_and_the_kill_flag() {
        let mut a = Out::default();
        let valid =
            fattr::MODE | fattr::SIZE | fattr::MTIME_NOW | fattr::ATIME | fattr::CTIME | fattr::KILL_SUIDGID;
        a.u32(valid).u32(0).u64(0).u64(123).u64(0).u64(10).u64(20).u64(30).u32(1).u32(2).u32(3);
        a.u32(0o644).u32(0).u32(5).u32(6).u32(0);
        assert_eq!(a.buf.len(), abi::arg_size(opcode::SETATTR));
        let Op::Setattr(s) = decode(&header(opcode::SETATTR), &a.buf, &[]).unwrap() else { panic!() };
        assert_eq!(s.mode, Some(0o644));
        assert_eq!((s.uid, s.gid, s.fh), (None, None, None));
        assert_eq!(s.size, Some(123));
        assert_eq!(s.atime, Some(TimeOrNow::Specific(Timespec { sec: 10, nsec: 1 })));
        assert_eq!(s.mtime, Some(TimeOrNow::Now));
        assert_eq!(s.ctime, Some(Timespec { sec: 30, nsec: 3 }));
        assert_eq!(s.atime_sent, Timespec { sec: 10, nsec: 1 });
        assert!(s.kill_suidgid);
    }

    #[test]
    fn ioctl_reads_the_callers_argument_and_the_input_it_names() {
        let mut a = Out::default();
        a.u64(7).u32(0).u32(0x8004_587d).u64(0x7ffc_5e0b_1a2c).u32(4).u32(4);
        let op = decode(&header(opcode::IOCTL), &a.buf, &[1, 2, 3, 4, 5]).unwrap();
        let want = Op::Ioctl {
            fh: 7,
            flags: 0,
            cmd: 0x8004_587d,
            arg: 0x7ffc_5e0b_1a2c,
            in_data: &[1, 2, 3, 4],
            out_size: 4,
        };
        assert_eq!(op, want);
        assert_eq!(
            decode(&header(opcode::IOCTL), &a.buf, &[1, 2, 3]),
            Err(Malformed),
            "less input than named"
        );
    }

    /// Whatever bytes come with whatever opcode, decoding answers (an operation or Malformed)
    /// and never panics or reads past what it was given.
    #[test]
    fn random_requests_decode_or_are_refused_without_panicking() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut decoded = 0;
        for round in 0..20_000 {
            let op = (round % 60) as u32;
            let arg: Vec<u8> = (0..next() % 100).map(|_| next() as u8).collect();
            // Names need NULs to decode: make them common.
            let rest: Vec<u8> =
                (0..next() % 64).map(|_| if next() % 4 == 0 { 0 } else { next() as u8 }).collect();
            if decode(&header(op), &arg, &rest).is_ok() {
                decoded += 1;
            }
        }
        assert!(decoded > 1000, "random requests of every opcode decode sometimes ({decoded})");
    }

    #[test]
    fn init_reads_flags2_only_with_init_ext() {
        let mut a = Out::default();
        a.u32(7).u32(45).u32(65536).u32(abi::init::INIT_EXT as u32).u32(2);
        let Op::Init(i) = decode(&header(opcode::INIT), &a.buf, &[]).unwrap() else { panic!() };
        assert_eq!(i.flags, abi::init::INIT_EXT | (2 << 32));
        let mut a = Out::default();
        a.u32(7).u32(31).u32(65536).u32(1).u32(2);
        let Op::Init(i) = decode(&header(opcode::INIT), &a.buf, &[]).unwrap() else { panic!() };
        assert_eq!(i.flags, 1);
    }
}
