//! Mount's third phase: the space the kept chains use, and the chains this mount writes.
//!
//! Until the post-recovery checkpoint is durable, no block a kept chain uses (its journal
//! blocks, and the data its records map) may be written again: their segments stay out of the
//! free map and the logs holding them move on. A chain this mount starts never reuses a seq
//! of the chain it replaces, so a stale block can never join it.

use crate::checkpoint::read_summary;
use crate::device::BlockDevice;
use crate::engine::JOURNAL_LOG;
use crate::error::Result;
use crate::format::layout::{Geometry, SegNo, BLOCKS_PER_SEG};
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::format::Checkpoint;
use crate::journal::{ChainRead, ChainWriter, Record};
use crate::seg::{LaneSet, SegmentTable};
use crate::sync::rank::{Mutex, Rank};

use super::walk::{newer_data_refs, Journals};

/// Protects what the chains use until the post-recovery checkpoint is durable: the segments of
/// journal blocks and of data that replay may install stay out of the free map (prefree);
/// replay marks a block valid when it installs it. Logs whose active segment holds such blocks
/// move on to fresh segments, and the segment summaries learn the owners of the data blocks.
pub(super) fn protect_journaled_blocks(
    dev: &dyn BlockDevice,
    g: &Geometry,
    cp: &Checkpoint,
    table: &SegmentTable,
    lanes: &LaneSet,
    journals: &Journals,
) -> Result<()> {
    // Runs before the first write of the mount: the chains it protects are those walked.
    debug_assert_eq!(journals.reads.len(), cp.lanes.len(), "one chain read per lane");
    let mut touched_segs = std::collections::BTreeSet::new();
    let journal_blocks = journals.reads.iter().flat_map(|r| r.blocks.iter().copied());
    let data = journals.transactions().flat_map(|t| newer_data_refs(t, cp.stamp)).map(|(a, _)| a as u64);
    for b in journal_blocks.chain(data) {
        // The walk accepted only main-area blocks, and `validate_geometry` only main-area data:
        // a block outside it would go unprotected and could be overwritten before the
        // post-recovery checkpoint.
        debug_assert!(g.in_main(b), "journaled block {b} outside the main area");
        // Once per segment: a GiB of replayed data is a quarter million blocks.
        if let Some((segno, _)) = g.seg_of(b) {
            if touched_segs.insert(segno) {
                table.claim_for_journal(segno)?;
            }
        }
    }
    // The journal heads this mount starts were reserved in the checkpoint's journal log:
    // that segment always moves, so no old chain block is overwritten in place.
    for lane in &cp.lanes {
        if let Some((segno, _)) = g.seg_of(lane.journal_head as u64) {
            touched_segs.insert(segno);
        }
    }
    debug_assert!(
        touched_segs.len() as u64 <= g.main_segments as u64,
        "{} segments touched",
        touched_segs.len()
    );
    lanes.retire_touched(cp.elapsed_secs, |segno| touched_segs.contains(&segno))?;
    lanes.patch_summaries(&summary_patches(g, journals), |segno| {
        read_summary(dev, g, segno).unwrap_or_else(|_| crate::format::SegmentSummary::empty(segno))
    });
    Ok(())
}

/// The owners of the data blocks the journals map, per segment, for the segment summaries
/// (never written for blocks after the checkpoint).
fn summary_patches(
    g: &Geometry,
    journals: &Journals,
) -> std::collections::BTreeMap<SegNo, Vec<(u32, SummaryEntry)>> {
    let mut patches: std::collections::BTreeMap<SegNo, Vec<(u32, SummaryEntry)>> = Default::default();
    let mut entries_seen = 0usize;
    for t in journals.transactions() {
        for rec in &t.records {
            let Record::Map { ino, first, entries, .. } = rec else { continue };
            entries_seen += entries.len();
            for (i, &(addr, _)) in entries.iter().enumerate() {
                if let Some((segno, off)) = g.seg_of(addr as u64) {
                    let e =
                        SummaryEntry { kind: SummaryKind::Data, nid: *ino, ofs: (first + i as u64) as u32 };
                    patches.entry(segno).or_default().push((off, e));
                }
            }
        }
    }
    // At most one patch per map entry (holes and unwritten blocks have none).
    debug_assert!(patches.values().map(Vec::len).sum::<usize>() <= entries_seen, "more patches than entries");
    // `patch_summaries` indexes each segment's summary by these.
    debug_assert!(patches
        .iter()
        .all(|(&s, p)| g.has_segment(s) && p.iter().all(|&(o, _)| o < BLOCKS_PER_SEG)));
    patches
}

/// The chain writer of each lane for this mount, and its flushed-through marks. After a
/// recovery that touched anything, every lane starts a fresh chain at a newly reserved head
/// (with the seq past both what it read and what the checkpoint gave); otherwise each resumes
/// where its chain ends.
pub(super) fn start_chains(
    lanes: &LaneSet,
    cp: &Checkpoint,
    nonce: u64,
    reads: &[ChainRead],
    touched: bool,
) -> Result<(Vec<Mutex<ChainWriter>>, Vec<crate::journal::ChainMarks>)> {
    assert_eq!(reads.len(), cp.lanes.len(), "one chain read per lane");
    debug_assert_eq!(lanes.lane_count() as usize, reads.len(), "one lane per chain");
    let g = *lanes.table().geometry();
    let mut chains = Vec::with_capacity(reads.len());
    let mut chain_marks = Vec::with_capacity(reads.len());
    for (l, r) in reads.iter().enumerate() {
        let w = if touched || cp.lanes[l].journal_head == 0 {
            let owner = SummaryEntry { kind: SummaryKind::Journal, nid: l as u32, ofs: 0 };
            let head = lanes.reserve(l as u32, JOURNAL_LOG, owner, cp.elapsed_secs)? as u32;
            ChainWriter::new(l as u16, nonce, head, r.end_seq.max(cp.lanes[l].journal_seq))
        } else {
            ChainWriter::resume(l as u16, nonce, r.end())
        };
        // Never behind the checkpoint: a seq reused would let a stale block join the chain.
        debug_assert!(w.position().1 >= cp.lanes[l].journal_seq);
        // Nor behind what the walk read: a kept block's seq would be written again.
        debug_assert!(w.position().1 >= r.end_seq, "lane {l} restarts behind its chain");
        // The next block is one the lane reserved or the walk found the chain pointing at.
        debug_assert!(g.in_main(w.position().0 as u64), "lane {l} chain at block {}", w.position().0);
        chain_marks.push(crate::journal::ChainMarks::new(w.position().1));
        chains.push(Mutex::new(Rank::Chain, w));
    }
    debug_assert!(chains.len() == cp.lanes.len() && chain_marks.len() == chains.len());
    Ok((chains, chain_marks))
}
