//! Conversions between lanefs's types and FUSE's: errors, file kinds, times, attributes.

use crate::proto::{Errno, FileAttr, FileType, Generation, TimeOrNow};
use lanefs::format::node::Timespec;
use lanefs::{Attr, FileKind};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::SystemTime;

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

pub(super) fn time_or_now(t: TimeOrNow) -> Timespec {
    match t {
        TimeOrNow::Specific(t) => t,
        TimeOrNow::Now => Timespec::from(SystemTime::now()),
    }
}

const EPOCH: Timespec = Timespec { sec: 0, nsec: 0 };

/// The attributes of a negative entry (node id 0), which the kernel does not read.
pub(super) const NO_ENTRY: FileAttr = FileAttr {
    ino: 0,
    size: 0,
    blocks: 0,
    atime: EPOCH,
    mtime: EPOCH,
    ctime: EPOCH,
    mode: libc::S_IFREG,
    nlink: 0,
    uid: 0,
    gid: 0,
    rdev: 0,
    blksize: 0,
};

/// stat(2) attributes as FUSE sends them.
pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
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
    fn attributes_keep_times_before_the_epoch_and_the_type_bits() {
        let t = Timespec { sec: -86_400, nsec: 5 };
        let a = Attr {
            ino: 7,
            kind: FileKind::Dir,
            mode: libc::S_IFDIR | 0o755,
            nlink: 2,
            uid: 1,
            gid: 2,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            rdev: 0,
            blksize: 4096,
            generation: 3,
        };
        let f = file_attr(&a);
        assert_eq!((f.atime, f.mode, f.ino), (t, libc::S_IFDIR | 0o755, 7));
        assert_eq!(time_or_now(TimeOrNow::Specific(t)), t);
    }
}
