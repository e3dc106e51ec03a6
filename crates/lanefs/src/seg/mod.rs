//! Segments: the validity table (SIT in memory), segment states, and the lanes of active logs.
//!
//! A main-area segment is in one of four states:
//!
//! ```text
//!   Free --(a lane takes it)--> Active(lane, log) --(full)--> Dirty
//!    ^                                                         |
//!    +--(next checkpoint)-- Prefree <--(last valid block gone)-+
//! ```
//!
//! A segment freed by invalidation becomes reusable only after the next checkpoint (prefree),
//! because until then the previous checkpoint may still reference its blocks.
//!
//! Concurrency: each segment's entry has its own small lock, so validity updates from different
//! threads on different segments never meet; each lane owns its six active logs and a cache of
//! free segments, refilled from the global free map in batches, so threads on different cores
//! do not append to the same log or contend on the free map per segment.

mod lanes;
mod table;

pub use lanes::{Lane, LaneSet};
pub use table::{CheckpointSit, SegState, SegmentTable, Victim, VictimPolicy, DISCARD_PER_ROUND};

/// Free segments a lane takes from the global map at once.
pub const FREE_BATCH: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::checkpoint::LogCursor;
    use crate::format::layout::{Geometry, LogType, SegNo, BLOCKS_PER_SEG, LOG_TYPES};
    use crate::format::sit::SitEntry;
    use crate::format::ssa::{SegmentSummary, SummaryEntry, SummaryKind};
    use std::collections::HashSet;
    use std::sync::Arc;

    fn setup(lanes: u32) -> (Geometry, Arc<SegmentTable>, LaneSet) {
        let g = Geometry::compute(256 * 256, lanes).unwrap(); // 256 MiB
        let table =
            Arc::new(SegmentTable::new(g, vec![SitEntry::default(); g.main_segments as usize], &[]).unwrap());
        let mut cursors = Vec::new();
        let mut sums = Vec::new();
        for l in 0..lanes {
            let mut c = [LogCursor { segno: SegNo(0), next_off: 0 }; LOG_TYPES];
            let mut s = Vec::new();
            for (t, log) in LogType::ALL.iter().enumerate() {
                let segno = SegNo(l * LOG_TYPES as u32 + t as u32);
                table.activate_free(segno, l, *log, 0).unwrap();
                c[t] = LogCursor { segno, next_off: 0 };
                s.push(SegmentSummary::empty(segno));
            }
            cursors.push(c);
            sums.push(s);
        }
        let lanes = LaneSet::new(table.clone(), &cursors, sums).unwrap();
        (g, table, lanes)
    }

    #[test]
    fn concurrent_allocation_is_unique_and_counted() {
        let (g, table, lanes) = setup(2);
        let lanes = Arc::new(lanes);
        let per_thread = 3000u32;
        let handles: Vec<_> = (0..8u32)
            .map(|t| {
                let lanes = lanes.clone();
                std::thread::spawn(move || {
                    let log = LogType::ALL[(t % 6) as usize];
                    (0..per_thread)
                        .map(|i| {
                            let owner = SummaryEntry { kind: SummaryKind::Data, nid: t + 1, ofs: i };
                            lanes.alloc(t % 2, log, owner, 1).unwrap()
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut all = HashSet::new();
        for h in handles {
            for a in h.join().unwrap() {
                assert!(g.in_main(a));
                assert!(all.insert(a), "block {a} handed out twice");
            }
        }
        assert_eq!(all.len() as u64, 8 * per_thread as u64);
        assert_eq!(table.total_valid(), all.len() as u64);
        assert_eq!(table.valid_count(), all.len() as u64, "the per-CPU count agrees with the bitmaps");
        for &a in &all {
            assert!(table.is_valid(a));
        }
        table.check_invariants().unwrap();
        // Every filled segment's summary names the owners that were written into it.
        let closed = lanes.take_closed_summaries();
        assert!(!closed.is_empty());
        for s in &closed {
            assert!(s.entries.iter().all(|e| e.kind == SummaryKind::Data));
            assert_eq!(table.state(s.segno), SegState::Dirty);
        }
    }

    /// The valid count read while blocks are validated and invalidated on other threads never
    /// wraps: it may run over by what was validated during the read, never past the main area
    /// (it once wrapped to near 2^64, when a block came and went between its two per-CPU sums).
    #[test]
    fn valid_count_read_under_churn_never_wraps() {
        let (g, table, lanes) = setup(2);
        let lanes = Arc::new(lanes);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn: Vec<_> = (0..2u32)
            .map(|t| {
                let (lanes, table) = (lanes.clone(), table.clone());
                std::thread::spawn(move || {
                    // Bounded by the main area: each block is taken once, then dropped.
                    for i in 0..20_000u32 {
                        let owner = SummaryEntry { kind: SummaryKind::Data, nid: t + 1, ofs: i };
                        let a = lanes.alloc(t, LogType::HotData, owner, 1).unwrap();
                        table.invalidate(a).unwrap();
                    }
                })
            })
            .collect();
        let reader = {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                // At least one read, however the threads are scheduled (a loaded machine may
                // run the churn to its end before this thread starts).
                loop {
                    let n = table.valid_count();
                    // At most 2 blocks are valid at any moment; a read overlapping the churn
                    // may count the validations it overlapped, never more blocks than exist.
                    assert!(n <= g.main_blocks(), "valid count {n}: it wrapped");
                    reads += 1;
                    if stop.load(std::sync::atomic::Ordering::Acquire) {
                        return reads;
                    }
                }
            })
        };
        for c in churn {
            c.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
        assert!(reader.join().unwrap() > 0);
        assert_eq!(table.valid_count(), 0);
        assert!(g.main_blocks() >= 40_000);
    }

    #[test]
    fn emptied_segment_is_prefree_until_checkpoint() {
        let (_g, table, lanes) = setup(1);
        let owner = SummaryEntry { kind: SummaryKind::Data, nid: 5, ofs: 0 };
        let addrs: Vec<u64> =
            (0..BLOCKS_PER_SEG + 1).map(|_| lanes.alloc(0, LogType::HotData, owner, 1).unwrap()).collect();
        let first_seg = table.geometry().seg_of(addrs[0]).unwrap().0;
        assert_eq!(table.state(first_seg), SegState::Dirty);
        let free_before = table.free_count();
        for &a in &addrs[..BLOCKS_PER_SEG as usize] {
            table.invalidate(a).unwrap();
        }
        assert_eq!(table.state(first_seg), SegState::Prefree);
        assert!(table.invalidate(addrs[0]).is_err(), "double invalidation must be refused");
        assert_eq!(table.free_count(), free_before);
        // Not yet handed to a checkpoint: a checkpoint completing now does not free it.
        table.checkpoint_done(|_| {});
        assert_eq!(table.state(first_seg), SegState::Prefree);
        let dirty = table.take_dirty_sit_blocks();
        table.checkpoint_done(|_| {});
        assert_eq!(table.state(first_seg), SegState::Free);
        assert_eq!(table.free_count(), free_before + 1);
        table.check_invariants().unwrap();
        assert!(dirty.iter().any(|(i, _)| *i == 0));
        assert!(table.take_dirty_sit_blocks().is_empty());
    }

    /// A checkpoint's SIT leaves out the foreground's blocks written after its snapshot (its
    /// trees cannot name them) and writes them with the next one; a segment a block was taken
    /// from after the snapshot waits for the next checkpoint to be freed (recovery from this one
    /// reads what was written there after its stamp).
    #[test]
    fn blocks_written_during_a_checkpoint_belong_to_the_next_one() {
        let (g, table, lanes) = setup(1);
        let owner = SummaryEntry { kind: SummaryKind::Data, nid: 5, ofs: 0 };
        let old: Vec<u64> =
            (0..BLOCKS_PER_SEG).map(|_| lanes.alloc(0, LogType::HotData, owner, 1).unwrap()).collect();
        let _ = table.take_dirty_sit_blocks();
        table.open_epoch(2);
        // The checkpoint's own block, then an fsync's young ones (one of them into a fresh
        // segment: the old one closes full).
        let own = lanes.alloc(0, LogType::WarmNode, owner, 1).unwrap();
        let young: Vec<u64> =
            (0..3).map(|_| lanes.alloc_young(0, LogType::HotData, owner, 1).unwrap()).collect();
        let young_seg = g.seg_of(young[0]).unwrap().0;
        // An fsync writes and supersedes blocks of a segment opened after the snapshot; the
        // checkpoint empties an old segment.
        for &a in &old {
            table.invalidate(a).unwrap();
        }
        table.invalidate(young[2]).unwrap();
        let valid_now = table.total_valid();
        let cp = table.take_checkpoint_sit();
        assert_eq!(cp.valid, valid_now - 2, "the two live young blocks are not in the picture");
        let entry = |segno: SegNo| {
            let (blk, slot) = crate::format::sit::SitBlock::locate(segno);
            let (_, b) = cp.blocks.iter().find(|(i, _)| *i == blk).expect("its SIT block is written");
            b.entries[slot].clone()
        };
        let (ys, yo) = g.seg_of(young[0]).unwrap();
        assert!(!entry(ys).is_valid(yo) && table.is_valid(young[0]), "young: live, not checkpointed");
        let (os, oo) = g.seg_of(own).unwrap();
        assert!(entry(os).is_valid(oo), "the checkpoint's own block is in its SIT");
        // The next checkpoint writes the young blocks as they are.
        table.open_epoch(3);
        let next = table.take_checkpoint_sit();
        let (blk, slot) = crate::format::sit::SitBlock::locate(ys);
        let (_, b) = next.blocks.iter().find(|(i, _)| *i == blk).expect("marked again");
        assert!(b.entries[slot].is_valid(yo));
        assert_eq!(next.valid, table.total_valid());
        let old_seg = g.seg_of(old[0]).unwrap().0;
        assert_ne!(old_seg, young_seg);
        table.check_invariants().unwrap();
    }

    /// A segment emptied during a checkpoint's write phase that holds a block taken after its
    /// snapshot (a journal block of an fsync) is not freed by that checkpoint.
    #[test]
    fn a_segment_touched_after_the_snapshot_waits_one_checkpoint_more() {
        let (g, table, lanes) = setup(1);
        let owner = SummaryEntry { kind: SummaryKind::Journal, nid: 0, ofs: 0 };
        // Journal blocks fill a segment before the snapshot, and one more after it.
        let before: Vec<u64> =
            (0..BLOCKS_PER_SEG - 1).map(|_| lanes.reserve(0, LogType::ColdNode, owner, 1).unwrap()).collect();
        table.open_epoch(1);
        let after = lanes.reserve(0, LogType::ColdNode, owner, 1).unwrap();
        let seg = g.seg_of(before[0]).unwrap().0;
        assert_eq!(g.seg_of(after).unwrap().0, seg);
        // The next reservation closes it, empty: prefree.
        lanes.reserve(0, LogType::ColdNode, owner, 1).unwrap();
        assert_eq!(table.state(seg), SegState::Prefree);
        let _ = table.take_checkpoint_sit();
        table.checkpoint_done(|_| {});
        assert_eq!(table.state(seg), SegState::Prefree, "checkpoint 1's recovery reads it");
        table.open_epoch(2);
        let _ = table.take_checkpoint_sit();
        table.checkpoint_done(|_| {});
        assert_eq!(table.state(seg), SegState::Free);
        table.check_invariants().unwrap();
    }

    #[test]
    fn allocation_reports_enospc_when_segments_run_out() {
        let (g, table, lanes) = setup(1);
        let owner = SummaryEntry { kind: SummaryKind::Node, nid: 1, ofs: 0 };
        let capacity = (g.main_segments as u64 - LOG_TYPES as u64 + 1) * BLOCKS_PER_SEG as u64;
        let mut n = 0u64;
        loop {
            match lanes.alloc(0, LogType::WarmNode, owner, 1) {
                Ok(_) => n += 1,
                Err(crate::Error::NoSpace) => break,
                Err(e) => panic!("{e}"),
            }
            assert!(n <= capacity, "allocated past the device");
        }
        assert_eq!(n, capacity);
        assert_eq!(table.free_count(), 0);
        table.check_invariants().unwrap();
    }

    /// Fills `segs` whole segments of lane 0's hot data log; returns their block addresses.
    fn fill(lanes: &LaneSet, segs: u32, mtime: u64) -> Vec<Vec<u64>> {
        let owner = SummaryEntry { kind: SummaryKind::Data, nid: 9, ofs: 0 };
        (0..segs)
            .map(|_| {
                (0..BLOCKS_PER_SEG).map(|_| lanes.alloc(0, LogType::HotData, owner, mtime).unwrap()).collect()
            })
            .collect()
    }

    #[test]
    fn greedy_victims_come_fewest_valid_first_and_skip_full_and_active() {
        let (g, table, lanes) = setup(1);
        let segs = fill(&lanes, 4, 1);
        // The log moved on after each full segment: the first three are dirty, the last is
        // the active one (full, but still the log's segment until the next block).
        for (k, dead) in [(0usize, 10u32), (1, 300), (2, 0)] {
            for &a in &segs[k][..dead as usize] {
                table.invalidate(a).unwrap();
            }
        }
        let v = table.victims(VictimPolicy::Greedy, 10, &[]);
        let order: Vec<SegNo> = v.iter().map(|v| v.segno).collect();
        let seg = |k: usize| g.seg_of(segs[k][0]).unwrap().0;
        assert_eq!(order, vec![seg(1), seg(0)], "fewest valid first; full segments are no victims");
        assert_eq!(v[0].valid_blocks, 512 - 300);
        assert_eq!(v[0].valid.len(), 212);
        assert!(v[0].valid.iter().all(|&o| table.is_valid(g.seg_start(seg(1)) + o as u64)));
        assert_eq!(table.victims(VictimPolicy::Greedy, 1, &[]).len(), 1, "bounded by max");
        assert!(table.victims(VictimPolicy::Greedy, 10, &[seg(0), seg(1)]).is_empty());
    }

    #[test]
    fn cost_benefit_prefers_old_segments_over_slightly_emptier_young_ones() {
        let (g, table, lanes) = setup(1);
        let old = fill(&lanes, 1, 1);
        let young = fill(&lanes, 2, 1000);
        for &a in &old[0][..100] {
            table.invalidate(a).unwrap();
        }
        for &a in &young[0][..150] {
            table.invalidate(a).unwrap();
        }
        let seg = |v: &Vec<u64>| g.seg_of(v[0]).unwrap().0;
        let greedy = table.victims(VictimPolicy::Greedy, 1, &[]);
        assert_eq!(greedy[0].segno, seg(&young[0]));
        let cb = table.victims(VictimPolicy::CostBenefit { now: 1001 }, 1, &[]);
        assert_eq!(cb[0].segno, seg(&old[0]), "an old segment is worth cleaning before a young one");
    }

    #[test]
    fn freed_segments_are_discarded_a_round_later_if_still_free_and_out_of_reach_meanwhile() {
        let (g, table, lanes) = setup(1);
        let segs = fill(&lanes, 3, 1);
        let [first, second] = [0, 1].map(|i| g.seg_of(segs[i][0]).unwrap().0);
        for &a in segs[0].iter().chain(&segs[1]) {
            table.invalidate(a).unwrap();
        }
        let _ = table.take_dirty_sit_blocks();
        let free_before = table.free_segments();
        // Round 1 frees both, discards neither: they are likely reused soon.
        let n = table.checkpoint_done(|s| panic!("discarded {s:?} in the round that freed them"));
        assert_eq!(n, 2);
        assert_eq!((table.state(first), table.state(second)), (SegState::Free, SegState::Free));
        assert_eq!(table.free_segments(), free_before + 2);
        // A lane takes them all (as the lowest free segments); put back all but `second`.
        let taken = table.take_free(table.free_count());
        assert!(taken.contains(&first) && taken.contains(&second));
        let back: Vec<SegNo> = taken.iter().copied().filter(|&s| s != second).collect();
        table.return_free(&back);
        // Round 2 discards `first` only (`second` is in a lane's hands), out of the map while
        // discarded and counted free all the same.
        let mut seen = Vec::new();
        let (free_now, in_map) = (table.free_segments(), table.free_count());
        let n = table.checkpoint_done(|s| {
            assert!(s.iter().all(|&x| table.state(x) == SegState::Free));
            assert_eq!(table.free_count(), in_map - 1, "a segment being discarded is out of the map");
            assert_eq!(table.free_segments(), free_now, "and still counted free");
            seen.extend_from_slice(s);
        });
        assert_eq!((n, seen), (0, vec![first]));
        assert_eq!((table.free_count(), table.free_segments()), (in_map, free_now));
        table.check_invariants().unwrap();
        // Round 3: nothing left to discard.
        assert_eq!(table.checkpoint_done(|s| panic!("discarded {s:?} twice")), 0);
    }

    #[test]
    fn a_lane_with_an_empty_map_takes_a_segment_from_another_lanes_cache() {
        let (g, table, lanes) = setup(2);
        let owner = SummaryEntry { kind: SummaryKind::Data, nid: 3, ofs: 0 };
        // Lane 0 fills segments until the map is empty (its cache may hold some).
        let total = table.free_segments();
        let mut n = 0u64;
        while table.free_count() > 0 {
            lanes.alloc(0, LogType::HotData, owner, 1).unwrap();
            n += 1;
            assert!(n <= (total + 1) * 512, "the free map never emptied");
        }
        // Lane 1 can still get every segment lane 0 cached: none is stranded.
        let cached = table.free_segments();
        let mut got = 0u64;
        loop {
            match lanes.alloc(1, LogType::ColdData, owner, 1) {
                Ok(_) => got += 1,
                Err(crate::Error::NoSpace) => break,
                Err(e) => panic!("{e}"),
            }
            assert!(got <= (cached + 1) * 512);
        }
        assert_eq!(table.free_segments(), 0);
        assert!(got >= cached * 512, "lane 1 got {got} blocks of {cached} free segments");
        assert!(g.main_segments > 0);
        table.check_invariants().unwrap();
    }
}
