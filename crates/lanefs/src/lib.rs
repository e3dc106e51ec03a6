//! lanefs: a log-structured file system for flash that scales with cores.
//!
//! The crate is layered bottom-up (docs/ARCHITECTURE.md in the repository); a module calls only
//! the layers below it. From the bottom:
//!
//! - [`device`]: block I/O on an image file or block device (io_uring or vectored sync I/O),
//!   and [`pmem`]: the persistent-memory region.
//! - [`format`](mod@format): the codec of every on-disk structure; [`error`]: the one error type.
//! - [`checkpoint`] and [`recovery`]: reading and committing consistent points, and mount.
//! - DISKFS: [`seg`] (segments and lanes of logs), [`nat`] (node id -> block), [`node`] (an
//!   inode's node tree), [`diskdir`] (a directory's dentry blocks), [`gc`] (cleaning).
//! - [`journal`]: the redo log between checkpoints, one chain per lane.
//! - [`flush`]: fsync, writeback and taking checkpoints; [`oplog`]: per-core directory logs.
//! - [`mem`]: MEMFS, where every read and change happens; with [`perm`], [`acl`] and
//!   [`generation`] for the rules it applies; [`sync`]: its primitives and the lock hierarchy.
//! - [`engine`]: the state of a mounted file system, joining the layers.
//! - [`fs`], [`fsctl`] and [`fs_seek`]: the library API. [`mkfs`], [`fsck`], [`inspect`]: the
//!   tools. [`crashtest`]: the crash-consistency harness.

pub mod acl;
pub mod checkpoint;
pub mod crashtest;
pub mod device;
pub mod diskdir;
pub mod engine;
pub mod error;
pub mod flush;
pub mod format;
pub mod fs;
pub mod fs_seek;
pub mod fsck;
pub mod fsctl;
pub mod gc;
pub mod generation;
pub mod inspect;
pub mod journal;
pub mod mem;
pub mod mkfs;
pub mod nat;
pub mod node;
pub mod oplog;
pub mod perm;
pub mod pmem;
pub mod recovery;
pub mod rng;
pub mod seg;
pub mod sync;

pub use error::{Error, Result};
pub use fs::{
    AtimeMode, AtimePolicy, Attr, Caller, DirEntry, FallocMode, FileKind, Fs, FsOptions, Handle, Ino,
    InodeFlags, IoStats, Listing, MkfsOptions, New, Privileged, RenameFlags, SetAttr, StatFs, TrimRange,
    XattrFlags, ROOT,
};
