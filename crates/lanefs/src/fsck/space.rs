//! Phases 3 to 5 of the check: the space. No block is owned twice or outside the main area,
//! the SIT's valid counts and bitmaps equal the owned blocks, no block past an active log's
//! cursor is owned, and the SSA names each block's owner. What is wrong here is derived data:
//! the fixes are returned for `--repair`.

use super::nodes::Owners;
use super::Fsck;
use crate::checkpoint;
use crate::error::Structure;
use crate::format::layout::{Geometry, SegNo};
use crate::format::sit::SitEntry;
use crate::format::{Checkpoint, SegmentSummary, SitBlock, SummaryEntry};
use std::collections::{BTreeMap, HashMap};

/// Owned blocks by segment: (offset in the segment, owner).
pub(super) type BySegment = BTreeMap<SegNo, Vec<(u32, SummaryEntry)>>;

/// The owned blocks of `owners` by segment.
pub(super) fn by_segment(g: &Geometry, owners: &Owners) -> BySegment {
    let mut expected: BySegment = BTreeMap::new();
    for (&addr, &o) in owners {
        if let Some((s, off)) = g.seg_of(addr as u64) {
            expected.entry(s).or_default().push((off, o));
        }
    }
    expected
}

impl Fsck<'_> {
    /// 4. The SIT against the owned blocks; the entries a repair writes.
    pub(super) fn check_sit(
        &mut self,
        g: &Geometry,
        sit: &[SitEntry],
        expected: &BySegment,
    ) -> BTreeMap<SegNo, SitEntry> {
        let mut sit_fix: BTreeMap<SegNo, SitEntry> = BTreeMap::new();
        for segno in g.segments() {
            if segno.0.is_multiple_of(1024) {
                (self.progress)("segments", segno.0 as u64, g.main_segments as u64);
            }
            let have = &sit[segno.index()];
            let mut want = have.clone();
            want.bitmap = [0; 64];
            want.valid_blocks = 0;
            for &(off, _) in expected.get(&segno).map(Vec::as_slice).unwrap_or(&[]) {
                want.set_valid(off);
            }
            if want.bitmap != have.bitmap || want.valid_blocks != have.valid_blocks {
                self.problem(
                    Structure::Sit,
                    format!(
                        "segment {segno}: SIT says {} valid blocks, the tree owns {}",
                        have.valid_blocks, want.valid_blocks
                    ),
                    true,
                );
                sit_fix.insert(segno, want);
            }
        }
        sit_fix
    }

    /// 4. No segment is active in two logs, and no owned block lies past a log's cursor.
    pub(super) fn check_active_logs(&mut self, cp: &Checkpoint, expected: &BySegment) {
        let mut active: HashMap<SegNo, (usize, u16)> = HashMap::new();
        for (l, lane) in cp.lanes.iter().enumerate() {
            for c in &lane.logs {
                if active.insert(c.segno, (l, c.next_off)).is_some() {
                    self.problem(
                        Structure::Checkpoint,
                        format!("segment {} is active in two logs", c.segno),
                        false,
                    );
                }
                if let Some(owned) = expected.get(&c.segno) {
                    if let Some(&(off, _)) = owned.iter().find(|(off, _)| *off >= c.next_off as u32) {
                        self.problem(
                            Structure::Checkpoint,
                            format!("lane {l}: block {off} of active segment {} is owned but past the write cursor {}", c.segno, c.next_off),
                            false,
                        );
                    }
                }
            }
        }
    }

    /// 5. The SSA names each owned block's owner; the summaries a repair writes.
    pub(super) fn check_ssa(&mut self, g: &Geometry, expected: &BySegment) -> Vec<SegmentSummary> {
        let dev = self.dev;
        let mut ssa_fix: Vec<SegmentSummary> = Vec::new();
        let check_segs: Vec<SegNo> = expected.keys().copied().collect();
        for segno in check_segs {
            let owned = &expected[&segno];
            let mut want = match checkpoint::read_summary(dev, g, segno) {
                Ok(s) => s,
                Err(e) => {
                    self.problem(Structure::Ssa, format!("segment {segno}: {e}"), true);
                    let mut s = SegmentSummary::empty(segno);
                    for &(off, o) in owned {
                        s.entries[off as usize] = o;
                    }
                    ssa_fix.push(s);
                    continue;
                }
            };
            let mut bad = 0;
            for &(off, o) in owned {
                if want.entries[off as usize] != o {
                    bad += 1;
                    want.entries[off as usize] = o;
                }
            }
            if bad > 0 {
                self.problem(
                    Structure::Ssa,
                    format!("segment {segno}: {bad} blocks name the wrong owner"),
                    true,
                );
                ssa_fix.push(want);
            }
        }
        ssa_fix
    }
}

pub(super) fn sit_block_from(sit: &[SitEntry], index: u32, g: &Geometry) -> SitBlock {
    let mut b = SitBlock::empty(index);
    for (slot, e) in b.entries.iter_mut().enumerate() {
        let segno = (index * crate::format::layout::SIT_ENTRIES_PER_BLOCK) as usize + slot;
        if segno < g.main_segments as usize {
            *e = sit[segno].clone();
        }
    }
    b
}
