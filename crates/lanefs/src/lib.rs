//! lanefs: a log-structured file system for flash that scales with cores.
//!
//! The crate is layered bottom-up (see `DESIGN.md` in the shared folder); a module calls only
//! the layers below it:
//!
//! - [`device`]: block I/O on an image file or block device (io_uring or vectored sync I/O).

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
pub mod seg;
pub mod sync;

pub use error::{Error, Result};
pub use fs::{
    AtimeMode, AtimePolicy, Attr, Caller, DirEntry, FileKind, Fs, FsOptions, Handle, Ino, InodeFlags,
    IoStats, Listing, MkfsOptions, New, Privileged, SetAttr, StatFs, TrimRange, ROOT,
};
