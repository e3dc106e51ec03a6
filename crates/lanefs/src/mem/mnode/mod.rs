//! mnodes: the in-memory inodes of MEMFS.
//!
//! An mnode holds everything the file system knows about one inode: attributes, file pages or
//! directory entries, and (behind its own lock) where its data lives on disk. Namespace and data
//! operations change only the mnode; fsync, writeback and checkpoints bring the disk up to date
//! from it. Fields that every write touches (size, mtime, ctime) are atomics so that parallel
//! writers of one file share no lock beyond the range lock and their pages' shards.
//!
//! This file holds [`MNode`] itself and what it holds besides attributes (pages, directory
//! state); its two locked parts each have a file:
//! - `meta`: [`Meta`], the attributes that change rarely, behind [`MetaLock`] with a lock-free
//!   stat mirror.
//! - `disk`: [`DiskState`], where the data lives on disk, behind [`DiskLock`]; and the
//!   [`Bridge`] a checkpoint leaves for the fsyncs beside it.

mod disk;
mod meta;

pub use disk::{Bridge, DiskLock, DiskState, XattrDisk};
pub use meta::{Meta, MetaGuard, MetaLock};

use super::dir::DirMap;
use super::pages::{CacheStats, PageMap};
use super::range_lock::RangeLock;
use crate::format::node::{Timespec, S_IFMT};
use crate::oplog::dirlog::DirLog;
use crate::sync::rank::{Mutex, Rank};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

/// `MNode::dirty_epoch` while a thread takes the inode's snapshot for the checkpoint in
/// progress: others that would touch it wait until it is taken.
pub const CAPTURING: u64 = u64::MAX;

/// Directory state.
pub struct DirState {
    pub map: DirMap,
    pub log: DirLog,
    /// Serialises the collection of this directory's unjournaled records by journal flushes,
    /// and holds the ticket of the last flush that collected from it: the next one waits for
    /// that flush's write before its own transaction may count as durable (`crate::flush`).
    pub flush_lock: Mutex<Option<Arc<crate::sync::ticket::Ticket>>>,
    /// Set by rmdir: no new entry may be added.
    pub dead: AtomicBool,
}

impl DirState {
    /// Marks the directory dead (no name may be added) if it holds no name, for rmdir and a
    /// rename over it; returns whether it did. The mark goes first and stays only if the map is
    /// then empty: every add checks the mark under its name's shard lock, and the emptiness
    /// check takes each shard's lock in turn (`DirMap::is_empty_barrier`), so an add that found
    /// the mark clear is counted.
    pub fn mark_dead_if_empty(&self) -> bool {
        self.dead.store(true, Ordering::Release);
        if self.map.is_empty_barrier() {
            return true;
        }
        self.dead.store(false, Ordering::Release);
        false
    }
}

/// What an mnode holds besides attributes.
pub enum Content {
    File { pages: PageMap, range: RangeLock },
    Dir(DirState),
    Other,
}

/// An in-memory inode.
pub struct MNode {
    pub ino: u32,
    /// `S_IFMT` bits; fixed for the inode's life.
    pub file_type: u32,
    pub meta: MetaLock,
    pub size: AtomicU64,
    /// Nanoseconds since the epoch. The access time is an atomic like the others so that a
    /// read decides whether to update it without a lock (`mem::atime`).
    pub mtime: AtomicI64,
    pub ctime: AtomicI64,
    pub atime: AtomicI64,
    /// Inode flags (`mem::iflags`): an atomic, so that every write checks them without a lock;
    /// changed under the file's whole range lock, so a write checks what holds until it ends.
    pub flags: AtomicU32,
    pub content: Content,
    pub disk: DiskLock,
    /// Open handles.
    pub open: AtomicU32,
    /// References a kernel holds through a mount (FUSE's lookup count: one per entry reply it
    /// got, given back by FORGET; `mem::ops::life`). Like an open handle, they keep the inode
    /// alive once its last name is gone: the kernel may still send requests for it.
    pub lookups: AtomicU64,
    /// On `Memfs::orphans` (changed with the list, by `Memfs::orphan` and `Memfs::unorphan`):
    /// the list's lock is taken only for inodes that are or were orphans.
    pub orphaned: AtomicBool,
    /// For directories: the parent directory (the root is its own parent).
    pub parent: AtomicU32,
    /// Directories whose logs hold records naming this inode (its create, links, unlinks,
    /// renames) that no journal holds yet, with how many. An fsync of the inode flushes them,
    /// and so does the flush of any record that depends on the inode's names.
    pub pending: Mutex<BTreeMap<u32, u32>>,
    /// The checkpoint whose dirty set holds it (0: none; [`CAPTURING`] while one thread takes
    /// its snapshot). An inode changed since the last snapshot is in the set of the next
    /// checkpoint (`Memfs::epoch`); one left in the set of the checkpoint in progress is *owed*
    /// to it: that checkpoint's snapshot of it has not been taken yet, and whoever touches it
    /// first takes it (`Engine::capture_if_owed`), before any change.
    pub dirty_epoch: AtomicU64,
    /// The per-CPU dirty set it joined last, plus one (0: never). While `dirty_epoch` is the
    /// current epoch, it is in that set (`Memfs::bury` takes it out).
    pub dirty_pos: AtomicU64,
    /// It died: no name and not open, which it stays. It is on a dead list (`Engine::dead`),
    /// or the snapshot that found it so took it as deleted; either way exactly once.
    pub dead: AtomicBool,
    /// Sequence number of the checkpoint whose snapshot took changes of this inode that no
    /// journal record holds: an fsync must wait until that checkpoint is durable.
    pub captured_by: AtomicU64,
    /// Sequence number of the last checkpoint that installed this inode's snapshot (wrote its
    /// data and set `DiskState::bridge`): a regular file's fsync waits only for this.
    pub installed_by: AtomicU64,
    /// Its attributes changed since they were last journaled.
    pub attr_dirty: AtomicBool,
    /// Its access time changed (by a read) since it was last journaled or checkpointed: an
    /// fsync journals it, an fdatasync does not (`mem::atime`).
    pub atime_dirty: AtomicBool,
    /// On the lazy-atime queue (`Engine::lazy`).
    pub lazy_queued: AtomicBool,
    /// The file may have reserved blocks (`DiskState::reserved`): a write then looks for them
    /// under `disk` before it installs a page without it. Set under `disk` by whatever reserves
    /// a block, cleared under it once none is left. (A write and a reservation of the same page
    /// overlap in the range lock whenever the write would not take `disk`: a whole page.)
    pub preallocated: AtomicBool,
    /// Held by an fsync for its whole transaction, and by writeback, so that what one takes
    /// from the inode (dirty pages, placed blocks, attributes) is journaled, in stamp order,
    /// and durable before another fsync of the inode decides what is left: otherwise an fsync
    /// could find a page clean because a concurrent one took it, and return before that
    /// transaction is durable (or replay after it under a later stamp with older contents).
    pub fsync_order: Mutex<()>,
    /// Made by O_TMPFILE and never linked since: the one inode with no links that may gain a
    /// name (Linux's I_LINKABLE). Memory only: a crash drops the inode anyway.
    pub linkable: AtomicBool,
    /// Made by O_TMPFILE (stays set once linked). Its name's record is a `Create` stamped at
    /// its link, after any checkpoint that took it unnamed; a checkpoint's bridge, stamped at
    /// that checkpoint, would replay before the inode exists, so its fsyncs wait for the
    /// checkpoint instead (`Engine::bridges`).
    pub unnamed_birth: AtomicBool,
}

pub fn ts_to_ns(t: Timespec) -> i64 {
    t.sec.saturating_mul(1_000_000_000).saturating_add(t.nsec as i64)
}

pub fn ns_to_ts(ns: i64) -> Timespec {
    Timespec { sec: ns.div_euclid(1_000_000_000), nsec: ns.rem_euclid(1_000_000_000) as u32 }
}

/// An inode's times and flags, as a new mnode starts with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamps {
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub flags: u32,
}

impl Stamps {
    /// Every time `t`, no flags.
    pub fn at(t: Timespec) -> Stamps {
        Stamps { atime: t, mtime: t, ctime: t, flags: 0 }
    }
}

impl super::cells::Resident for MNode {
    /// A dead mnode leaving the table gives its cached pages back now: its memory may be
    /// reclaimed later, but the dirty-page count that space accounting and writeback read must
    /// not wait for that (the checkpoint already gave back its reservations).
    fn removed(&self) {
        if self.dead.load(Ordering::Acquire) {
            if let Some((pages, _)) = self.pages() {
                pages.truncate(0);
            }
        }
    }
}

impl MNode {
    /// A new mnode of `meta.mode`'s type.
    pub fn new(ino: u32, meta: Meta, size: u64, st: Stamps, stats: &Arc<CacheStats>) -> MNode {
        let file_type = meta.mode & S_IFMT;
        let content = match file_type {
            S_IFREG => Content::File { pages: PageMap::new(stats.clone()), range: RangeLock::new() },
            S_IFDIR => Content::Dir(DirState {
                map: DirMap::new(),
                log: DirLog::new(),
                flush_lock: Mutex::new(Rank::DirFlush, None),
                dead: AtomicBool::new(false),
            }),
            _ => Content::Other,
        };
        MNode {
            ino,
            file_type,
            meta: MetaLock::new(meta),
            size: AtomicU64::new(size),
            mtime: AtomicI64::new(ts_to_ns(st.mtime)),
            ctime: AtomicI64::new(ts_to_ns(st.ctime)),
            atime: AtomicI64::new(ts_to_ns(st.atime)),
            flags: AtomicU32::new(st.flags),
            content,
            disk: DiskLock::new(DiskState::new(stats.clone())),
            open: AtomicU32::new(0),
            lookups: AtomicU64::new(0),
            orphaned: AtomicBool::new(false),
            parent: AtomicU32::new(0),
            pending: Mutex::new(Rank::Pending, BTreeMap::new()),
            dirty_epoch: AtomicU64::new(0),
            dirty_pos: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            captured_by: AtomicU64::new(0),
            installed_by: AtomicU64::new(0),
            attr_dirty: AtomicBool::new(false),
            atime_dirty: AtomicBool::new(false),
            lazy_queued: AtomicBool::new(false),
            preallocated: AtomicBool::new(false),
            fsync_order: Mutex::new(Rank::FsyncOrder, ()),
            linkable: AtomicBool::new(false),
            unnamed_birth: AtomicBool::new(false),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.file_type == S_IFDIR
    }

    /// Something still refers to it by number: an open handle or a kernel's reference. With
    /// no name left it is then an orphan, not dead.
    pub fn held(&self) -> bool {
        self.open.load(Ordering::Acquire) > 0 || self.lookups.load(Ordering::Acquire) > 0
    }

    pub fn dir(&self) -> Option<&DirState> {
        match &self.content {
            Content::Dir(d) => Some(d),
            _ => None,
        }
    }

    pub fn pages(&self) -> Option<(&PageMap, &RangeLock)> {
        match &self.content {
            Content::File { pages, range } => Some((pages, range)),
            _ => None,
        }
    }

    pub fn mtime(&self) -> Timespec {
        ns_to_ts(self.mtime.load(Ordering::Relaxed))
    }

    pub fn ctime(&self) -> Timespec {
        ns_to_ts(self.ctime.load(Ordering::Relaxed))
    }

    pub fn atime(&self) -> Timespec {
        ns_to_ts(self.atime.load(Ordering::Relaxed))
    }

    /// The inode flags (`mem::iflags`).
    pub fn iflags(&self) -> u32 {
        self.flags.load(Ordering::Acquire)
    }

    /// Sets mtime and ctime to `now` (a data or entry change). Stores only what changed, so
    /// parallel writers within one clock tick share the lines read-only.
    pub fn touch(&self, now: Timespec) {
        let ns = ts_to_ns(now);
        if self.mtime.load(Ordering::Relaxed) != ns {
            self.mtime.store(ns, Ordering::Relaxed);
        }
        if self.ctime.load(Ordering::Relaxed) != ns {
            self.ctime.store(ns, Ordering::Relaxed);
        }
        if !self.attr_dirty.load(Ordering::Relaxed) {
            self.attr_dirty.store(true, Ordering::Relaxed);
        }
    }

    /// Adjusts the link count, saturating: a journal that is valid but odd (or a bug) must
    /// never wrap it around.
    pub fn add_nlink(&self, delta: i32) {
        let mut meta = self.meta.lock();
        meta.nlink = if delta < 0 {
            meta.nlink.saturating_sub(delta.unsigned_abs())
        } else {
            meta.nlink.saturating_add(delta as u32)
        };
    }

    /// Counts `n` more (or, negative, fewer) unjournaled records in directory `dir` naming
    /// this inode.
    pub fn note_pending(&self, dir: u32, n: i32) {
        let mut p = self.pending.lock();
        let c = p.entry(dir).or_insert(0);
        *c = if n < 0 { c.saturating_sub(n.unsigned_abs()) } else { c.saturating_add(n as u32) };
        if *c == 0 {
            p.remove(&dir);
        }
    }

    /// Directories with unjournaled records naming this inode.
    pub fn pending_dirs(&self) -> Vec<u32> {
        self.pending.lock().keys().copied().collect()
    }

    /// Under `disk`, after a change of its reservations: whether writes must look for them.
    pub fn note_reserved(&self, disk: &DiskState) {
        let any = !disk.reserved.is_empty();
        if self.preallocated.load(Ordering::Relaxed) != any {
            self.preallocated.store(any, Ordering::Release);
        }
    }

    /// Sets ctime to `now` (an attribute change).
    pub fn touch_ctime(&self, now: Timespec) {
        self.ctime.store(ts_to_ns(now), Ordering::Relaxed);
        self.attr_dirty.store(true, Ordering::Relaxed);
    }
}
