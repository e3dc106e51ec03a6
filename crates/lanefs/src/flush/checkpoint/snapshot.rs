//! The exclusive phase of a checkpoint (step 2 of `flush::checkpoint`), the captures of the
//! inodes it leaves owed, and the settling right after it.
//!
//! Invariants: the phase runs with the gate and the pass-through semaphore both held
//! exclusively (`Engine::snapshot` takes their guards as proof), so no operation, fsync or
//! writeback runs beside it. It does no I/O and no work per inode, dead or alive, per
//! directory record or per touched name: dirty sets and dead lists are swapped out whole, and
//! the epoch moves (`Memfs::epoch`), which makes every inode of the swapped sets *owed* to this
//! checkpoint in one store. An owed inode is captured once, after the phase, by whoever touches
//! it first: an operation, fsync or writeback that would change it (`Engine::capture_if_owed`,
//! before the change), or the checkpoint's writer, which captures the rest in inode order
//! (`Engine::capture_rest`). Until its capture nothing changes it, so every capture is the
//! inode as the phase left it, and the checkpoint's picture is one instant, as if the phase had
//! taken them all. Debug builds check that: the phase records each owed inode
//! (`Fingerprint`) and its capture must find it unchanged. What needs no frozen moment
//! (`settle_snapshot`) runs after every capture.
//!
//! Why capture late (issue 18): capturing each live dirty inode in the phase cost about
//! 0.3-1 µs an inode while every operation waited, so the phase grew with the number of dirty
//! inodes (a mail spool's 800: about 1 ms; 10,000 files untarred: several). Now it is the same
//! with 10 dirty inodes as with 10,000; each inode's capture costs its first toucher what it
//! cost the phase.

use super::pauses::ExclusiveWork;
use crate::engine::{Engine, JOURNAL_LOG};
use crate::format::node::NEW_ADDR;
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::journal::ChainPos;
use crate::mem::cowmap::CowMap;
use crate::mem::dir::Touched;
use crate::mem::mnode::{MNode, Meta, CAPTURING};
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
    /// The per-CPU dirty sets, swapped out whole: the inodes owed to this checkpoint, each
    /// captured by its first toucher or by `capture_rest`.
    pub(super) owed: Vec<std::collections::HashMap<u32, Arc<MNode>>>,
    /// Inodes with a lazy access time due, in no dirty set: owed too (marked in the phase).
    pub(super) owed_lazy: Vec<Arc<MNode>>,
    /// Debug builds: the owed inodes as the phase left them (`Installs::seen`).
    #[cfg(debug_assertions)]
    pub(super) seen: std::collections::HashMap<u32, Fingerprint>,
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

/// What one capture found: the inode's snapshot, or that it is dead and no one buried it.
/// (Not boxed: it is moved once, straight into the install queue, and a box would cost an
/// allocation per capture.)
#[allow(clippy::large_enum_variant)]
enum Capture {
    Live(InodeSnap),
    Dead(Arc<MNode>),
}

/// Debug builds: what a capture reads of an owed inode, as the exclusive phase saw it. A
/// capture that finds any of it changed took the inode after a change that should have
/// captured it first.
#[cfg(debug_assertions)]
#[derive(Debug, PartialEq)]
pub(super) struct Fingerprint {
    meta: Meta,
    size: u64,
    times: [i64; 3],
    flags: u32,
    parent: u32,
    open: u32,
    lookups: u64,
    dead: bool,
    marks: [bool; 2],
    pages: [u64; 2],
    disk: [u64; 4],
    truncated_from: Option<u64>,
    dir: Option<(u64, u64)>,
}

#[cfg(debug_assertions)]
impl Fingerprint {
    pub(super) fn of(m: &MNode) -> Fingerprint {
        let meta = m.meta.lock().clone();
        let pages = m.pages().map_or([0, 0], |(p, _)| [p.dirty_count(), p.logged_count()]);
        let (disk, truncated_from) = {
            let d = m.disk.lock();
            let disk = [
                d.cur_map.len() as u64,
                d.relocate.len() as u64,
                d.unjournaled.len() as u64,
                d.reserved.len(),
            ];
            (disk, d.truncated_from)
        };
        Fingerprint {
            meta,
            size: m.size.load(Ordering::Acquire),
            times: [
                m.atime.load(Ordering::Acquire),
                m.mtime.load(Ordering::Acquire),
                m.ctime.load(Ordering::Acquire),
            ],
            flags: m.flags.load(Ordering::Acquire),
            parent: m.parent.load(Ordering::Acquire),
            open: m.open.load(Ordering::Acquire),
            lookups: m.lookups.load(Ordering::Acquire),
            dead: m.dead.load(Ordering::Acquire),
            marks: [m.attr_dirty.load(Ordering::Acquire), m.atime_dirty.load(Ordering::Acquire)],
            pages,
            disk,
            truncated_from,
            dir: m.dir().map(|d| (d.map.len(), d.log.unjournaled().len() as u64)),
        }
    }
}

/// What the phase takes after the inodes (`close_snapshot`).
struct SnapshotTail {
    orphans: Vec<u32>,
    heads: Vec<ChainPos>,
    reserved: u64,
}

impl Engine {
    /// The exclusive phase (every operation drained): what the checkpoint must take at this
    /// instant, and nothing it can take after. Dirty sets and dead lists are swapped out whole
    /// and the epoch moves on, which leaves every inode of the swapped sets owed to this
    /// checkpoint (captured later, each before its first change: `capture_if_owed`); dead
    /// inodes are not visited at all (`Memfs::bury` took them out of the dirty set). The work
    /// done per item is counted in `cp_pauses` (`ExclusiveWork`): per CPU, and per lazy access
    /// time due, never per dirty inode.
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
        let (owed, owed_lazy, dead) = self.swap_dirty_sets(seq, clean, &mut work);
        // The epoch moves last in the phase, once the install queue is open
        // (`Engine::checkpoint`): an inode of the swapped sets is owed from then on.
        #[cfg(debug_assertions)]
        let seen = owed
            .iter()
            .flat_map(|set| set.values())
            .chain(&owed_lazy)
            .map(|m| (m.ino, Fingerprint::of(m)))
            .collect::<std::collections::HashMap<_, _>>();
        let tail = self.close_snapshot(seq);
        self.ckpt.cp_pauses.record_work(work);
        debug_assert_eq!(work.inodes, owed_lazy.len() as u64, "the phase visits lazy access times only");
        Snapshot {
            seq,
            stamp: full_stamp.ticks,
            full_stamp,
            owed,
            owed_lazy,
            #[cfg(debug_assertions)]
            seen,
            deleted: Vec::new(),
            dead,
            found_dead: Vec::new(),
            orphans: tail.orphans,
            heads: tail.heads,
            held_dirs: Vec::new(),
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
        // Inodes changed since the last snapshot joined this checkpoint's dirty sets.
        debug_assert_eq!(self.mem.epoch.load(Ordering::Acquire), seq, "the epoch is this checkpoint's");
        let full_stamp = self.clock.now();
        let stamp = full_stamp.ticks;
        // Records stamped up to a snapshot belong to it: a later snapshot must stamp later.
        debug_assert!(stamp > previous_stamp, "snapshot stamps move forward: {previous_stamp} -> {stamp}");
        // From here on, blocks taken belong to the next epoch (`SegmentTable::open_epoch`).
        self.disk.table.open_epoch(seq);
        self.ckpt.cp.lock().snap_stamp = stamp;
        (seq, full_stamp)
    }

    /// The dirty sets and dead lists, swapped out whole, and the inodes with a lazy access
    /// time due (rare, and kept by number: an inode in no dirty set), made owed to checkpoint
    /// `seq` one by one.
    #[allow(clippy::type_complexity)]
    fn swap_dirty_sets(
        &self,
        seq: u64,
        clean: bool,
        work: &mut ExclusiveWork,
    ) -> (Vec<std::collections::HashMap<u32, Arc<MNode>>>, Vec<Arc<MNode>>, Vec<Vec<Arc<MNode>>>) {
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
        // Every inode joined a set once since the last snapshot (`Memfs::mark_dirty` counts
        // it); some left for a dead list since. Nothing runs beside the phase, so the sum is
        // exact.
        debug_assert!(
            sets.iter().map(|s| s.len() as u64).sum::<u64>() <= self.mem.dirty_inodes.sum(),
            "more dirty inodes than joined: {}",
            self.mem.dirty_inodes.sum()
        );
        // Lazy access times go out on unmount, `sync`, or once they are old (`mem::atime`).
        let all_lazy = clean || self.mem.lazy_flush.swap(false, Ordering::AcqRel);
        let mut lazy = Vec::new();
        for ino in self.take_lazy(all_lazy) {
            let Some(m) = self.mem.cells.get(ino as u64) else { continue };
            // One already in a set is owed already; a dead one is on a dead list.
            if !m.dead.load(Ordering::Acquire)
                && m.dirty_epoch.compare_exchange(0, seq, Ordering::AcqRel, Ordering::Acquire).is_ok()
            {
                lazy.push(m);
            }
        }
        work.inodes += lazy.len() as u64;
        (sets, lazy, dead)
    }

    /// Captures `m` first if it is still owed to the checkpoint in progress: what every
    /// operation (under the pass-through semaphore), fsync and writeback (under the gate) does
    /// to an inode before it changes it. Two loads when it is not owed (every inode but those
    /// the last snapshot left dirty, until each is touched once); waits while another thread
    /// captures it.
    #[inline]
    pub(crate) fn capture_if_owed(&self, m: &Arc<MNode>) {
        let cur = self.mem.epoch.load(Ordering::Acquire);
        let e = m.dirty_epoch.load(Ordering::Acquire);
        if e == 0 || e == cur {
            return;
        }
        self.capture_owed(m);
    }

    #[cold]
    #[inline(never)]
    fn capture_owed(&self, m: &Arc<MNode>) {
        // A thread waiting here for another's capture holds nothing the capture takes: only
        // the gate, the semaphore and the locks ranked before them, and the rename lock.
        debug_assert!(
            crate::sync::rank::held().iter().all(|r| *r <= Rank::Rename),
            "inode {} captured holding {:?}",
            m.ino,
            crate::sync::rank::held()
        );
        // Bounded: a capture ends, and the inode is owed to one checkpoint at most.
        let mut spins = 0u64;
        loop {
            // The epoch first: the caller may hold neither the semaphore nor the gate (an fsync
            // looking its inode up), so a phase may end between the two loads, and a mark newer
            // than the epoch read is then a reason to read again, not an owed inode.
            let cur = self.mem.epoch.load(Ordering::Acquire);
            let e = m.dirty_epoch.load(Ordering::Acquire);
            if e == 0 || e == cur {
                return;
            }
            if e == CAPTURING {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    // The capturer may be preempted: give it the CPU.
                    std::thread::yield_now();
                }
                continue;
            }
            if e > cur {
                continue;
            }
            if m.dead.load(Ordering::Acquire) {
                // Dead before the phase, on a dead list it took: nothing to capture. Its mark
                // may be older than the last checkpoint (`Memfs::bury` leaves it, and a dead
                // inode is in no set), or it was dirtied again while dead (a lazy access time).
                if m.dirty_epoch.compare_exchange(e, 0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    #[cfg(debug_assertions)]
                    self.ckpt.cp.lock().installs.seen.remove(&m.ino);
                    return;
                }
                continue;
            }
            // Each checkpoint captures all it is owed before the next one starts.
            debug_assert_eq!(e + 1, cur, "inode {} owed to checkpoint {e}, not the one in progress", m.ino);
            if m.dirty_epoch.compare_exchange(e, CAPTURING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.capture_claimed(m, e);
                m.dirty_epoch.store(0, Ordering::Release);
                return;
            }
        }
    }

    /// The capture of owed inode `m`, which this thread claimed: its snapshot goes to the
    /// install queue (or it is dead, for the checkpoint to delete).
    fn capture_claimed(&self, m: &Arc<MNode>, seq: u64) {
        debug_assert!(!m.dead.load(Ordering::Acquire), "dead inodes are not captured");
        #[cfg(debug_assertions)]
        {
            let now = Fingerprint::of(m);
            let seen = self.ckpt.cp.lock().installs.seen.remove(&m.ino);
            debug_assert_eq!(seen.as_ref(), Some(&now), "inode {} changed before its capture", m.ino);
        }
        let captured = self.capture(m.clone(), seq);
        let mut cp = self.ckpt.cp.lock();
        match captured {
            Capture::Live(s) => {
                if s.m.is_dir() {
                    cp.installs.held_dirs.push(s.m.clone());
                }
                let helpable = self.bridges(&s.m);
                cp.installs.add(s, helpable);
            }
            Capture::Dead(m) => cp.installs.found_dead.push(m),
        }
    }

    /// The checkpoint's writer, right after the phase: captures every owed inode no one has
    /// touched yet, in inode order, and takes from the install queue what the captures found
    /// (dead inodes, held directories). From here on nothing is owed to this checkpoint.
    pub(super) fn capture_rest(&self, snap: &mut Snapshot) {
        let mut owed: Vec<Arc<MNode>> =
            std::mem::take(&mut snap.owed).into_iter().flat_map(|s| s.into_values()).collect();
        owed.append(&mut snap.owed_lazy);
        owed.sort_unstable_by_key(|m| m.ino);
        // An inode joins a dirty set once per checkpoint (`MNode::dirty_epoch`).
        debug_assert!(owed.windows(2).all(|p| p[0].ino < p[1].ino), "owed once each");
        for m in &owed {
            self.capture_if_owed(m);
        }
        debug_assert!(
            owed.iter().all(|m| {
                let e = m.dirty_epoch.load(Ordering::Acquire);
                e != snap.seq && e != CAPTURING
            }),
            "every owed inode captured"
        );
        let mut cp = self.ckpt.cp.lock();
        #[cfg(debug_assertions)]
        debug_assert!(cp.installs.seen.is_empty(), "{} owed inodes never captured", cp.installs.seen.len());
        snap.found_dead = std::mem::take(&mut cp.installs.found_dead);
        snap.held_dirs = std::mem::take(&mut cp.installs.held_dirs);
        drop(cp);
        // The orphan list was taken in the phase; an inode found dead since (no name, nothing
        // holding it) is deleted by this checkpoint, not left to recovery.
        if !snap.found_dead.is_empty() {
            let dead: std::collections::HashSet<u32> = snap.found_dead.iter().map(|m| m.ino).collect();
            snap.orphans.retain(|o| !dead.contains(o));
        }
        debug_assert!(snap.held_dirs.iter().all(|d| d.is_dir()), "held directories are directories");
    }

    /// One owed inode's snapshot: attributes, dirty pages, mapping and, for a directory, its
    /// logs and touched names; or that it is dead. The caller claimed it (`capture_owed`), so
    /// nothing changes it meanwhile.
    fn capture(&self, m: Arc<MNode>, seq: u64) -> Capture {
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
                return Capture::Dead(m);
            }
            // Whatever is pending is this checkpoint's now: the xattrs it writes (their
            // blocks no longer owed) and those an fsync would journal.
            self.mem.xattr_settled(&mut meta.xattrs);
            let xattr_names = std::mem::take(&mut meta.xattrs.unjournaled);
            let xattrs_changed = std::mem::take(&mut meta.xattrs.cp_dirty);
            // Cheap: the xattr set is shared, not copied.
            (meta.clone(), xattrs_changed, xattr_names)
        };
        debug_assert_eq!(m.dirty_epoch.load(Ordering::Acquire), CAPTURING, "claimed by this thread");
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
            d.log.hold_all();
            names = d.map.take_touched();
        }
        let size = match m.dir() {
            Some(d) => d.map.reported_size(),
            None => m.size.load(Ordering::Acquire),
        };
        let (mtime, ctime, parent) = (m.mtime(), m.ctime(), m.parent.load(Ordering::Acquire));
        let (atime, flags) = (m.atime(), m.iflags());
        Capture::Live(InodeSnap {
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
