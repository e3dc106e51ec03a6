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
pub use table::{SegState, SegmentTable};

/// Free segments a lane takes from the global map at once.
pub const FREE_BATCH: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::checkpoint::LogCursor;
    use crate::format::layout::{Geometry, LogType, BLOCKS_PER_SEG, LOG_TYPES};
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
            let mut c = [LogCursor { segno: 0, next_off: 0 }; LOG_TYPES];
            let mut s = Vec::new();
            for (t, log) in LogType::ALL.iter().enumerate() {
                let segno = l * LOG_TYPES as u32 + t as u32;
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
        table.checkpoint_done();
        assert_eq!(table.state(first_seg), SegState::Prefree);
        let dirty = table.take_dirty_sit_blocks();
        table.checkpoint_done();
        assert_eq!(table.state(first_seg), SegState::Free);
        assert_eq!(table.free_count(), free_before + 1);
        table.check_invariants().unwrap();
        assert!(dirty.iter().any(|(i, _)| *i == 0));
        assert!(table.take_dirty_sit_blocks().is_empty());
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
}
