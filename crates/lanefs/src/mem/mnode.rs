//! mnodes: the in-memory inodes of MEMFS.
//!
//! An mnode holds everything the file system knows about one inode: attributes, file pages or
//! directory entries, and (behind its own lock) where its data lives on disk. Namespace and data
//! operations change only the mnode; fsync, writeback and checkpoints bring the disk up to date
//! from it. Fields that every write touches (size, mtime, ctime) are atomics so that parallel
//! writers of one file share no lock beyond the range lock and their pages' shards.

use super::cowmap::CowMap;
use super::dir::DirMap;
use super::pages::{CacheStats, PageMap};
use super::range_lock::RangeLock;
use super::reserve::Reserved;
use super::xattr::XattrState;
use crate::format::node::{Timespec, NEW_ADDR, S_IFMT};
use crate::node::{BlockMap, InodeTree};
use crate::oplog::dirlog::DirLog;
use crate::sync::rank::{Mutex, MutexGuard, Rank};
use crate::sync::seqlock::SeqWords;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

/// Attributes that change rarely, behind one short lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub crtime: Timespec,
    pub rdev: u64,
    pub generation: u32,
    pub xattrs: XattrState,
    /// A symlink's target.
    pub symlink: Vec<u8>,
}

/// The attributes stat(2) reports from [`Meta`], as a reader gets them without the mutex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatMeta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub generation: u32,
    pub crtime: Timespec,
    pub rdev: u64,
}

impl StatMeta {
    fn of(m: &Meta) -> StatMeta {
        StatMeta {
            mode: m.mode,
            uid: m.uid,
            gid: m.gid,
            nlink: m.nlink,
            generation: m.generation,
            crtime: m.crtime,
            rdev: m.rdev,
        }
    }

    fn encode(&self) -> [u64; 5] {
        let pair = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
        [
            pair(self.mode, self.uid),
            pair(self.gid, self.nlink),
            pair(self.generation, self.crtime.nsec),
            self.crtime.sec as u64,
            self.rdev,
        ]
    }

    fn decode(w: [u64; 5]) -> StatMeta {
        let (lo, hi) = (|x: u64| x as u32, |x: u64| (x >> 32) as u32);
        StatMeta {
            mode: lo(w[0]),
            uid: hi(w[0]),
            gid: lo(w[1]),
            nlink: hi(w[1]),
            generation: lo(w[2]),
            crtime: Timespec { sec: w[3] as i64, nsec: hi(w[2]) },
            rdev: w[4],
        }
    }
}

/// An inode's [`Meta`] behind its mutex, with the fields stat reports mirrored in a sequence
/// lock (`sync::seqlock`): [`MetaLock::stat`] reads them without writing a shared line, so
/// threads that stat or walk through one directory do not bounce its lock between cores.
///
/// Invariant: whenever the mutex is free, the mirror equals `StatMeta::of(&meta)` and
/// `has_xattrs` says whether `meta.xattrs.set` is non-empty. A guard that was dereferenced
/// mutably publishes both as it drops, still holding the mutex (so publications are serialised
/// and in the order of the changes).
pub struct MetaLock {
    inner: Mutex<Meta>,
    mirror: SeqWords<5>,
    /// Whether `meta.xattrs.set` holds any attribute, published like the mirror: a create
    /// asks it of the directory (a default ACL to inherit?) without taking the directory's
    /// mutex, which every create in a shared directory would otherwise bounce between cores.
    has_xattrs: AtomicBool,
}

/// A held [`MetaLock`].
pub struct MetaGuard<'a> {
    guard: MutexGuard<'a, Meta>,
    mirror: &'a SeqWords<5>,
    has_xattrs: &'a AtomicBool,
    changed: bool,
}

impl MetaLock {
    pub fn new(meta: Meta) -> MetaLock {
        let mirror = SeqWords::new(StatMeta::of(&meta).encode());
        let has_xattrs = AtomicBool::new(!meta.xattrs.set.is_empty());
        MetaLock { inner: Mutex::new(Rank::Meta, meta), mirror, has_xattrs }
    }

    /// Whether the inode has any extended attribute, as of the last change: lock-free and
    /// storing nothing. A change published before this read began is seen.
    #[inline]
    pub fn has_xattrs(&self) -> bool {
        self.has_xattrs.load(Ordering::Acquire)
    }

    pub fn lock(&self) -> MetaGuard<'_> {
        MetaGuard {
            guard: self.inner.lock(),
            mirror: &self.mirror,
            has_xattrs: &self.has_xattrs,
            changed: false,
        }
    }

    /// What stat reports, as of the last change: lock-free unless a change keeps overlapping
    /// the read, then under the mutex.
    #[inline]
    pub fn stat(&self) -> StatMeta {
        match self.mirror.read() {
            Some(w) => StatMeta::decode(w),
            None => StatMeta::of(&self.inner.lock()),
        }
    }
}

impl std::ops::Deref for MetaGuard<'_> {
    type Target = Meta;
    fn deref(&self) -> &Meta {
        &self.guard
    }
}

impl std::ops::DerefMut for MetaGuard<'_> {
    fn deref_mut(&mut self) -> &mut Meta {
        self.changed = true;
        &mut self.guard
    }
}

impl Drop for MetaGuard<'_> {
    fn drop(&mut self) {
        if self.changed {
            self.mirror.write(StatMeta::of(&self.guard).encode());
            let any = !self.guard.xattrs.set.is_empty();
            if self.has_xattrs.load(Ordering::Relaxed) != any {
                self.has_xattrs.store(any, Ordering::Release);
            }
        }
    }
}

/// Where an mnode's data lives on disk. Only fsync, writeback, truncate and the checkpoint
/// touch it, each holding the lock for a short, I/O-free critical section.
pub struct DiskState {
    /// The node tree of the last checkpoint (empty if the inode was never checkpointed).
    pub tree: Option<InodeTree>,
    /// The data mapping that tree records.
    pub tree_map: BlockMap,
    /// The current mapping: `tree_map` plus blocks written by fsync or writeback since.
    /// Copy-on-write, so that the checkpoint's snapshot of it is O(1) (`mem::cowmap`).
    pub cur_map: CowMap,
    /// Blocks written by writeback, in `cur_map` but not yet in any journal record:
    /// logical index -> (address, crc32c).
    pub unjournaled: BTreeMap<u64, (u32, u32)>,
    /// Smallest truncation point (in blocks) not yet journaled.
    pub truncated_from: Option<u64>,
    /// Blocks that left `cur_map` and are in no checkpoint tree: invalid once the next gated
    /// moment (fsync, writeback or checkpoint) processes them.
    pub garbage: Vec<u32>,
    /// The xattr node and blocks of the checkpoint.
    pub xattr: XattrDisk,
    /// A directory's on-disk dentry layout (loaded with the directory).
    pub dentries: Option<crate::diskdir::DiskDir>,
    /// Bumped whenever a mapped block is replaced or dropped (after which it may be freed
    /// and reused): a reader that read a block outside the lock checks it is unchanged.
    pub map_gen: u64,
    /// Data blocks the cleaner asked to move: (logical index, address it saw). The next
    /// checkpoint copies each one still mapped there to a new block.
    pub relocate: Vec<(u64, u32)>,
    /// Logical blocks preallocated and not yet written: each maps to `NEW_ADDR` and no dirty
    /// page covers it (see `mem::reserve`). Every change of `cur_map` keeps this a subset of
    /// its `NEW_ADDR` entries.
    pub reserved: Reserved,
    /// What the checkpoint in progress took from this inode that no journal holds, once it
    /// has written and installed it (`Engine::install_inode`): journaled by the inode's first
    /// fsync before that checkpoint is durable, so recovery from the previous one is complete.
    pub bridge: Option<Bridge>,
}

/// A captured inode's state at a checkpoint's snapshot beyond what the journal holds, for
/// fsyncs during that checkpoint's write phase (docs/ARCHITECTURE.md, "Checkpoints beside
/// fsync"). Its records carry the snapshot's stamp: replay on top of the previous checkpoint
/// applies them before everything written after the snapshot; on top of this checkpoint, which
/// holds them, it skips them.
pub struct Bridge {
    /// The checkpoint (sequence number) that captured the inode.
    pub seq: u64,
    /// The checkpoint's stamp.
    pub stamp: crate::journal::Stamp,
    /// The attributes at the snapshot.
    pub attr: crate::journal::InodeAttr,
    /// A truncation not journaled before the snapshot.
    pub truncated_from: Option<u64>,
    /// Writeback's unjournaled blocks at the snapshot: index -> (address, crc32c).
    pub blocks: BTreeMap<u64, (u32, u32)>,
    /// The snapshot's dirty pages and the blocks the checkpoint wrote them to (their crc is
    /// computed only if an fsync journals them).
    pub pages: Vec<(u64, u32, super::pages::PageBuf)>,
    /// Extended attributes changed and not journaled at the snapshot: name -> value (None:
    /// removed).
    pub xattrs: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// An fsync journaled it already (one transaction suffices: fsyncs of an inode are
    /// serialized, and each flushes after the previous one's blocks were written).
    pub journaled: bool,
}

impl Bridge {
    /// The bridge's records: the truncation first, then the attributes, the xattrs and the
    /// mapping (pages over the writeback blocks they superseded).
    pub fn records(&self, ino: u32) -> Vec<crate::journal::Record> {
        use crate::journal::Record;
        let stamp = self.stamp;
        let mut out = Vec::new();
        if let Some(from) = self.truncated_from {
            out.push(Record::Truncate { stamp, ino, from_block: from });
        }
        out.push(Record::SetAttr { stamp, ino, attr: self.attr });
        for (name, v) in &self.xattrs {
            out.push(match v {
                Some(value) => Record::SetXattr { stamp, ino, name: name.clone(), value: value.clone() },
                None => Record::RemoveXattr { stamp, ino, name: name.clone() },
            });
        }
        let mut map = self.blocks.clone();
        for (idx, addr, buf) in &self.pages {
            map.insert(*idx, (*addr, crc32c::crc32c(&buf[..])));
        }
        out.extend(Record::map_runs(ino, stamp, &map));
        out
    }
}

impl DiskState {
    /// An empty state whose reservations count toward `stats.reserved_blocks`.
    pub fn new(stats: Arc<CacheStats>) -> DiskState {
        DiskState {
            tree: None,
            tree_map: BlockMap::new(),
            cur_map: CowMap::new(),
            unjournaled: BTreeMap::new(),
            truncated_from: None,
            garbage: Vec::new(),
            xattr: XattrDisk::default(),
            dentries: None,
            map_gen: 0,
            relocate: Vec::new(),
            reserved: Reserved::new(stats),
            bridge: None,
        }
    }

    /// Points logical block `idx` at `addr` (0: hole; `NEW_ADDR`: unwritten, reserved). The
    /// replaced block is garbage unless the checkpoint tree still holds it (then the next
    /// checkpoint drops it); a reservation it held is given back (a block written there draws
    /// on it, a hole drops it).
    pub fn remap(&mut self, idx: u64, addr: u32) {
        self.map_gen += 1;
        self.reserved.remove(idx);
        let old = if addr == 0 { self.cur_map.remove(&idx) } else { self.cur_map.insert(idx, addr) };
        if addr == NEW_ADDR {
            self.reserved.insert(idx);
        }
        if let Some(old) = old {
            self.forget_block(idx, old);
        }
    }

    /// fallocate of a block that has no mapping: unwritten and reserved, journaled by the next
    /// fsync. The caller checked that no page covers it.
    pub fn preallocate(&mut self, idx: u64) {
        debug_assert!(!self.cur_map.contains_key(&idx));
        self.map_gen += 1;
        self.cur_map.insert(idx, NEW_ADDR);
        self.reserved.insert(idx);
        self.unjournaled.insert(idx, (NEW_ADDR, 0));
    }

    /// Zero range of a whole block whose page the caller dropped: unwritten and reserved,
    /// whatever it held, and journaled (so that replay also drops a page an earlier fsync
    /// logged inline). Nothing changes for a block that is unwritten already.
    pub fn unwrite(&mut self, idx: u64) {
        if self.reserved.contains(idx) {
            debug_assert_eq!(self.cur_map.get(&idx), Some(&NEW_ADDR));
            return;
        }
        self.remap(idx, NEW_ADDR);
        self.unjournaled.insert(idx, (NEW_ADDR, 0));
    }

    /// A write reaches block `idx`: if it was reserved, the reservation passes to the dirty
    /// page the caller creates now (under this lock). Returns whether it was reserved (the
    /// page's old bytes are zeros then).
    pub fn draw(&mut self, idx: u64) -> bool {
        let drawn = self.reserved.remove(idx);
        debug_assert!(!drawn || self.cur_map.get(&idx) == Some(&NEW_ADDR));
        drawn
    }

    /// Drops every mapping at or after `from`, and returns them: a large file's are freed by
    /// the caller after the pass-through semaphore (as `PageMap::truncate`'s pages).
    pub fn truncate(&mut self, from: u64) -> CowMap {
        self.map_gen += 1;
        self.reserved.remove_from(from);
        let gone = self.cur_map.split_off(&from);
        // One merged walk of the two sorted maps, not a tree search per block (`forget_block`):
        // 16,384 searches were a millisecond under the semaphore for a 64 MiB file.
        let mut tree = self.tree_map.range(from..).peekable();
        let garbage_before = self.garbage.len();
        for (&idx, &addr) in gone.iter() {
            while tree.next_if(|&(&t, _)| t < idx).is_some() {}
            let in_tree = tree.peek().is_some_and(|&(&t, &a)| t == idx && a == addr);
            if !in_tree && addr != NEW_ADDR {
                self.garbage.push(addr);
            }
        }
        debug_assert!(self.garbage.len() - garbage_before <= gone.len());
        debug_assert!(self.cur_map.range(from..).next().is_none());
        drop(self.unjournaled.split_off(&from));
        self.truncated_from = Some(self.truncated_from.map_or(from, |t| t.min(from)));
        gone
    }

    fn forget_block(&mut self, idx: u64, addr: u32) {
        let in_tree = self.tree_map.get(&idx) == Some(&addr);
        if !in_tree && addr != NEW_ADDR {
            self.garbage.push(addr);
        }
    }
}

/// An inode's [`DiskState`] behind its mutex, with the number of mapped blocks mirrored in an
/// atomic: stat's `st_blocks` of a file with nothing dirty reads it without the lock that
/// fsync, writeback and the checkpoint take.
///
/// Invariant: whenever the mutex is free, `mapped == cur_map.len()`. Every guard publishes it
/// as it drops, still holding the mutex (a store only when the count changed).
pub struct DiskLock {
    inner: Mutex<DiskState>,
    mapped: AtomicU64,
}

/// A held [`DiskLock`].
pub struct DiskGuard<'a> {
    guard: MutexGuard<'a, DiskState>,
    mapped: &'a AtomicU64,
}

impl DiskLock {
    pub fn new(d: DiskState) -> DiskLock {
        let mapped = AtomicU64::new(d.cur_map.len() as u64);
        DiskLock { inner: Mutex::new(Rank::Disk, d), mapped }
    }

    pub fn lock(&self) -> DiskGuard<'_> {
        DiskGuard { guard: self.inner.lock(), mapped: &self.mapped }
    }

    /// Blocks in the current mapping as of the last unlock (lock-free).
    pub fn mapped_blocks(&self) -> u64 {
        self.mapped.load(Ordering::Acquire)
    }
}

impl std::ops::Deref for DiskGuard<'_> {
    type Target = DiskState;
    fn deref(&self) -> &DiskState {
        &self.guard
    }
}

impl std::ops::DerefMut for DiskGuard<'_> {
    fn deref_mut(&mut self) -> &mut DiskState {
        &mut self.guard
    }
}

impl Drop for DiskGuard<'_> {
    fn drop(&mut self) {
        let n = self.guard.cur_map.len() as u64;
        if self.mapped.load(Ordering::Relaxed) != n {
            self.mapped.store(n, Ordering::Release);
        }
    }
}

/// Where an inode's xattrs live in the checkpoint (`format::xattr`).
#[derive(Default)]
pub struct XattrDisk {
    /// Node id of the xattr node (0: none).
    pub nid: u32,
    /// The xattr blocks it lists, in stream order (empty: the set is inline in the node).
    pub blocks: Vec<u32>,
    /// The stream those blocks hold, so that the next checkpoint rewrites only the blocks
    /// whose bytes changed.
    pub stream: Vec<u8>,
    /// Blocks the cleaner asked to move: (index, address it saw). The next checkpoint that
    /// writes the set copies each one still there.
    pub relocate: Vec<(u32, u32)>,
}

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
    /// For directories: the parent directory (the root is its own parent).
    pub parent: AtomicU32,
    /// Directories whose logs hold records naming this inode (its create, links, unlinks,
    /// renames) that no journal holds yet, with how many. An fsync of the inode flushes them,
    /// and so does the flush of any record that depends on the inode's names.
    pub pending: Mutex<BTreeMap<u32, u32>>,
    /// In the dirty set (changed since the last checkpoint snapshot).
    pub in_dirty_set: AtomicBool,
    /// The per-CPU dirty set it joined last, plus one (0: never). While `in_dirty_set` holds,
    /// it is in that set (`Engine::bury` takes it out).
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
            parent: AtomicU32::new(0),
            pending: Mutex::new(Rank::Pending, BTreeMap::new()),
            in_dirty_set: AtomicBool::new(false),
            dirty_pos: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            captured_by: AtomicU64::new(0),
            installed_by: AtomicU64::new(0),
            attr_dirty: AtomicBool::new(false),
            atime_dirty: AtomicBool::new(false),
            lazy_queued: AtomicBool::new(false),
            preallocated: AtomicBool::new(false),
            fsync_order: Mutex::new(Rank::FsyncOrder, ()),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.file_type == S_IFDIR
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn has_xattrs_follows_every_change_of_the_set() {
        let meta = |x: bool| {
            let mut set = crate::mem::xattr::XattrSet::default();
            if x {
                set.set(b"user.a", b"1".to_vec());
            }
            Meta {
                mode: S_IFDIR | 0o755,
                uid: 0,
                gid: 0,
                nlink: 2,
                crtime: Timespec { sec: 0, nsec: 0 },
                rdev: 0,
                generation: 0,
                xattrs: XattrState { set: Arc::new(set), ..Default::default() },
                symlink: Vec::new(),
            }
        };
        assert!(MetaLock::new(meta(true)).has_xattrs());
        let l = MetaLock::new(meta(false));
        assert!(!l.has_xattrs());
        Arc::make_mut(&mut l.lock().xattrs.set).set(b"system.posix_acl_default", b"acl".to_vec());
        assert!(l.has_xattrs());
        // A change of something else keeps it.
        l.lock().nlink = 3;
        assert!(l.has_xattrs());
        Arc::make_mut(&mut l.lock().xattrs.set).remove(b"system.posix_acl_default");
        assert!(!l.has_xattrs());
    }

    #[test]
    fn truncate_makes_garbage_of_exactly_the_blocks_no_tree_holds() {
        let mut d = DiskState::new(Arc::new(CacheStats::default()));
        // The checkpoint tree holds blocks 0..8 at 100+i; the current mapping replaced the odd
        // ones past 4 (fsync), and added 8..12 (journal only) and an unwritten 12.
        for i in 0..8u64 {
            d.tree_map.insert(i, 100 + i as u32);
            d.cur_map.insert(i, 100 + i as u32);
        }
        for i in (5..8u64).step_by(2) {
            d.cur_map.insert(i, 200 + i as u32);
        }
        for i in 8..12u64 {
            d.cur_map.insert(i, 300 + i as u32);
        }
        d.preallocate(12);
        let gen = d.map_gen;
        let gone = d.truncate(4);
        assert_eq!(gone.iter().map(|(&i, _)| i).collect::<Vec<_>>(), (4..13).collect::<Vec<_>>());
        let mut garbage = d.garbage.clone();
        garbage.sort_unstable();
        // Tree blocks (4, 6) die with the next tree; the unwritten one has no block.
        assert_eq!(garbage, vec![205, 207, 308, 309, 310, 311]);
        assert_eq!(d.cur_map.len(), 4);
        assert!(d.unjournaled.is_empty(), "the preallocation's record went with it");
        assert_eq!(d.truncated_from, Some(4));
        assert!(d.map_gen > gen);
        assert!(!d.reserved.contains(12));
    }

    fn meta(mode: u32, uid: u32) -> Meta {
        Meta {
            mode,
            uid,
            gid: uid,
            nlink: 1,
            crtime: Timespec { sec: 1, nsec: 2 },
            rdev: 0,
            generation: 7,
            xattrs: XattrState::default(),
            symlink: Vec::new(),
        }
    }

    /// Writers change mode, uid, gid and nlink together under the mutex (each to a value
    /// derived from one counter); stat readers on other threads, lock-free, must only ever see
    /// the four from one change, never going back, and the last change at the end.
    #[test]
    fn stat_readers_see_each_change_whole_and_in_order() {
        const WRITES: u32 = 20_000;
        let m = MetaLock::new(meta(S_IFREG, 0));
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..3)
                .map(|_| {
                    let (m, stop) = (&m, &stop);
                    s.spawn(move || {
                        let mut last = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let st = m.stat();
                            let k = st.uid;
                            assert_eq!(st.mode, S_IFREG | (k & 0o7777), "mode of another change");
                            assert_eq!((st.gid, st.nlink), (k, k + 1), "torn stat {st:?}");
                            assert_eq!((st.generation, st.crtime), (7, Timespec { sec: 1, nsec: 2 }));
                            assert!(k >= last, "went back from {last} to {k}");
                            last = k;
                        }
                    })
                })
                .collect();
            let writers: Vec<_> = (0..2)
                .map(|_| {
                    let m = &m;
                    s.spawn(move || {
                        for _ in 0..WRITES {
                            let mut g = m.lock();
                            let k = g.uid + 1;
                            g.mode = S_IFREG | (k & 0o7777);
                            g.uid = k;
                            g.gid = k;
                            g.nlink = k + 1;
                        }
                    })
                })
                .collect();
            writers.into_iter().for_each(|w| w.join().unwrap());
            stop.store(true, Ordering::Relaxed);
            readers.into_iter().for_each(|r| r.join().unwrap());
        });
        let st = m.stat();
        assert_eq!((st.uid, st.nlink), (2 * WRITES, 2 * WRITES + 1));
        assert_eq!(st, StatMeta::of(&m.lock()));
    }

    /// Threads remap and truncate blocks under `disk` while others read the lock-free count:
    /// every count read is one the mapping had, and once all guards are gone it is the
    /// mapping's length.
    #[test]
    fn mapped_block_mirror_matches_the_mapping_after_every_unlock() {
        let d = DiskLock::new(DiskState::new(Arc::new(CacheStats::default())));
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    assert!(d.mapped_blocks() <= 4 * 256, "more blocks than ever mapped");
                    reads += 1;
                }
                reads
            });
            let writers: Vec<_> = (0..4u64)
                .map(|t| {
                    let d = &d;
                    s.spawn(move || {
                        for round in 0..200u64 {
                            let mut g = d.lock();
                            for i in 0..256 {
                                g.remap(t * 256 + i, (round * 1000 + i) as u32 + 1);
                            }
                            drop(g);
                            assert!(d.mapped_blocks() >= 256 || t != 0 || round == 0);
                            if round % 3 == 0 {
                                let mut g = d.lock();
                                for i in 0..256 {
                                    g.remap(t * 256 + i, 0);
                                }
                            }
                        }
                    })
                })
                .collect();
            writers.into_iter().for_each(|w| w.join().unwrap());
            stop.store(true, Ordering::Relaxed);
            assert!(reader.join().unwrap() > 0);
        });
        assert_eq!(d.mapped_blocks(), d.lock().cur_map.len() as u64);
        assert_eq!(d.mapped_blocks(), 4 * 256, "round 199 left every thread's blocks mapped");
    }
}
