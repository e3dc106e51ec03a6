//! The plain data the library API takes and returns: attributes, changes to them, new inodes,
//! directory entries and listings, statfs, I/O counters. Re-exported at the crate root.
//!
//! Invariants: nothing here reaches into the engine; a `Listing` is built only by
//! `Fs::listing`, from the directory it names.

use super::Ino;
use crate::format::node::{Timespec, S_IFMT};

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A named pipe (FIFO).
    Fifo,
    /// A Unix domain socket.
    Socket,
    /// A character device node.
    CharDevice,
    /// A block device node.
    BlockDevice,
}

impl FileKind {
    pub(super) fn of(mode: u32) -> FileKind {
        match mode & S_IFMT {
            0o040000 => FileKind::Dir,
            0o120000 => FileKind::Symlink,
            0o010000 => FileKind::Fifo,
            0o140000 => FileKind::Socket,
            0o020000 => FileKind::CharDevice,
            0o060000 => FileKind::BlockDevice,
            _ => FileKind::File,
        }
    }
}

/// Attributes, as stat(2) reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    /// Inode number, stable across mounts (the inode's node id).
    pub ino: Ino,
    /// What the inode is (the type bits of its mode).
    pub kind: FileKind,
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    /// Number of names (hard links) the inode has.
    pub nlink: u32,
    /// Owner's user id.
    pub uid: u32,
    /// Owner's group id.
    pub gid: u32,
    /// Size in bytes (a symlink's: its target's length).
    pub size: u64,
    /// 512-byte units allocated.
    pub blocks: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last change of the data.
    pub mtime: Timespec,
    /// Last change of the inode (data, attributes, names).
    pub ctime: Timespec,
    /// Creation (birth) time, as statx reports it.
    pub crtime: Timespec,
    /// Device number of a device node (0 for anything else).
    pub rdev: u64,
    /// Preferred I/O size: the block size.
    pub blksize: u32,
    /// Tells this inode from earlier ones that had its number (file handles carry it).
    pub generation: u32,
}

/// Attributes to change; `None` leaves one alone.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    /// New permission bits (and set-ID and sticky bits); the type bits are ignored.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size: truncates or extends with a hole.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<Timespec>,
    /// New modification time.
    pub mtime: Option<Timespec>,
    /// Defaults to now.
    pub ctime: Option<Timespec>,
    /// `atime` and `mtime`, where given, are the current time (utimensat with NULL or
    /// UTIME_NOW): allowed on an append-only inode, where explicit times are not (as ext4).
    pub times_now: bool,
}

/// A new inode for [`Fs::make`](super::Fs::make).
#[derive(Debug, Clone, Default)]
pub struct New {
    /// Type and permission bits (any type but a symlink; a regular file if none).
    pub mode: u32,
    /// For a device.
    pub rdev: u64,
    /// Owner of the new inode.
    pub uid: u32,
    /// Group of the new inode (already chosen for a set-group-ID directory).
    pub gid: u32,
    /// The creating process's umask: it masks `mode` unless the parent has a default ACL.
    pub umask: u32,
}

/// One directory entry from [`Fs::readdir`](super::Fs::readdir).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name (no NUL, no '/').
    pub name: Vec<u8>,
    /// The inode it names.
    pub ino: Ino,
    /// What that inode is, from the directory entry (no inode read).
    pub kind: FileKind,
    /// Pass to `readdir` to continue after this entry.
    pub cookie: u64,
}

/// A directory listing in progress: from [`Fs::listing`](super::Fs::listing), for [`Fs::readdir_listing`](super::Fs::readdir_listing).
///
/// It holds where the directory's cookies stood when it started, so it returns every entry
/// that exists throughout it exactly once, no entry created during it, and it ends, even while
/// the caller renames each entry it reads (a renamed entry has a new cookie, past the
/// horizon). Start a new one to see the directory as it is now (as `rewinddir` does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub(super) ino: Ino,
    pub(super) horizon: crate::mem::dir::Horizon,
}

/// statfs(2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFs {
    /// Block size in bytes (4096).
    pub bsize: u32,
    /// Blocks in the main area that can hold data.
    pub blocks: u64,
    /// Free blocks (invalid blocks the cleaner can reclaim included).
    pub bfree: u64,
    /// Free blocks available to a caller: the same as `bfree` (no root reserve).
    pub bavail: u64,
    /// Inode numbers in total.
    pub files: u64,
    /// Inode numbers free.
    pub ffree: u64,
    /// Longest name, in bytes.
    pub namelen: u32,
}

/// Bytes written to the device since mount, by cause, and the cleaner's work.
///
/// Write amplification is every byte the file system wrote over the bytes users wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Bytes passed to write calls.
    pub user_bytes: u64,
    /// fsync: data and journal blocks.
    pub journal_bytes: u64,
    /// Dirty pages written under cache pressure.
    pub writeback_bytes: u64,
    /// Checkpoints: data, nodes (including nodes the cleaner moved), NAT, SIT, summaries.
    pub checkpoint_bytes: u64,
    /// Data blocks the cleaner moved.
    pub cleaning_bytes: u64,
    /// Bytes fsync committed to the persistent-memory region's lane journals instead (not
    /// device bytes: entries with their head words and padding).
    pub nvm_journal_bytes: u64,
    /// Device flushes fsync called for (group commit may share one among several fsyncs).
    pub fsync_flushes: u64,
    /// Device flushes group commit issued for those calls: fewer than `fsync_flushes` by the
    /// flushes concurrent fsyncs shared.
    pub fsync_device_flushes: u64,
    /// Scatter-gather batches cooperative commit submitted for fsyncs (`FsOptions::cooperative`;
    /// 0 with it off): each one submission of every queued fsync's data and journal blocks,
    /// then one device flush.
    pub fsync_batches: u64,
    /// Cleaning rounds run and segments they emptied.
    pub cleaning_rounds: u64,
    /// Segments those rounds emptied.
    pub segments_cleaned: u64,
    /// Checkpoints begun (their snapshot taken) and made durable since mount. Equal when none
    /// is in progress.
    pub checkpoints_begun: u64,
    /// Checkpoints whose pack is durable.
    pub checkpoints_durable: u64,
    /// The longest time, since mount, that a checkpoint's exclusive phase (its snapshot) held
    /// every operation out, and that its write phase held fsync and writeback out (µs).
    pub cp_exclusive_us_max: u64,
    /// The longest write phase since mount (µs): fsync and writeback wait.
    pub cp_write_phase_us_max: u64,
    /// fsyncs and writebacks that waited for a checkpoint in progress since mount: to be
    /// durable (a directory in its snapshot, or the checkpoint fenced every fsync off), or to
    /// install a regular file in its snapshot.
    pub cp_waits: u64,
    /// fsyncs that journaled a checkpoint's bridge (`mem::mnode::Bridge`): of a file the
    /// checkpoint in progress captured, instead of waiting for it to be durable.
    pub cp_bridges: u64,
    /// Captured files an fsync or writeback installed for the checkpoint in progress, on its
    /// own thread, instead of waiting for the checkpoint's writer to reach them.
    pub cp_helped: u64,
}

impl IoStats {
    /// Bytes written to the device for any cause: journal, writeback, checkpoints, cleaning.
    pub fn device_bytes(&self) -> u64 {
        self.journal_bytes + self.writeback_bytes + self.checkpoint_bytes + self.cleaning_bytes
    }

    /// Device bytes written per user byte (0 when users wrote nothing).
    pub fn write_amplification(&self) -> f64 {
        let dev = self.device_bytes();
        if self.user_bytes == 0 {
            0.0
        } else {
            dev as f64 / self.user_bytes as f64
        }
    }
}

/// What a directory entry's type byte (`DT_*`) names.
pub(super) fn kind_of_dtype(t: u8) -> FileKind {
    match t {
        4 => FileKind::Dir,
        10 => FileKind::Symlink,
        1 => FileKind::Fifo,
        12 => FileKind::Socket,
        2 => FileKind::CharDevice,
        6 => FileKind::BlockDevice,
        _ => FileKind::File,
    }
}
