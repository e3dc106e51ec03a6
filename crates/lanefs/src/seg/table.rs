//! The segment table: per-segment validity (the in-memory SIT) and the global free map.

use crate::error::{Error, Result};
use crate::format::layout::{Geometry, LogType, SegNo, BLOCKS_PER_SEG, SIT_ENTRIES_PER_BLOCK};
use crate::format::sit::{SitBlock, SitEntry, NO_LOG};
use crate::sync::rank::{Mutex, Rank};
use crate::sync::PerCpuCounter;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most segments one [`SegmentTable::checkpoint_done`] discards (bounds the time it holds
/// them out of the free map; 128 MiB).
pub const DISCARD_PER_ROUND: usize = 64;
/// Below this many segments in the free map nothing is discarded: space is short, and a
/// segment being discarded is out of every lane's reach.
pub const DISCARD_MIN_FREE: usize = 16;
// Block offsets travel as u16 (young offsets, log cursors, valid counts): a segment's fit.
const _: () = assert!(BLOCKS_PER_SEG <= u16::MAX as u32, "segment offsets fit a u16");

/// Lifecycle state of a main-area segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegState {
    /// Holds no valid block; can be allocated.
    Free,
    /// Open: a log is appending to it.
    Active {
        /// The lane whose log writes it.
        lane: u32,
        /// Which of the lane's logs.
        log: LogType,
    },
    /// Written and closed; holds valid blocks (a cleaning candidate).
    Dirty,
    /// Emptied since the last checkpoint: reusable once the next one is durable.
    Prefree,
}

struct Segment {
    entry: SitEntry,
    state: SegState,
    /// The checkpoint epoch (see [`SegmentTable::open_epoch`]) of the last block taken from
    /// this segment, or of a journal head placed in it: emptied, it may be freed only by a
    /// checkpoint whose snapshot came after that.
    touched: u64,
    /// Offsets of blocks the foreground (fsync, writeback) made valid after the snapshot of
    /// checkpoint `young_epoch`, while that checkpoint was being written: not in its SIT.
    young: Vec<u16>,
    young_epoch: u64,
}

/// Validity and state of every main segment.
pub struct SegmentTable {
    geometry: Geometry,
    segs: Vec<Mutex<Segment>>,
    /// One bit per SIT block changed since the last checkpoint.
    dirty_sit: Vec<AtomicU64>,
    free: Mutex<FreeMap>,
    /// Free segments, and prefree plus committing ones (free after the next checkpoints),
    /// published after every change so admission checks read a word, not the map's lock.
    free_now: AtomicU64,
    pending: AtomicU64,
    /// Free segments held in lanes' caches (free, but not in the map).
    cached: AtomicU64,
    /// Valid blocks: the count at mount plus blocks made valid minus blocks made invalid since,
    /// kept per CPU so the write path never shares a line (summed only when space is short).
    valid_base: u64,
    validated: PerCpuCounter,
    invalidated: PerCpuCounter,
    /// The number of the checkpoint whose snapshot was taken last (0: none since mount).
    epoch: AtomicU64,
    /// Between a checkpoint's snapshot and its taking of the SIT: foreground validations are
    /// noted as young (left out of that SIT).
    recording: std::sync::atomic::AtomicBool,
}

/// The SIT a checkpoint writes ([`SegmentTable::take_checkpoint_sit`]).
pub struct CheckpointSit {
    /// The SIT blocks changed since the last checkpoint, with their indexes.
    pub blocks: Vec<(u32, SitBlock)>,
    /// Valid blocks in the checkpoint's picture (young blocks left out).
    pub valid: u64,
}

/// How the cleaner ranks victims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VictimPolicy {
    /// Fewest valid blocks first: the most space for the least copying, now (foreground).
    Greedy,
    /// Benefit over cost, `(1 - u) * age / (1 + u)` (Rosenblum and Ousterhout): old, mostly
    /// empty segments first, so cold data is not copied again and again (background).
    CostBenefit {
        /// The current age stamp, against which segment ages are taken.
        now: u64,
    },
}

/// A segment the cleaner may empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    /// The segment's number.
    pub segno: SegNo,
    /// Its valid blocks when picked.
    pub valid_blocks: u16,
    /// Offsets of the valid blocks at selection time.
    pub valid: Vec<u32>,
}

struct FreeMap {
    /// Free segments, kept in ascending order of number so allocation stays near the front.
    free: std::collections::BTreeSet<SegNo>,
    /// Emptied since the SIT was last taken for a checkpoint: reusable once the checkpoint
    /// after that one is durable.
    prefree: Vec<SegNo>,
    /// Emptied before the SIT of the checkpoint being written was taken: reusable once that
    /// checkpoint is durable. (A segment emptied while a checkpoint is being written may still
    /// be referenced by it, so it waits one checkpoint more.)
    committing: Vec<SegNo>,
    /// Segments freed without a discard: segment -> the `checkpoint_done` round that freed it.
    /// Discarded by a later round if still free then (see [`SegmentTable::checkpoint_done`]).
    /// At most one entry per segment.
    undiscarded: std::collections::BTreeMap<SegNo, u64>,
    /// `checkpoint_done` rounds so far.
    rounds: u64,
}

impl SegmentTable {
    /// Builds the table from decoded SIT entries (one per main segment, in order) and the
    /// segments the checkpoint names as active.
    pub fn new(g: Geometry, entries: Vec<SitEntry>, active: &[(SegNo, u32, LogType)]) -> Result<Self> {
        if entries.len() != g.main_segments as usize {
            return Err(Error::InvalidArgument("SIT entry count differs from main segments".into()));
        }
        let mut segs: Vec<Segment> = entries
            .into_iter()
            .map(|entry| {
                let state = if entry.valid_blocks == 0 { SegState::Free } else { SegState::Dirty };
                Segment { entry, state, touched: 0, young: Vec::new(), young_epoch: 0 }
            })
            .collect();
        for &(segno, lane, log) in active {
            let s = segs
                .get_mut(segno.index())
                .ok_or_else(|| Error::InvalidArgument(format!("active segment {segno} out of range")))?;
            if matches!(s.state, SegState::Active { .. }) {
                return Err(Error::InvalidArgument(format!("segment {segno} active in two logs")));
            }
            s.state = SegState::Active { lane, log };
        }
        let free =
            g.segments().zip(&segs).filter(|(_, s)| s.state == SegState::Free).map(|(n, _)| n).collect();
        let sit_words = (g.sit_blocks as usize).div_ceil(64);
        let valid_base = segs.iter().map(|s| s.entry.valid_blocks as u64).sum();
        // Decoded counts equal their bitmaps'; the geometry's SIT covers every segment.
        debug_assert!(valid_base <= g.main_blocks(), "{valid_base} valid blocks in the main area");
        debug_assert!(g.sit_blocks * SIT_ENTRIES_PER_BLOCK >= g.main_segments, "a SIT too small");
        Ok(SegmentTable {
            geometry: g,
            segs: segs.into_iter().map(|s| Mutex::new(Rank::Segment, s)).collect(),
            dirty_sit: (0..sit_words).map(|_| AtomicU64::new(0)).collect(),
            free: Mutex::new(
                Rank::FreeMap,
                FreeMap {
                    free,
                    prefree: Vec::new(),
                    committing: Vec::new(),
                    undiscarded: Default::default(),
                    rounds: 0,
                },
            ),
            free_now: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            valid_base,
            validated: PerCpuCounter::new(),
            invalidated: PerCpuCounter::new(),
            epoch: AtomicU64::new(0),
            recording: std::sync::atomic::AtomicBool::new(false),
        })
        .inspect(|t| t.publish(&t.free.lock()))
    }

    /// The image's geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn publish(&self, fm: &FreeMap) {
        // A segment is in at most one of the free map, the prefree list and the committing one.
        let listed = fm.free.len() + fm.prefree.len() + fm.committing.len();
        debug_assert!(listed <= self.segs.len(), "{listed} segments listed free or prefree");
        self.free_now.store(fm.free.len() as u64, Ordering::Release);
        self.pending.store((fm.prefree.len() + fm.committing.len()) as u64, Ordering::Release);
    }

    /// Segments free now, in the map or in lanes' caches (no lock).
    pub fn free_segments(&self) -> u64 {
        self.free_now.load(Ordering::Acquire) + self.cached.load(Ordering::Acquire)
    }

    /// Valid blocks in the main area (a sum over CPUs: exact when nothing is changing).
    ///
    /// While blocks come and go, the invalidations are summed first: a block's validation comes
    /// before its invalidation, so the later sum of validations holds every one whose
    /// invalidation was counted, and the result is at worst above the truth by what was
    /// validated meanwhile (admission errs towards caution), never below it. Summed the other
    /// way round, a block validated and invalidated between the two sums was subtracted
    /// without being added, and a freshly formatted image's count wrapped to near 2^64 (an
    /// overflow panic in `Engine::space_left`, found by gc.rs's truncate race test).
    pub fn valid_count(&self) -> u64 {
        let invalidated = self.invalidated.sum();
        (self.valid_base + self.validated.sum()).saturating_sub(invalidated)
    }

    /// Segments that become free once the next checkpoints are durable (no lock).
    pub fn pending_segments(&self) -> u64 {
        self.pending.load(Ordering::Acquire)
    }

    fn mark_sit_dirty(&self, segno: SegNo) {
        let blk = SitBlock::locate(segno).0 as usize;
        debug_assert!(blk < self.geometry.sit_blocks as usize, "segment {segno} in SIT block {blk}");
        self.dirty_sit[blk / 64].fetch_or(1 << (blk % 64), Ordering::Relaxed);
    }

    fn seg(&self, segno: SegNo) -> &Mutex<Segment> {
        debug_assert!(self.geometry.has_segment(segno), "segment {segno} of {}", self.geometry.main_segments);
        &self.segs[segno.index()]
    }

    /// The segment's state.
    pub fn state(&self, segno: SegNo) -> SegState {
        self.seg(segno).lock().state
    }

    /// The segment's valid blocks.
    pub fn valid_blocks(&self, segno: SegNo) -> u16 {
        self.seg(segno).lock().entry.valid_blocks
    }

    /// Whether block `addr` of the main area holds live data.
    pub fn is_valid(&self, addr: u64) -> bool {
        match self.geometry.seg_of(addr) {
            Some((s, off)) => self.seg(s).lock().entry.is_valid(off),
            None => false,
        }
    }

    /// Marks a newly written block valid. The segment must be active.
    pub fn validate(&self, addr: u64, mtime: u64) -> Result<()> {
        self.mark_valid(addr, mtime, false)
    }

    /// Marks a block the foreground (fsync, writeback) wrote valid. While a checkpoint is
    /// between its snapshot and its taking of the SIT, the block is young: left out of the SIT
    /// that checkpoint writes, whose trees cannot name it (recovery claims it again if a
    /// journal record after that checkpoint's stamp maps it).
    pub fn validate_young(&self, addr: u64, mtime: u64) -> Result<()> {
        self.mark_valid(addr, mtime, true)
    }

    fn mark_valid(&self, addr: u64, mtime: u64, young: bool) -> Result<()> {
        let (s, off) = self
            .geometry
            .seg_of(addr)
            .ok_or_else(|| Error::InvalidArgument(format!("block {addr} outside the main area")))?;
        let epoch = self.epoch.load(Ordering::Acquire);
        let mut seg = self.seg(s).lock();
        debug_assert!(matches!(seg.state, SegState::Active { .. }), "write into non-active segment {s}");
        if !seg.entry.set_valid(off) {
            return Err(Error::InvalidArgument(format!("block {addr} written twice")));
        }
        // The count follows the bitmap: a block made valid is one of the segment's.
        debug_assert!(seg.entry.valid_blocks as u32 <= BLOCKS_PER_SEG, "segment {s} over full");
        seg.entry.mtime = seg.entry.mtime.max(mtime);
        seg.touched = seg.touched.max(epoch);
        if young && self.recording.load(Ordering::Acquire) {
            if seg.young_epoch != epoch {
                seg.young.clear();
                seg.young_epoch = epoch;
            }
            seg.young.push(off as u16);
        }
        drop(seg);
        self.validated.add(1);
        self.mark_sit_dirty(s);
        Ok(())
    }

    /// Notes that block `addr` was taken now without being made valid (a journal block), or
    /// holds a lane's journal head at a checkpoint's snapshot: its segment, once empty, waits
    /// for a checkpoint whose snapshot comes after this moment (recovery from the checkpoint
    /// being written reads it).
    pub fn touch(&self, addr: u64) {
        if let Some((s, _)) = self.geometry.seg_of(addr) {
            let epoch = self.epoch.load(Ordering::Acquire);
            let mut seg = self.seg(s).lock();
            seg.touched = seg.touched.max(epoch);
        }
    }

    /// A checkpoint (number `n`, counted from 1 since mount) takes its snapshot: what is
    /// taken from segments from now on belongs to the next epoch, and foreground validations
    /// are young until [`SegmentTable::take_checkpoint_sit`]. Called in the exclusive phase,
    /// with fsync and writeback held out.
    pub fn open_epoch(&self, n: u64) {
        debug_assert!(n > self.epoch.load(Ordering::Acquire), "epochs only grow");
        self.epoch.store(n, Ordering::Release);
        self.recording.store(true, Ordering::Release);
    }

    /// Marks a block dead (its owner was overwritten or deleted). A full segment whose last
    /// valid block dies becomes prefree.
    pub fn invalidate(&self, addr: u64) -> Result<()> {
        let (s, off) = self
            .geometry
            .seg_of(addr)
            .ok_or_else(|| Error::InvalidArgument(format!("block {addr} outside the main area")))?;
        let mut seg = self.seg(s).lock();
        if !seg.entry.clear_valid(off) {
            return Err(Error::InvalidArgument(format!("block {addr} invalidated twice")));
        }
        // It held a valid block: only an active or a dirty segment does (`check_invariants`).
        debug_assert!(
            matches!(seg.state, SegState::Active { .. } | SegState::Dirty),
            "in {:?} {s}",
            seg.state
        );
        self.invalidated.add(1);
        let emptied = seg.entry.valid_blocks == 0 && seg.state == SegState::Dirty;
        if emptied {
            seg.state = SegState::Prefree;
        }
        drop(seg);
        self.mark_sit_dirty(s);
        if emptied {
            let mut fm = self.free.lock();
            // It was dirty until just now: in no list yet, so it is listed once.
            debug_assert!(!fm.prefree.contains(&s) && !fm.free.contains(&s), "segment {s} listed twice");
            fm.prefree.push(s);
            self.publish(&fm);
        }
        Ok(())
    }

    /// Takes up to `n` free segments for `lane`'s cache. They stay `Free` until activated.
    pub fn take_free(&self, n: usize) -> Vec<SegNo> {
        let mut fm = self.free.lock();
        let mut out = Vec::with_capacity(n);
        // Bounded by `n` and by the free map, each round taking one segment out of it.
        while out.len() < n {
            match fm.free.pop_first() {
                Some(s) => out.push(s),
                None => break,
            }
        }
        // The free map holds free segments only (segments rank below the map: sync::rank).
        debug_assert!(
            out.iter().all(|&s| self.seg(s).lock().state == SegState::Free),
            "in the map, not free"
        );
        self.cached.fetch_add(out.len() as u64, Ordering::AcqRel);
        self.publish(&fm);
        out
    }

    /// Gives cached free segments back (a lane shutting down).
    pub fn return_free(&self, segs: &[SegNo]) {
        let mut fm = self.free.lock();
        for &s in segs {
            debug_assert_eq!(self.state(s), SegState::Free);
            fm.free.insert(s);
        }
        self.cached.fetch_sub(segs.len() as u64, Ordering::AcqRel);
        self.publish(&fm);
    }

    /// Makes segment `segno`, taken from a lane's cache, the active segment of a lane's log.
    pub fn activate_cached(&self, segno: SegNo, lane: u32, log: LogType, mtime: u64) {
        self.cached.fetch_sub(1, Ordering::AcqRel);
        self.activate(segno, lane, log, mtime);
    }

    /// Makes free segment `segno` the active segment of a lane's log.
    fn activate(&self, segno: SegNo, lane: u32, log: LogType, mtime: u64) {
        let mut seg = self.seg(segno).lock();
        assert_eq!(seg.state, SegState::Free, "activating segment {segno} that is not free");
        assert_eq!(seg.entry.valid_blocks, 0);
        seg.state = SegState::Active { lane, log };
        seg.entry.log_type = log as u8;
        seg.entry.mtime = mtime;
        drop(seg);
        self.mark_sit_dirty(segno);
    }

    /// Recovery: block `addr`, written after the checkpoint and installed by a replayed journal
    /// record, is live. Its segment leaves the free and prefree lists if it was there.
    pub fn claim_valid(&self, addr: u64, mtime: u64) -> Result<()> {
        let (s, off) = self
            .geometry
            .seg_of(addr)
            .ok_or_else(|| Error::InvalidArgument(format!("block {addr} outside the main area")))?;
        // The free map ranks above a segment (sync::rank), so it comes first; this runs once
        // per replayed block, at mount.
        let mut fm = self.free.lock();
        let mut seg = self.seg(s).lock();
        if matches!(seg.state, SegState::Free | SegState::Prefree) {
            fm.free.remove(&s);
            fm.prefree.retain(|&p| p != s);
            fm.committing.retain(|&p| p != s);
            self.publish(&fm);
            seg.state = SegState::Dirty;
        }
        // Active or dirty now, so never handed out again while the block installed lives.
        debug_assert!(!fm.free.contains(&s), "claimed segment {s} still in the free map");
        drop(fm);
        if seg.entry.set_valid(off) {
            self.validated.add(1);
        }
        seg.entry.mtime = seg.entry.mtime.max(mtime);
        drop(seg);
        self.mark_sit_dirty(s);
        Ok(())
    }

    /// Recovery: segment `segno` holds journal blocks that must survive until the next
    /// checkpoint is durable. A free one becomes prefree (reusable after that checkpoint).
    pub fn claim_for_journal(&self, segno: SegNo) -> Result<()> {
        if !self.geometry.has_segment(segno) {
            return Err(Error::InvalidArgument(format!("segment {segno} out of range")));
        }
        // The free map ranks above a segment (sync::rank), so it comes first; this runs once
        // per journal segment at mount.
        let mut fm = self.free.lock();
        let mut seg = self.seg(segno).lock();
        if seg.state == SegState::Free {
            fm.free.remove(&segno);
            // Free until now: in none of the prefree lists, so it enters one once.
            debug_assert!(!fm.prefree.contains(&segno) && !fm.committing.contains(&segno), "listed twice");
            fm.prefree.push(segno);
            self.publish(&fm);
            seg.state = SegState::Prefree;
        }
        // Whatever its state, out of the free map now: no lane takes it before a checkpoint.
        assert!(!fm.free.contains(&segno), "journal segment {segno} still in the free map");
        Ok(())
    }

    /// Takes a specific free segment out of the free map and activates it (mkfs, recovery).
    pub fn activate_free(&self, segno: SegNo, lane: u32, log: LogType, mtime: u64) -> Result<()> {
        {
            let mut fm = self.free.lock();
            if !self.geometry.has_segment(segno) || !fm.free.remove(&segno) {
                return Err(Error::InvalidArgument(format!("segment {segno} is not free")));
            }
            self.publish(&fm);
        }
        self.activate(segno, lane, log, mtime);
        Ok(())
    }

    /// A log filled `segno`: it becomes dirty (or prefree if nothing in it is still valid).
    pub fn close(&self, segno: SegNo) {
        let mut seg = self.seg(segno).lock();
        assert!(matches!(seg.state, SegState::Active { .. }), "closing inactive segment {segno}");
        if seg.entry.valid_blocks == 0 {
            seg.state = SegState::Prefree;
            drop(seg);
            let mut fm = self.free.lock();
            // Active until now: in no list yet, so it is listed once.
            debug_assert!(!fm.prefree.contains(&segno) && !fm.free.contains(&segno), "listed twice");
            fm.prefree.push(segno);
            self.publish(&fm);
        } else {
            seg.state = SegState::Dirty;
        }
    }

    /// Called once a checkpoint is durable: segments emptied before its SIT was taken become
    /// free. Returns how many did.
    ///
    /// Discard is lazy. A segment freed now is reused soon (allocation takes the lowest free
    /// segment first), and discarding it first costs twice: the device (or the file system
    /// under an image file) drops the blocks, then must allocate them again for the next
    /// write, and a hole punched in an image file holds the file's lock against every write
    /// meanwhile. So a freed segment is only noted, and `discard` sees it in a later round if
    /// it is still free then: at most [`DISCARD_PER_ROUND`] segments a round, each taken out of
    /// the free map while it is discarded (TRIM: a discard racing with a new write into the
    /// segment would destroy that write) and counted free all the same. A discard that fails
    /// leaves the segments free (a discard is advice to the device).
    pub fn checkpoint_done(&self, discard: impl FnOnce(&[SegNo])) -> usize {
        let mut fm = self.free.lock();
        fm.rounds += 1;
        let round = fm.rounds;
        let pre = std::mem::take(&mut fm.committing);
        let mut freed = 0;
        for s in pre {
            let mut seg = self.seg(s).lock();
            if seg.state != SegState::Prefree {
                continue;
            }
            debug_assert_eq!(seg.entry.valid_blocks, 0);
            seg.state = SegState::Free;
            seg.entry.log_type = NO_LOG;
            fm.free.insert(s);
            fm.undiscarded.insert(s, round);
            freed += 1;
        }
        // Freed in an earlier round and free ever since (a segment reused and freed again
        // carries its newer round). At most a quarter of the free map is held out at once, so
        // lanes that need a segment meanwhile find one (none when space is short).
        let room = if fm.free.len() < DISCARD_MIN_FREE { 0 } else { fm.free.len() / 4 };
        let due: Vec<SegNo> = fm
            .undiscarded
            .iter()
            .filter(|&(_, &r)| r < round)
            .map(|(&s, _)| s)
            .take(DISCARD_PER_ROUND.min(room))
            .collect();
        let mut taken = Vec::with_capacity(due.len());
        for s in due {
            fm.undiscarded.remove(&s);
            if fm.free.remove(&s) {
                taken.push(s);
            }
        }
        // Out of the map while discarded, still counted free (as a lane's cache is).
        self.cached.fetch_add(taken.len() as u64, Ordering::AcqRel);
        self.publish(&fm);
        drop(fm);
        if !taken.is_empty() {
            discard(&taken);
            let mut fm = self.free.lock();
            for &s in &taken {
                debug_assert_eq!(self.state(s), SegState::Free, "segment {s} changed while discarded");
                fm.free.insert(s);
            }
            self.cached.fetch_sub(taken.len() as u64, Ordering::AcqRel);
            self.publish(&fm);
        }
        freed
    }

    /// FITRIM's plan: the runs of consecutive segments in `range` that are free now, leaving
    /// out the `keep` lowest-numbered free segments (allocation takes the lowest first, so
    /// those are the next to be written and discarding them would only make the device
    /// allocate them again). A snapshot: [`SegmentTable::take_for_trim`] takes what is still
    /// free when it comes to it.
    pub fn free_runs(&self, range: std::ops::Range<SegNo>, keep: usize) -> Vec<std::ops::Range<SegNo>> {
        let fm = self.free.lock();
        let floor = fm.free.iter().nth(keep).copied();
        let mut runs: Vec<std::ops::Range<SegNo>> = Vec::new();
        let Some(floor) = floor else { return runs };
        for &s in fm.free.range(range.start.max(floor)..range.end) {
            match runs.last_mut() {
                Some(r) if r.end == s => r.end = s.next(),
                _ => runs.push(s..s.next()),
            }
        }
        // Ascending runs inside `range`, with a gap between any two (else they were one).
        debug_assert!(runs.windows(2).all(|w| w[0].end < w[1].start), "free runs overlap or touch");
        debug_assert!(runs.iter().all(|r| r.start >= range.start && r.end <= range.end && r.start < r.end));
        runs
    }

    /// Takes the segments of `range` that are still free, except the `keep` lowest-numbered
    /// free ones, out of the free map for a discard (as [`SegmentTable::checkpoint_done`] does:
    /// a discard racing with a new write into the segment would destroy that write). They stay
    /// counted free. Prefree and committing segments are never free here: the checkpoint that
    /// frees them, and recovery until then, may still need what they hold. Give them back
    /// with [`SegmentTable::return_trimmed`].
    pub fn take_for_trim(&self, range: std::ops::Range<SegNo>, keep: usize) -> Vec<SegNo> {
        let mut fm = self.free.lock();
        let Some(floor) = fm.free.iter().nth(keep).copied() else { return Vec::new() };
        let taken: Vec<SegNo> = fm.free.range(range.start.max(floor)..range.end).copied().collect();
        for s in &taken {
            fm.free.remove(s);
            // Discarded now: a later checkpoint round need not.
            fm.undiscarded.remove(s);
        }
        self.cached.fetch_add(taken.len() as u64, Ordering::AcqRel);
        self.publish(&fm);
        drop(fm);
        debug_assert!(taken.iter().all(|&s| self.state(s) == SegState::Free));
        taken
    }

    /// Puts segments taken by [`SegmentTable::take_for_trim`] back into the free map.
    pub fn return_trimmed(&self, segs: &[SegNo]) {
        let mut fm = self.free.lock();
        for &s in segs {
            debug_assert_eq!(self.state(s), SegState::Free, "segment {s} changed while trimmed");
            fm.free.insert(s);
        }
        self.cached.fetch_sub(segs.len() as u64, Ordering::AcqRel);
        self.publish(&fm);
    }

    /// Up to `max` victims for the cleaner: dirty (full, inactive) segments holding at least
    /// one invalid block, best first by `policy`. Segments listed in `skip` are left out.
    pub fn victims(&self, policy: VictimPolicy, max: usize, skip: &[SegNo]) -> Vec<Victim> {
        if max == 0 {
            return Vec::new();
        }
        let full = crate::format::layout::BLOCKS_PER_SEG as u64;
        // (score, segno): a lower score is a better victim.
        let mut ranked: Vec<(u128, SegNo)> = Vec::new();
        for (segno, s) in self.geometry.segments().zip(&self.segs) {
            let s = s.lock();
            let v = s.entry.valid_blocks as u64;
            debug_assert!(v <= full, "segment {segno}: {v} valid blocks");
            if s.state != SegState::Dirty || v >= full || skip.contains(&segno) {
                continue;
            }
            let score = match policy {
                VictimPolicy::Greedy => v as u128,
                VictimPolicy::CostBenefit { now } => {
                    // Maximise (1-u)*age/(1+u) = (full-v)*age/(full+v); rank by its negation,
                    // scaled to integers (age + 1 so that young empty segments still rank).
                    let age = now.saturating_sub(s.entry.mtime) as u128 + 1;
                    let benefit = (((full - v) as u128 * age) << 20) / (full + v) as u128;
                    u128::MAX - benefit
                }
            };
            ranked.push((score, segno));
        }
        ranked.sort_unstable();
        ranked.truncate(max);
        ranked
            .into_iter()
            .map(|(_, segno)| {
                let e = self.entry(segno);
                let valid: Vec<u32> = (0..full as u32).filter(|&o| e.is_valid(o)).collect();
                // One entry's count and bitmap agree: the cleaner sizes its moves by either.
                debug_assert_eq!(valid.len(), e.valid_blocks as usize, "segment {segno}: count and bitmap");
                Victim { segno, valid_blocks: e.valid_blocks, valid }
            })
            .collect()
    }

    /// Free segments (not counting lane caches or prefree).
    pub fn free_count(&self) -> usize {
        self.free.lock().free.len()
    }

    /// Count of segments in each state: (free, active, dirty, prefree).
    pub fn state_counts(&self) -> (u32, u32, u32, u32) {
        let mut c = (0, 0, 0, 0);
        for s in &self.segs {
            match s.lock().state {
                SegState::Free => c.0 += 1,
                SegState::Active { .. } => c.1 += 1,
                SegState::Dirty => c.2 += 1,
                SegState::Prefree => c.3 += 1,
            }
        }
        c
    }

    /// Total valid blocks.
    pub fn total_valid(&self) -> u64 {
        self.segs.iter().map(|s| s.lock().entry.valid_blocks as u64).sum()
    }

    /// A checkpoint's snapshot and its taking of the SIT at once (nothing written between):
    /// the SIT blocks changed since the last call, with their indexes; clears the marks (see
    /// [`SegmentTable::take_checkpoint_sit`]).
    pub fn take_dirty_sit_blocks(&self) -> Vec<(u32, SitBlock)> {
        self.open_epoch(self.epoch.load(Ordering::Acquire) + 1);
        self.take_checkpoint_sit().blocks
    }

    /// The moment a checkpoint takes the SIT: the SIT blocks changed since the last call, as
    /// the checkpoint's picture has them, and its valid count; clears the marks.
    ///
    /// - Segments emptied so far are handed to this checkpoint (free once it is durable),
    ///   except those a block was taken from since its snapshot (see `touched`): a journal
    ///   block or a data block written after the snapshot is read by recovery from this very
    ///   checkpoint, so its segment waits for the next one.
    /// - Young blocks (foreground writes since the snapshot) are left out of the blocks: the
    ///   checkpoint's trees do not name them. Their SIT blocks are marked changed again, for
    ///   the next checkpoint to write as they are then. Recording stops.
    pub fn take_checkpoint_sit(&self) -> CheckpointSit {
        let epoch = self.epoch.load(Ordering::Acquire);
        {
            let mut fm = self.free.lock();
            let pre = std::mem::take(&mut fm.prefree);
            for s in pre {
                if self.seg(s).lock().touched < epoch {
                    fm.committing.push(s);
                } else {
                    fm.prefree.push(s);
                }
            }
        }
        let recording = self.recording.load(Ordering::Acquire);
        let mut out = Vec::new();
        let mut redirty = Vec::new();
        for (w, word) in self.dirty_sit.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let idx = (w * 64) as u32 + b;
                let (blk, young) = self.sit_block_as_of(idx, recording.then_some(epoch));
                if young {
                    redirty.push(idx);
                }
                out.push((idx, blk));
            }
        }
        // Segments whose SIT block did not change hold no young block (a validation marks it).
        let mut valid = 0u64;
        for s in &self.segs {
            let s = s.lock();
            valid += s.entry.valid_blocks as u64;
            if recording && s.young_epoch == epoch {
                let young = s.young.iter().filter(|&&o| s.entry.is_valid(o as u32)).count() as u64;
                // Young blocks still valid are among the segment's valid ones just added.
                debug_assert!(young <= s.entry.valid_blocks as u64, "more young than valid blocks");
                valid -= young;
            }
        }
        self.recording.store(false, Ordering::Release);
        for idx in redirty {
            self.dirty_sit[idx as usize / 64].fetch_or(1 << (idx % 64), Ordering::Relaxed);
        }
        // One block per dirty bit, in index order, each a block of the SIT area.
        debug_assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "SIT blocks out of order");
        debug_assert!(out.last().is_none_or(|b| b.0 < self.geometry.sit_blocks), "SIT block past the SIT");
        CheckpointSit { blocks: out, valid }
    }

    /// SIT block `index` as the checkpoint of `epoch` sees it (its young blocks left out), and
    /// whether any was; with `None`, as it is now.
    fn sit_block_as_of(&self, index: u32, epoch: Option<u64>) -> (SitBlock, bool) {
        debug_assert!(index < self.geometry.sit_blocks, "SIT block {index} of {}", self.geometry.sit_blocks);
        let mut blk = SitBlock::empty(index);
        let mut any = false;
        let first = index * SIT_ENTRIES_PER_BLOCK;
        for (i, e) in blk.entries.iter_mut().enumerate() {
            let segno = SegNo(first + i as u32);
            if self.geometry.has_segment(segno) {
                let seg = self.seg(segno).lock();
                *e = seg.entry.clone();
                if epoch == Some(seg.young_epoch) {
                    for &o in &seg.young {
                        any |= e.clear_valid(o as u32);
                    }
                }
            }
        }
        (blk, any)
    }

    /// The current contents of SIT block `index`.
    pub fn sit_block(&self, index: u32) -> SitBlock {
        debug_assert!(index < self.geometry.sit_blocks, "SIT block {index} of {}", self.geometry.sit_blocks);
        let mut blk = SitBlock::empty(index);
        let first = index * SIT_ENTRIES_PER_BLOCK;
        for (i, e) in blk.entries.iter_mut().enumerate() {
            let segno = SegNo(first + i as u32);
            if self.geometry.has_segment(segno) {
                *e = self.seg(segno).lock().entry.clone();
            }
        }
        blk
    }

    /// A copy of segment `segno`'s SIT entry.
    pub fn entry(&self, segno: SegNo) -> SitEntry {
        self.seg(segno).lock().entry.clone()
    }

    /// Checks internal invariants (tests and fsck): counts match bitmaps, free map agrees with
    /// states, no free segment holds valid blocks.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let fm = self.free.lock();
        for (segno, s) in self.geometry.segments().zip(&self.segs) {
            let s = s.lock();
            let pop: u32 = s.entry.bitmap.iter().map(|b| b.count_ones()).sum();
            if pop != s.entry.valid_blocks as u32 {
                return Err(format!("segment {segno}: count {} bitmap {pop}", s.entry.valid_blocks));
            }
            let in_free = fm.free.contains(&segno);
            if in_free && s.state != SegState::Free {
                return Err(format!("segment {segno} in free map but {:?}", s.state));
            }
            if matches!(s.state, SegState::Free | SegState::Prefree) && s.entry.valid_blocks != 0 {
                return Err(format!("segment {segno} is {:?} with valid blocks", s.state));
            }
        }
        Ok(())
    }
}
