//! The exclusive phase of a checkpoint (step 2 of `flush::checkpoint`) and the settling right
//! after it.
//!
//! Invariants: the phase runs with the gate and the pass-through semaphore both held
//! exclusively (`Engine::snapshot` takes their guards as proof), so no operation, fsync or
//! writeback runs beside it. It does no I/O and no work per dead inode, directory record or
//! touched name: dirty sets, dead lists, directory logs and touched-name shards are swapped
//! out whole, mappings shared (`mem::cowmap`). Each live dirty inode is captured once, in
//! inode order, and marked `captured_by` this checkpoint. What needs no frozen moment
//! (`settle_snapshot`) runs after the semaphore is released.

use super::pauses::ExclusiveWork;
use crate::engine::{Engine, JOURNAL_LOG};
use crate::format::node::NEW_ADDR;
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::journal::ChainPos;
use crate::mem::cowmap::CowMap;
use crate::mem::dir::Touched;
use crate::mem::mnode::{MNode, Meta};
use crate::mem::pages::PageBuf;
use crate::sync::rank::RwLockWriteGuard;
use crate::sync::{ExclusiveGuard, Rank};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One captured inode: what the checkpoint writes of it, as the exclusive phase saw it.
pub(super) struct InodeSnap {
    pub(super) m: Arc<MNode>,
    pub(super) meta: Meta,
    pub(super) size: u64,
    pub(super) atime: crate::format::node::Timespec,
    pub(super) mtime: crate::format::node::Timespec,
    pub(super) ctime: crate::format::node::Timespec,
    pub(super) flags: u32,
    pub(super) parent: u32,
    pub(super) pages: Vec<(u64, PageBuf)>,
    /// The current mapping at the snapshot: a shared copy (`mem::cowmap`), O(1) to take.
    pub(super) map: CowMap,
    /// For directories: names whose entry changed, with the entry at the snapshot, as the
    /// directory's shards recorded them (`mem::dir`).
    pub(super) names: Vec<Touched>,
    pub(super) xattrs_changed: bool,
    /// Blocks the cleaner asked to move, still mapped at the snapshot and not rewritten by
    /// it: (logical index, address). Filtered after the exclusive phase.
    pub(super) relocate: Vec<(u64, u32)>,
    /// Writeback's unjournaled blocks, superseded by the checkpoint; with the two below, what
    /// a regular file's bridge holds (`mem::mnode::Bridge`).
    pub(super) unjournaled: std::collections::BTreeMap<u64, (u32, u32)>,
    /// The truncation not journaled at the snapshot.
    pub(super) truncated_from: Option<u64>,
    /// Names of the xattrs changed and not journaled at the snapshot.
    pub(super) xattr_names: std::collections::BTreeSet<Vec<u8>>,
}

/// What the exclusive phase took, for the write phase.
pub(super) struct Snapshot {
    pub(super) seq: u64,
    pub(super) stamp: u64,
    /// The stamp the bridges' records carry (`stamp` is its ticks).
    pub(super) full_stamp: crate::journal::Stamp,
    pub(super) inodes: Vec<InodeSnap>,
    /// Inodes dead at the snapshot, which this checkpoint drops (`settle_snapshot` fills it
    /// from the two below).
    pub(super) deleted: Vec<Arc<MNode>>,
    /// The per-CPU dead lists, swapped out whole (`Memfs::bury`).
    pub(super) dead: Vec<Vec<Arc<MNode>>>,
    /// Dirty inodes the phase found dead that no one buried.
    pub(super) found_dead: Vec<Arc<MNode>>,
    pub(super) orphans: Vec<u32>,
    pub(super) heads: Vec<ChainPos>,
    /// The directories whose logs this checkpoint holds (`DirLog::hold_all`): released, their
    /// records journaled and pending counts dropped, once it is durable.
    pub(super) held_dirs: Vec<Arc<MNode>>,
    /// Reserved blocks at the snapshot (`mem::reserve`).
    pub(super) reserved: u64,
}

/// What `capture_all` found: the live inodes' snapshots, the dead ones no one buried, and
/// the directories whose logs the checkpoint now holds.
struct Captured {
    inodes: Vec<InodeSnap>,
    found_dead: Vec<Arc<MNode>>,
    held_dirs: Vec<Arc<MNode>>,
}

/// What the phase takes after the inodes (`close_snapshot`).
struct SnapshotTail {
    orphans: Vec<u32>,
    heads: Vec<ChainPos>,
    reserved: u64,
}

impl Engine {
    /// The exclusive phase (every operation drained): what the checkpoint must take at this
    /// instant, and nothing it can take after. Lists, logs and touched-name sets are swapped
    /// out whole; each live dirty inode is captured (its mapping shared, not copied); dead
    /// inodes are not visited at all (`Memfs::bury` took them out of the dirty set). The work
    /// done per item is counted in `cp_pauses` (`ExclusiveWork`).
    ///
    /// The guards are the proof of the phase: the gate held exclusively (no fsync or
    /// writeback in flight) and the pass-through semaphore held exclusively (no operation).
    pub(super) fn snapshot(
        &self,
        _gate: &RwLockWriteGuard<'_, ()>,
        _pass: &ExclusiveGuard<'_>,
        clean: bool,
    ) -> Snapshot {
        debug_assert!(
            [Rank::Gate, Rank::PassSem].iter().all(|r| crate::sync::rank::held().contains(r)),
            "the exclusive phase runs under the gate and the pass-through semaphore"
        );
        let mut work = ExclusiveWork { phases: 1, ..Default::default() };
        let (seq, full_stamp) = self.open_snapshot();
        let (inodes, dead) = self.swap_dirty_sets(clean, &mut work);
        let captured = self.capture_all(inodes, seq, &mut work);
        let tail = self.close_snapshot(seq);
        self.ckpt.cp_pauses.record_work(work);
        debug_assert!(
            captured.inodes.windows(2).all(|p| p[0].m.ino < p[1].m.ino),
            "captured in inode order, once each"
        );
        debug_assert!(work.inodes >= (captured.inodes.len() + captured.found_dead.len()) as u64);
        Snapshot {
            seq,
            stamp: full_stamp.ticks,
            full_stamp,
            inodes: captured.inodes,
            deleted: Vec::new(),
            dead,
            found_dead: captured.found_dead,
            orphans: tail.orphans,
            heads: tail.heads,
            held_dirs: captured.held_dirs,
            reserved: tail.reserved,
        }
    }

    /// The phase's first step: the checkpoint's number and stamp, and the segment table's new
    /// epoch (blocks taken from here on belong to the next checkpoint).
    fn open_snapshot(&self) -> (u64, crate::journal::Stamp) {
        let (seq, previous_stamp) = {
            let mut cp = self.ckpt.cp.lock();
            debug_assert_eq!(cp.started, cp.durable, "the checkpoint before this one is durable");
            cp.started += 1;
            (cp.started, cp.snap_stamp)
        };
        let full_stamp = self.clock.now();
        let stamp = full_stamp.ticks;
        // Records stamped up to a snapshot belong to it: a later snapshot must stamp later.
        debug_assert!(stamp > previous_stamp, "snapshot stamps move forward: {previous_stamp} -> {stamp}");
        // From here on, blocks taken belong to the next epoch (`SegmentTable::open_epoch`).
        self.disk.table.open_epoch(seq);
        self.ckpt.cp.lock().snap_stamp = stamp;
        (seq, full_stamp)
    }

    /// The dirty sets and dead lists, swapped out whole; returns the dirty inodes (with the
    /// lazy access times due), sorted and once each, and the dead lists.
    fn swap_dirty_sets(
        &self,
        clean: bool,
        work: &mut ExclusiveWork,
    ) -> (Vec<Arc<MNode>>, Vec<Vec<Arc<MNode>>>) {
        let mut sets = Vec::with_capacity(self.mem.dirty.len());
        for d in self.mem.dirty.iter() {
            sets.push(std::mem::take(&mut *d.lock()));
            work.swaps += 1;
        }
        let mut dead = Vec::with_capacity(self.mem.dead.len());
        for d in self.mem.dead.iter() {
            dead.push(std::mem::take(&mut *d.lock()));
            work.swaps += 1;
        }
        let mut inodes: Vec<Arc<MNode>> = sets.into_iter().flat_map(|s| s.into_values()).collect();
        // Every inode joined a set once since the last snapshot (`Memfs::mark_dirty` counts
        // it); some left for a dead list since. Nothing runs beside the phase, so the sum is
        // exact.
        debug_assert!(
            inodes.len() as u64 <= self.mem.dirty_inodes.sum(),
            "{} dirty inodes, {} joined",
            inodes.len(),
            self.mem.dirty_inodes.sum()
        );
        // Lazy access times go out on unmount, `sync`, or once they are old (`mem::atime`):
        // rare, and kept by number (an inode in no dirty set), so these few are looked up.
        let all_lazy = clean || self.mem.lazy_flush.swap(false, Ordering::AcqRel);
        inodes.extend(self.take_lazy(all_lazy).into_iter().filter_map(|ino| self.mem.cells.get(ino as u64)));
        inodes.sort_unstable_by_key(|m| m.ino);
        inodes.dedup_by_key(|m| m.ino);
        (inodes, dead)
    }

    /// Each dirty inode in turn: captured if live, set aside if found dead.
    fn capture_all(&self, inodes: Vec<Arc<MNode>>, seq: u64, work: &mut ExclusiveWork) -> Captured {
        let mut out = Captured {
            inodes: Vec::with_capacity(inodes.len()),
            // Found dead here rather than buried (recovery's unlinks): few.
            found_dead: Vec::new(),
            held_dirs: Vec::new(),
        };
        for m in inodes {
            work.inodes += 1;
            if m.dead.load(Ordering::Acquire) {
                // Buried before this phase (a lazy atime, or dirtied again while dead): on a
                // dead list taken above.
                continue;
            }
            if let Some(s) = self.capture(m, seq, work, &mut out) {
                debug_assert_eq!(s.m.captured_by.load(Ordering::Acquire), seq, "marked as this checkpoint's");
                out.inodes.push(s);
            }
        }
        debug_assert!(out.inodes.len() + out.found_dead.len() <= work.inodes as usize);
        debug_assert!(out.held_dirs.len() <= out.inodes.len(), "held directories are captured ones");
        out
    }

    /// One live dirty inode's snapshot: attributes, dirty pages, mapping and, for a
    /// directory, its logs and touched names. None if it turns out dead (then in
    /// `out.found_dead`).
    fn capture(
        &self,
        m: Arc<MNode>,
        seq: u64,
        work: &mut ExclusiveWork,
        out: &mut Captured,
    ) -> Option<InodeSnap> {
        // Once per checkpoint: the list it came from holds each inode once.
        debug_assert!(m.captured_by.load(Ordering::Acquire) < seq, "inode {} captured twice", m.ino);
        debug_assert!(!m.dead.load(Ordering::Acquire), "dead inodes are not captured");
        let (meta, xattrs_changed, xattr_names) = {
            let mut meta = m.meta.lock();
            if meta.nlink == 0 && !m.held() {
                // Under the meta lock, as every decision of an inode's life (`mem::ops::life`).
                m.dead.store(true, Ordering::Release);
                self.mem.unorphan(&m);
                drop(meta);
                out.found_dead.push(m);
                return None;
            }
            // Whatever is pending is this checkpoint's now: the xattrs it writes (their
            // blocks no longer owed) and those an fsync would journal.
            self.mem.xattr_settled(&mut meta.xattrs);
            let xattr_names = std::mem::take(&mut meta.xattrs.unjournaled);
            let xattrs_changed = std::mem::take(&mut meta.xattrs.cp_dirty);
            // Cheap: the xattr set is shared, not copied.
            (meta.clone(), xattrs_changed, xattr_names)
        };
        m.in_dirty_set.store(false, Ordering::Release);
        m.captured_by.store(seq, Ordering::Release);
        // The checkpoint makes whatever is pending durable by itself.
        m.attr_dirty.store(false, Ordering::Release);
        m.atime_dirty.store(false, Ordering::Release);
        let pages = m.pages().map(|(p, _)| p.take_dirty()).unwrap_or_default();
        let (map, relocate, unjournaled, truncated_from) = {
            let mut disk = m.disk.lock();
            let truncated_from = disk.truncated_from.take();
            // The count this checkpoint records is the NEW_ADDR entries its trees get:
            // every reserved block is unwritten, and no page written here draws on one.
            debug_assert!(disk.reserved.iter().all(|i| disk.cur_map.get(&i) == Some(&NEW_ADDR)));
            debug_assert!(pages.iter().all(|(i, _)| !disk.reserved.contains(*i)));
            // Shared, not copied (`mem::cowmap`); the unjournaled set is dropped after the
            // phase.
            (
                disk.cur_map.clone(),
                std::mem::take(&mut disk.relocate),
                std::mem::take(&mut disk.unjournaled),
                truncated_from,
            )
        };
        let mut names = Vec::new();
        if let Some(d) = m.dir() {
            // One swap per core and per shard with changes: the records are released once
            // the checkpoint is durable, and the names sorted after the phase.
            work.swaps += d.log.hold_all() as u64;
            out.held_dirs.push(m.clone());
            names = d.map.take_touched();
            work.swaps += names.len() as u64;
        }
        let size = match m.dir() {
            Some(d) => d.map.reported_size(),
            None => m.size.load(Ordering::Acquire),
        };
        let (mtime, ctime, parent) = (m.mtime(), m.ctime(), m.parent.load(Ordering::Acquire));
        let (atime, flags) = (m.atime(), m.iflags());
        Some(InodeSnap {
            m,
            meta,
            size,
            atime,
            mtime,
            ctime,
            flags,
            parent,
            pages,
            map,
            names,
            xattrs_changed,
            relocate,
            unjournaled,
            truncated_from,
            xattr_names,
        })
    }

    /// The phase's last step: the orphan list, the reserved count, the lanes' journal heads
    /// (moved where they must be), the fence, and the counters that start again.
    fn close_snapshot(&self, seq: u64) -> SnapshotTail {
        let orphans = self.mem.orphans.lock().iter().copied().collect();
        let reserved = self.mem.cache.reserved_blocks.load(Ordering::Acquire);
        let moved = self.reanchor_journal_heads();
        let heads: Vec<ChainPos> = self.disk.chains.iter().map(|c| c.lock().pos()).collect();
        debug_assert_eq!(heads.len(), self.disk.lanes.lane_count() as usize, "a journal head per lane");
        // fsyncs wait for this checkpoint, whatever they flush, when a lane's chain left its
        // head behind (a transaction after the new head is out of reach from the last
        // checkpoint's, which recovery reads if this one never lands), or with region journals
        // (emptied once the pack is durable: `Disk::apply_nat`).
        if moved || self.disk.nvm_log.is_some() {
            self.ckpt.cp.lock().fence = seq;
        }
        self.ckpt.requests.journal_blocks.take();
        self.ckpt.requests.logged_ops.take();
        self.ckpt.requests.deleted_inodes.take();
        self.mem.dirty_inodes.take();
        SnapshotTail { orphans, heads, reserved }
    }

    /// Right after the exclusive phase, fsyncs and writeback running again beside it: the
    /// snapshot's work that needs no frozen moment (none of them touches what it changes).
    ///
    /// - Dead inodes: their pending xattr and journal state is dropped and their reservations
    ///   given back, which the reserved count taken in the phase still held. A dead inode has
    ///   no name and no open handle, so nothing changed it since the phase.
    /// - Each captured inode's cleaner moves are checked against its snapshot, and its touched
    ///   names sorted.
    pub(super) fn settle_snapshot(&self, snap: &mut Snapshot) {
        let buried = std::mem::take(&mut snap.dead).into_iter().flatten();
        let mut deleted: Vec<Arc<MNode>> = buried.chain(std::mem::take(&mut snap.found_dead)).collect();
        deleted.sort_unstable_by_key(|m| m.ino);
        for m in &deleted {
            debug_assert!(m.dead.load(Ordering::Acquire));
            {
                let mut meta = m.meta.lock();
                // (A kernel may still hold it: past `Memfs::kernel_may_hold` its references do
                // not keep it.)
                debug_assert!(meta.nlink == 0 && m.open.load(Ordering::Acquire) == 0, "inode {} dead", m.ino);
                self.mem.xattr_settled(&mut meta.xattrs);
                meta.xattrs.unjournaled.clear();
            }
            m.attr_dirty.store(false, Ordering::Release);
            m.atime_dirty.store(false, Ordering::Release);
            let mut disk = m.disk.lock();
            disk.unjournaled.clear();
            disk.truncated_from = None;
            // Its unwritten blocks go with it.
            let gone = disk.reserved.clear();
            debug_assert!(gone <= snap.reserved, "the count held inode {}'s reservations", m.ino);
            snap.reserved = snap.reserved.saturating_sub(gone);
        }
        snap.deleted = deleted;
    }

    /// Each lane's next journal block is reserved ahead of use. If the lane's journal log has
    /// moved on since (other blocks of that log filled the segment), the segment holding the
    /// reserved head can be emptied, freed once a checkpoint is durable and reused by another
    /// log: the lane's next fsync would then write its journal block over live data. So every
    /// checkpoint, before it takes the SIT, moves such a head into the log's current segment
    /// (active segments are never freed), and records that position as the lane's head.
    fn reanchor_journal_heads(&self) -> bool {
        // Only while nothing writes a journal: no fsync (the gate) and no operation.
        debug_assert!(
            [Rank::Gate, Rank::PassSem].iter().all(|r| crate::sync::rank::held().contains(r)),
            "journal heads move only in the exclusive phase"
        );
        let cursors = self.disk.lanes.cursors();
        debug_assert_eq!(cursors.len(), self.disk.chains.len(), "cursors and chains, one per lane");
        let mtime = self.disk.elapsed_secs();
        let mut moved = false;
        for (l, chain) in self.disk.chains.iter().enumerate() {
            let mut chain = chain.lock();
            let (addr, _) = chain.position();
            // Recovery from this checkpoint starts reading there: the head's segment must
            // outlive it (`SegmentTable::touch`).
            self.disk.table.touch(addr as u64);
            let active = cursors[l][JOURNAL_LOG as usize].segno;
            if self.disk.g.seg_of(addr as u64).map(|(s, _)| s) == Some(active) {
                continue;
            }
            let owner = SummaryEntry { kind: SummaryKind::Journal, nid: l as u32, ofs: 0 };
            match self.disk.lanes.reserve(l as u32, JOURNAL_LOG, owner, mtime) {
                Ok(head) => {
                    chain.restart_at(head as u32);
                    moved = true;
                }
                // No block free for it: the head stays (the allocation of the next fsync's
                // blocks would fail the same way).
                Err(e) => tracing::warn!("lanefs: lane {l}: journal head not moved: {e}"),
            }
        }
        moved
    }
}
