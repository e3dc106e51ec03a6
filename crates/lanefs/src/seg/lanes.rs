//! Lanes: per-core sets of active logs (one segment per log type) with a free-segment cache.
//!
//! A thread writes through the lane of the CPU it runs on; lanes never share an active segment,
//! so appends on different cores touch different locks and different segments. A lane refills
//! its cache from the global free map [`super::FREE_BATCH`] segments at a time.

use super::table::{SegState, SegmentTable};
use super::FREE_BATCH;
use crate::error::{Error, Result};
use crate::format::checkpoint::LogCursor;
use crate::format::layout::{LogType, SegNo, BLOCKS_PER_SEG, LOG_TYPES};
use crate::format::ssa::{SegmentSummary, SummaryEntry};
use crate::sync::rank::{Mutex, Rank};
use std::sync::Arc;

/// How a block is taken.
#[derive(Clone, Copy)]
enum Take {
    /// Made valid (the checkpoint's own blocks).
    Valid,
    /// Made valid, young while a checkpoint is written (fsync, writeback).
    Young,
    /// Reserved, not valid (journal blocks).
    Reserve,
}

/// The segment a log appends to and how far it got.
struct ActiveLog {
    segno: SegNo,
    next_off: u32,
    summary: SegmentSummary,
}

/// One lane: six active logs and a private cache of free segments.
pub struct Lane {
    id: u32,
    logs: [Mutex<ActiveLog>; LOG_TYPES],
    cache: Mutex<Vec<SegNo>>,
}

/// All lanes of a mounted image, over one segment table.
pub struct LaneSet {
    table: Arc<SegmentTable>,
    lanes: Vec<Lane>,
    /// Summaries of segments filled since the last checkpoint, waiting to be written.
    closed: Mutex<Vec<SegmentSummary>>,
}

impl LaneSet {
    /// Restores lanes from checkpointed cursors and the summaries of their active segments
    /// (`summaries[lane][log]`).
    pub fn new(
        table: Arc<SegmentTable>,
        cursors: &[[LogCursor; LOG_TYPES]],
        summaries: Vec<Vec<SegmentSummary>>,
    ) -> Result<LaneSet> {
        if cursors.len() != summaries.len() || summaries.iter().any(|s| s.len() != LOG_TYPES) {
            return Err(Error::InvalidArgument("lane cursors and summaries disagree".into()));
        }
        let lanes = cursors
            .iter()
            .zip(summaries)
            .enumerate()
            .map(|(id, (cur, sums))| {
                let mut sums = sums.into_iter();
                let logs = std::array::from_fn(|t| {
                    let summary = sums.next().expect("checked length");
                    debug_assert_eq!(summary.segno, cur[t].segno);
                    // The checkpoint decoder bounds a cursor by the segment: `take_block` indexes
                    // the summary by it.
                    debug_assert!(
                        cur[t].next_off as u32 <= BLOCKS_PER_SEG,
                        "lane {id} cursor {}",
                        cur[t].next_off
                    );
                    Mutex::new(
                        Rank::LaneLog,
                        ActiveLog { segno: cur[t].segno, next_off: cur[t].next_off as u32, summary },
                    )
                });
                Lane { id: id as u32, logs, cache: Mutex::new(Rank::LaneCache, Vec::new()) }
            })
            .collect();
        Ok(LaneSet { table, lanes, closed: Mutex::new(Rank::LaneClosed, Vec::new()) })
    }

    /// The segment table the lanes allocate from.
    pub fn table(&self) -> &Arc<SegmentTable> {
        &self.table
    }

    /// Number of lanes.
    pub fn lane_count(&self) -> u32 {
        self.lanes.len() as u32
    }

    /// Allocates the next block of `lane`'s `log` for `owner`, marking it valid. Moves to a
    /// fresh segment when the active one is full.
    pub fn alloc(&self, lane: u32, log: LogType, owner: SummaryEntry, mtime: u64) -> Result<u64> {
        self.take_block(lane, log, owner, mtime, Take::Valid)
    }

    /// [`LaneSet::alloc`] for the foreground (fsync, writeback): the block is young while a
    /// checkpoint is being written (`SegmentTable::validate_young`).
    pub fn alloc_young(&self, lane: u32, log: LogType, owner: SummaryEntry, mtime: u64) -> Result<u64> {
        self.take_block(lane, log, owner, mtime, Take::Young)
    }

    /// Takes the next block of `lane`'s `log` without marking it valid. Journal blocks are taken
    /// this way: they are garbage once the next checkpoint is durable, so they never count as
    /// live, and their segment becomes reusable only through the prefree rule.
    pub fn reserve(&self, lane: u32, log: LogType, owner: SummaryEntry, mtime: u64) -> Result<u64> {
        self.take_block(lane, log, owner, mtime, Take::Reserve)
    }

    fn take_block(&self, lane: u32, log: LogType, owner: SummaryEntry, mtime: u64, how: Take) -> Result<u64> {
        let l = self
            .lanes
            .get(lane as usize)
            .ok_or_else(|| Error::InvalidArgument(format!("lane {lane} does not exist")))?;
        let mut a = l.logs[log as usize].lock();
        if a.next_off == BLOCKS_PER_SEG {
            // The table has the full segment as this very log's: it closes the right one.
            assert_eq!(
                self.table.state(a.segno),
                SegState::Active { lane: l.id, log },
                "lane {lane} {log:?}: the table disagrees on its segment {}",
                a.segno
            );
            let segno = self.next_free(l)?;
            self.table.activate_cached(segno, l.id, log, mtime);
            let old = std::mem::replace(
                &mut *a,
                ActiveLog { segno, next_off: 0, summary: SegmentSummary::empty(segno) },
            );
            self.table.close(old.segno);
            self.closed.lock().push(old.summary);
        }
        let off = a.next_off;
        // A full log moved to a fresh segment above: the offset is a block of the segment.
        debug_assert!(off < BLOCKS_PER_SEG, "lane {lane} {log:?} at offset {off}");
        let addr = self.table.geometry().seg_start(a.segno) + off as u64;
        a.summary.entries[off as usize] = owner;
        a.next_off += 1;
        match how {
            Take::Valid => self.table.validate(addr, mtime)?,
            Take::Young => self.table.validate_young(addr, mtime)?,
            Take::Reserve => self.table.touch(addr),
        }
        debug_assert!(a.next_off <= BLOCKS_PER_SEG);
        debug_assert!(self.table.geometry().in_main(addr), "lane {lane} {log:?} took block {addr}");
        Ok(addr)
    }

    fn next_free(&self, l: &Lane) -> Result<SegNo> {
        let mut cache = l.cache.lock();
        if cache.is_empty() {
            // Near the end of space a lane takes one segment at a time, so that free segments
            // are not stranded in other lanes' caches.
            let lanes = self.lanes.len() as u64;
            let batch =
                if self.table.free_segments() > 4 * FREE_BATCH as u64 * lanes { FREE_BATCH } else { 1 };
            *cache = self.table.take_free(batch);
            // The cache is a bounded queue: at most one batch, refilled only when empty.
            debug_assert!(cache.len() <= FREE_BATCH, "lane {} caches {} segments", l.id, cache.len());
            cache.reverse(); // pop from the end in ascending order
        }
        if let Some(s) = cache.pop() {
            return Ok(s);
        }
        drop(cache);
        // The map is empty: take one from another lane's cache (never wait on it: that lane
        // may be the caller, filling a segment while holding its own log).
        for other in self.lanes.iter().filter(|o| o.id != l.id) {
            if let Some(mut c) = other.cache.try_lock() {
                debug_assert!(c.len() <= FREE_BATCH, "lane {} caches {} segments", other.id, c.len());
                if let Some(s) = c.pop() {
                    return Ok(s);
                }
            }
        }
        Err(Error::NoSpace)
    }

    /// The summary of `segno` if this set holds it in memory (an active segment, or one filled
    /// since the last checkpoint whose summary is not written yet); None: it is on disk.
    pub fn summary_in_memory(&self, segno: SegNo) -> Option<SegmentSummary> {
        debug_assert!(self.table.geometry().has_segment(segno), "summary of segment {segno}");
        if let Some(s) = self.closed.lock().iter().find(|s| s.segno == segno) {
            // Summaries are whole (`SegmentSummary::empty`, or decoded): one entry per block.
            debug_assert_eq!(s.entries.len(), BLOCKS_PER_SEG as usize, "summary of segment {segno}");
            return Some(s.clone());
        }
        for l in &self.lanes {
            for a in &l.logs {
                let a = a.lock();
                if a.segno == segno {
                    return Some(a.summary.clone());
                }
            }
        }
        None
    }

    /// Moves every log whose active segment satisfies `touched` to a fresh segment and closes
    /// the old one (recovery: the tail of such a segment holds journal or data blocks written
    /// after the checkpoint, which must survive until the next checkpoint is durable). Logs
    /// whose segments hold nothing of the kind continue where they were.
    pub fn retire_touched(&self, mtime: u64, touched: impl Fn(SegNo) -> bool) -> Result<()> {
        for l in &self.lanes {
            for (t, log) in LogType::ALL.iter().enumerate() {
                let mut a = l.logs[t].lock();
                if !touched(a.segno) {
                    continue;
                }
                let segno = self.next_free(l)?;
                // A fresh segment came from the free map, which holds no log's active one; the
                // table has the old one as this very log's.
                debug_assert_ne!(segno, a.segno, "lane {} {log:?} retired into its own segment", l.id);
                assert_eq!(
                    self.table.state(a.segno),
                    SegState::Active { lane: l.id, log: *log },
                    "lane {} {log:?}: the table disagrees on its segment {}",
                    l.id,
                    a.segno
                );
                self.table.activate_cached(segno, l.id, *log, mtime);
                let old = std::mem::replace(
                    &mut *a,
                    ActiveLog { segno, next_off: 0, summary: SegmentSummary::empty(segno) },
                );
                self.table.close(old.segno);
                self.closed.lock().push(old.summary);
            }
        }
        Ok(())
    }

    /// Recovery: records the owners of blocks written after the checkpoint in their segments'
    /// summaries (in memory where the segment's summary is held here, else read with `read`
    /// and queued for the next checkpoint to write).
    pub fn patch_summaries(
        &self,
        patches: &std::collections::BTreeMap<SegNo, Vec<(u32, SummaryEntry)>>,
        mut read: impl FnMut(SegNo) -> SegmentSummary,
    ) {
        // Runs at mount, before any other user: the closed list cannot change between its
        // look-up and the push below. It is not held across the active logs, which rank above
        // it (a lane closing a segment holds its log and then pushes here).
        for (&segno, entries) in patches {
            let apply = |s: &mut SegmentSummary| {
                debug_assert_eq!(s.segno, segno, "patch of segment {segno} applied to {}", s.segno);
                for &(off, e) in entries {
                    debug_assert!(off < BLOCKS_PER_SEG, "segment {segno}: patch at offset {off}");
                    s.entries[off as usize] = e;
                }
            };
            if let Some(s) = self.closed.lock().iter_mut().find(|s| s.segno == segno) {
                apply(s);
                continue;
            }
            let mut held = 0;
            for l in &self.lanes {
                for a in &l.logs {
                    let mut a = a.lock();
                    if a.segno == segno {
                        apply(&mut a.summary);
                        held += 1;
                    }
                }
            }
            // A segment is the active one of one log at most (`SegmentTable::new` refuses two).
            debug_assert!(held <= 1, "segment {segno} active in {held} logs");
            if held == 0 {
                let mut s = read(segno);
                apply(&mut s);
                self.closed.lock().push(s);
            }
        }
    }

    /// Where every log of every lane stands (for the checkpoint).
    pub fn cursors(&self) -> Vec<[LogCursor; LOG_TYPES]> {
        self.lanes
            .iter()
            .map(|l| {
                std::array::from_fn(|t| {
                    let a = l.logs[t].lock();
                    LogCursor { segno: a.segno, next_off: a.next_off as u16 }
                })
            })
            .collect()
    }

    /// An upper bound on the free segments a checkpoint takes when it writes `cold_data` blocks
    /// to its lane's cold data log (the cleaner's moves) and `other` blocks spread over its
    /// lane's logs in any way, and moves every lane's journal head one block on in
    /// `journal_log`; the checkpoint writes in the lane [`LaneSet::checkpoint_lane`] names.
    ///
    /// Why a bound on segments and not blocks: a log fills its open segment before it takes a
    /// fresh one, so a log given `b` blocks with `r` left opens `ceil((b - r) / 512)` when
    /// `b > r`, which is at most `floor(b / 512) + 1`. Summed over the logs that overflow:
    /// `floor(all / 512)` plus one per log whose room is below what it may be given. Counting
    /// blocks alone misses the `+ 1`s: a checkpoint that opens a fresh segment in several logs
    /// at once takes several segments for a few blocks.
    pub fn checkpoint_segments(&self, cold_data: u64, other: u64, journal_log: LogType) -> u64 {
        let journal_full = self
            .lanes
            .iter()
            .filter(|l| l.logs[journal_log as usize].lock().next_off == BLOCKS_PER_SEG)
            .count() as u64;
        let (_, need) = self.least_need(cold_data, other);
        need + journal_full
    }

    /// The lane a checkpoint writes in: the one where `cold_data` and `other` blocks (as in
    /// [`LaneSet::checkpoint_segments`]) open the fewest fresh segments. A checkpoint is one
    /// writer at a time, so it can go where there is room rather than where its thread runs:
    /// fewer segments closed early, and a bound the cleaner can count on.
    pub fn checkpoint_lane(&self, cold_data: u64, other: u64) -> u32 {
        self.least_need(cold_data, other).0
    }

    /// The lane with the least need (the first of equals) and that need.
    fn least_need(&self, cold_data: u64, other: u64) -> (u32, u64) {
        // The fallback below is never taken: a geometry has 1..=MAX_LANES lanes.
        debug_assert!(!self.lanes.is_empty(), "a lane set without lanes");
        let seg = BLOCKS_PER_SEG as u64;
        let need = |l: &Lane| {
            let overflowing = LogType::ALL
                .iter()
                .filter(|&&t| {
                    let given = if t == LogType::ColdData { cold_data + other } else { other };
                    given > seg - l.logs[t as usize].lock().next_off as u64
                })
                .count() as u64;
            (cold_data + other) / seg + overflowing
        };
        // Bounded by the lane count; the lanes are never empty (a set has at least one).
        self.lanes.iter().map(|l| (l.id, need(l))).min_by_key(|&(_, n)| n).unwrap_or((0, u64::MAX))
    }

    /// Summaries of every active segment as they are now (for the checkpoint).
    pub fn active_summaries(&self) -> Vec<SegmentSummary> {
        self.lanes.iter().flat_map(|l| l.logs.iter().map(|a| a.lock().summary.clone())).collect()
    }

    /// Each log's open segment: its cursor and its summary, read together under the log's
    /// lock (a checkpoint's cursors must name segments whose summaries it writes, while
    /// fsyncs beside it may move a log on).
    pub fn active_cursors_and_summaries(&self) -> (Vec<[LogCursor; LOG_TYPES]>, Vec<SegmentSummary>) {
        let mut summaries = Vec::new();
        let cursors = self
            .lanes
            .iter()
            .map(|l| {
                std::array::from_fn(|t| {
                    let a = l.logs[t].lock();
                    summaries.push(a.summary.clone());
                    LogCursor { segno: a.segno, next_off: a.next_off as u16 }
                })
            })
            .collect();
        (cursors, summaries)
    }

    /// Summaries of segments filled since the last call.
    pub fn take_closed_summaries(&self) -> Vec<SegmentSummary> {
        std::mem::take(&mut *self.closed.lock())
    }
}
