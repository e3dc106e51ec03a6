//! MEMFS operations: the namespace and file data, changed in memory only.
//!
//! Every operation enters through the pass-through semaphore (shared), so a checkpoint's
//! snapshot sees no operation half done. A directory change locks only the shard of the names
//! it touches, takes its timestamp and appends its log record inside that critical section (its
//! linearization point), and registers with `inflight` so that a merge stamped later waits for
//! it. File data is written under the range lock of the bytes written, never a file lock.

use super::iflags::{refuse, InodeFlags};
use super::mnode::{ts_to_ns, Content, DiskState, MNode, Meta, Stamps, S_IFDIR, S_IFLNK, S_IFREG};
use super::pages::{PageMap, PAGE_SIZE};
use super::range_lock::LockMode;
use crate::device::BLOCK_SIZE;
use crate::engine::{now, Engine};
use crate::error::{Error, Result};
use crate::format::dentry::dtype_of;
use crate::format::dentry::validate_name;
use crate::format::node::{Timespec, ADDRS_PER_NODE, NEW_ADDR, S_IFMT};
use crate::format::tree::MAX_FILE_BLOCKS;
use crate::format::xattr::{blocks_for, stream_entry_len, MAX_XATTR_STREAM};
use crate::journal::{InodeAttr, Record};
use crate::oplog::dirlog::LoggedOp;
use crate::perm::{Caller, Change};
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod attr;
mod data;
mod life;
mod namespace;
mod tmpfile;

/// Largest file size in bytes.
pub const MAX_FILE_SIZE: u64 = MAX_FILE_BLOCKS * BLOCK_SIZE as u64;
pub use crate::format::xattr::{XATTR_NAME_MAX, XATTR_SIZE_MAX};
pub const XATTR_CREATE: i32 = 1;
pub const XATTR_REPLACE: i32 = 2;
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
/// Leave a whiteout (a character device 0:0) at the source name, as overlayfs asks.
pub const RENAME_WHITEOUT: u32 = 4;
pub const FALLOC_FL_KEEP_SIZE: i32 = 1;
pub const FALLOC_FL_PUNCH_HOLE: i32 = 2;
pub const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

fn enoent(what: impl Into<String>) -> Error {
    Error::errno(libc::ENOENT, what)
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > crate::format::node::MAX_NAME_LEN {
        return Err(Error::errno(libc::ENAMETOOLONG, String::from_utf8_lossy(name)));
    }
    validate_name(name).map_err(|why| Error::errno(libc::EINVAL, why))
}

/// Inside a directory shard's critical section: why a new name cannot be added (it exists, or
/// the directory is being removed), as the update's answer, or None if it can.
#[allow(clippy::type_complexity)]
fn refuse_new_name(
    dir: &super::mnode::DirState,
    name: &[u8],
    old: Option<super::dir::DirEntry>,
) -> Option<(Option<(u32, u8)>, Result<()>)> {
    if let Some(e) = old {
        return Some((
            Some((e.ino, e.file_type)),
            Err(Error::errno(libc::EEXIST, String::from_utf8_lossy(name))),
        ));
    }
    if dir.dead.load(Ordering::Acquire) {
        return Some((None, Err(enoent("directory was removed"))));
    }
    None
}

/// Whether a write stamps the file's mtime and ctime (not the journal's `Stamp`, which orders
/// records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteTimes {
    /// Now, as write(2) does.
    Now,
    /// Left as they are: the bytes come from a cache that keeps the times itself and sends them
    /// in a later setattr (the kernel's FUSE writeback cache, whose WRITEs arrive at writeback,
    /// after the write(2) that set the time the caller saw).
    Keep,
}

/// What a name in a directory is (`Engine::named`).
enum Named<'p> {
    /// ".".
    Itself,
    /// "..".
    Parent,
    /// Any other name, valid while the pin it was read under lives.
    Slot(&'p crate::mem::dir::Slot),
}

/// What a truncate took out of a file: its cached pages and its mapping past the new end,
/// freed when this drops, after the caller let go of the pass-through semaphore.
#[derive(Default)]
struct Truncated {
    pages: Vec<super::pages::Page>,
    map: super::cowmap::CowMap,
}

/// A rename's two directories (pinned, `Engine::with_dir`) and the rest of its arguments.
struct RenameArgs<'a> {
    sd: &'a Arc<MNode>,
    sname: &'a [u8],
    dd: &'a Arc<MNode>,
    dname: &'a [u8],
    flags: u32,
    owner: (u32, u32),
}

/// What a new inode is.
pub struct NewInode<'a> {
    /// Type and permission bits, as asked for: the parent's default ACL or else `umask` masks
    /// them.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub symlink: &'a [u8],
    /// The creating process's umask (0: none).
    pub umask: u32,
}

impl MNode {
    /// The attributes a journal record carries (all but nlink).
    pub fn attr_record(&self, meta: &Meta) -> InodeAttr {
        InodeAttr {
            mode: meta.mode,
            uid: meta.uid,
            gid: meta.gid,
            size: self.size.load(Ordering::Acquire),
            atime: self.atime(),
            mtime: self.mtime(),
            ctime: self.ctime(),
            crtime: meta.crtime,
            rdev: meta.rdev,
            flags: self.iflags(),
            generation: meta.generation,
        }
    }
}
