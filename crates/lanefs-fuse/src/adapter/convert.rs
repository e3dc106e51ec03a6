//! Conversions between lanefs's types and FUSE's: errors, file kinds, times, attributes.

use fuser::{Errno, FileAttr, FileType, Generation, INodeNo, TimeOrNow};
use lanefs::format::node::Timespec;
use lanefs::{Attr, FileKind};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(super) fn errno(e: lanefs::Error) -> Errno {
    let n = e.to_errno();
    // After a shutdown every request gets EIO, by design: no line for each.
    if (n == libc::EIO && !e.is_shut_down()) || n == libc::EUCLEAN {
        // The caller sees only the number: say why (on the daemon's stderr).
        eprintln!("lanefs: {e}");
    }
    Errno::from_i32(n)
}

pub(super) fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

pub(super) fn system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec.min(999_999_999))
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

pub(super) fn time_or_now(t: TimeOrNow) -> Timespec {
    match t {
        TimeOrNow::SpecificTime(t) => Timespec::from(t),
        TimeOrNow::Now => Timespec::from(SystemTime::now()),
    }
}

/// The attributes of a negative entry (node id 0), which the kernel does not read.
pub(super) const NO_ENTRY: FileAttr = FileAttr {
    ino: INodeNo(0),
    size: 0,
    blocks: 0,
    atime: UNIX_EPOCH,
    mtime: UNIX_EPOCH,
    ctime: UNIX_EPOCH,
    crtime: UNIX_EPOCH,
    kind: FileType::RegularFile,
    perm: 0,
    nlink: 0,
    uid: 0,
    gid: 0,
    rdev: 0,
    blksize: 0,
    flags: 0,
};

/// stat(2) attributes as FUSE sends them.
pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: kind(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The generation the kernel knows `a` by. The kernel makes its root inode with generation 0
/// and marks an inode bad when a reply gives its node id another generation; the root's is 0
/// on every image (mkfs), and stays so here whatever the image says.
pub(super) fn generation(a: &Attr) -> Generation {
    if a.ino == lanefs::ROOT {
        Generation(0)
    } else {
        Generation(a.generation as u64)
    }
}

pub(super) fn name(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_before_and_after_the_epoch() {
        for t in [
            Timespec { sec: 0, nsec: 0 },
            Timespec { sec: 1_700_000_000, nsec: 123_456_789 },
            Timespec { sec: -1, nsec: 500_000_000 },
            Timespec { sec: -86_400, nsec: 0 },
        ] {
            assert_eq!(Timespec::from(system_time(t)), t);
        }
    }
}
