//! Phase 8 of the check, the checkpoint's counters, and `--repair`: what is derived data (a
//! superblock copy, the SIT, the SSA, the counters) is rewritten from the walk and committed as
//! a new checkpoint; nothing else is touched.

use super::nodes::Owners;
use super::space::sit_block_from;
use super::NodeInfo;
use super::{Fsck, Loaded, Trees};
use crate::checkpoint::{commit, CommitSet};
use crate::error::{Result, Structure};
use crate::format::sit::SitEntry;
use crate::format::superblock::SB_ADDRS;
use crate::format::{SegNo, SegmentSummary, SitBlock};
use std::collections::BTreeMap;

/// Phase 8's findings: the counts the walk found, and what is wrong with the recorded ones.
pub(super) struct Counters {
    /// (valid blocks, valid nodes, valid inodes) as the walk found them.
    counts: (u64, u64, u64),
    /// Preallocated, unwritten blocks the trees hold.
    unwritten: u64,
    bad: bool,
    max_generation: u64,
    generation_bad: bool,
}

/// What a repair rewrites: the SIT entries and summaries the space phases found wrong, and the
/// counters.
pub(super) struct Fixes {
    pub sit: BTreeMap<SegNo, SitEntry>,
    pub ssa: Vec<SegmentSummary>,
    pub counters: Counters,
}

impl Fsck<'_> {
    /// 8. The checkpoint's block, node, inode and reserved counts, and its generation counter.
    pub(super) fn check_counters(
        &mut self,
        l: &Loaded,
        owners: &Owners,
        nodes: &BTreeMap<u32, NodeInfo>,
        trees: &Trees,
    ) -> Counters {
        let (cp, inos, unwritten) = (&l.cp, &trees.inos, trees.unwritten);
        let valid_blocks = owners.len() as u64;
        let counts = (valid_blocks, nodes.len() as u64, inos.len() as u64);
        let recorded = (cp.valid_blocks, cp.valid_nodes, cp.valid_inodes);
        let mut counters_bad = counts != recorded;
        if counters_bad {
            self.problem(
                Structure::Checkpoint,
                format!("counters (blocks, nodes, inodes) are {recorded:?}, the walk found {counts:?}"),
                true,
            );
        }
        if cp.reserved_blocks != unwritten {
            counters_bad = true;
            self.problem(
                Structure::Checkpoint,
                format!(
                    "the checkpoint counts {} reserved blocks, the trees hold {unwritten} unwritten ones",
                    cp.reserved_blocks
                ),
                true,
            );
        }
        // The generation counter is past every inode's generation, or a reused inode number
        // could get one a file handle still names. (0 before any inode has one; past 2^32 the
        // low bits have wrapped and nothing can be told.)
        let max_generation =
            nodes.values().filter_map(|n| n.inode.as_ref()).map(|i| i.generation as u64).max().unwrap_or(0);
        let generation_bad = max_generation != 0
            && cp.next_generation <= u32::MAX as u64
            && max_generation >= cp.next_generation;
        if generation_bad {
            self.problem(
                Structure::Checkpoint,
                format!(
                    "generation counter {} is not past inode generation {max_generation}",
                    cp.next_generation
                ),
                true,
            );
        }
        Counters { counts, unwritten, bad: counters_bad, max_generation, generation_bad }
    }

    /// Rewrites the derived structures found wrong, as a new checkpoint (not while the
    /// region's lane journals hold transactions the new checkpoint would leave behind).
    pub(super) fn repair(&mut self, l: Loaded, fixes: Fixes) -> Result<()> {
        let Loaded { sb, bad_sb_copy, mut cp, pack, region, journaled, sit, .. } = l;
        let Fixes { sit: sit_fix, ssa: ssa_fix, counters } = fixes;
        let Counters { counts, unwritten, bad: counters_bad, max_generation, generation_bad } = counters;
        let (dev, g) = (self.dev, sb.geometry);
        if let Some(bad) = bad_sb_copy {
            dev.write_block(SB_ADDRS[bad], &sb.encode())?;
            dev.flush()?;
            self.mark_repaired(Structure::Superblock);
        }
        if !sit_fix.is_empty() || !ssa_fix.is_empty() || counters_bad || generation_bad {
            let mut sit_blocks: BTreeMap<u32, SitBlock> = BTreeMap::new();
            for (segno, e) in sit_fix {
                let (bi, slot) = SitBlock::locate(segno);
                sit_blocks.entry(bi).or_insert_with(|| sit_block_from(&sit, bi, &g)).entries[slot] = e;
            }
            (cp.valid_blocks, cp.valid_nodes, cp.valid_inodes) = counts;
            cp.reserved_blocks = unwritten;
            if generation_bad {
                cp.next_generation = max_generation + 1;
            }
            if journaled != Some(0) {
                // A new checkpoint would leave the region's journals behind (they follow
                // the pack in force, and nothing of theirs is in this one).
                self.report.notes.push(match journaled {
                    Some(n) => format!(
                        "not repaired: the region's lane journals hold {n} transactions since \
                         checkpoint {}; mount the image once (which replays them) and run fsck again",
                        cp.version
                    ),
                    None => "not repaired: the region's lane journals do not decode".to_string(),
                });
                return Ok(());
            }
            cp.version += 1;
            let set =
                CommitSet { nat: Vec::new(), sit: sit_blocks.into_values().collect(), summaries: ssa_fix };
            if let Some((nvm, _)) = &region {
                // The region's side of a checkpoint that changes no NAT entry (protocol
                // in `crate::pmem`): the last log in place, an empty log for the new one.
                nvm.settle(cp.version - 1)?;
                nvm.stage(cp.version, &[])?;
            }
            commit(dev, &g, &mut cp, pack, &set)?;
            if let Some((nvm, log)) = &region {
                nvm.apply(cp.version)?;
                log.reset(nvm.region(), cp.version)?;
            }
            for s in [Structure::Sit, Structure::Ssa, Structure::Checkpoint] {
                self.mark_repaired(s);
            }
        }
        Ok(())
    }
}
