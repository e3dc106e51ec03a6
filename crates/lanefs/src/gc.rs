//! Segment cleaning: turning dirty segments with invalid blocks back into free ones.
//!
//! Job. A log never overwrites in place, so every overwrite and delete leaves an invalid block
//! behind in some full segment. The cleaner picks victim segments from the SIT, finds the owner
//! of each valid block through the segment summary (SSA), and asks for that block to be moved:
//! a data block is recorded in its inode's relocation list, a node block is marked for
//! rewriting in its inode's tree, the inode's own node and xattr node simply by making the
//! inode dirty, an xattr block in the relocation list of its inode's xattr set. The next checkpoint then writes every such block to a new place through the
//! normal write path (data to the data logs, cold; nodes to the node logs), which invalidates
//! the old copy; the victim, now empty, becomes prefree when the checkpoint takes the SIT and
//! free once that checkpoint is durable, as ARCHITECTURE.md requires.
//!
//! Why the move happens inside the checkpoint and not here: the checkpoint's write phase is the
//! one place that already rewrites trees and decides block validity while fsync and writeback
//! wait at the gate, so a move needs no lock of its own. Foreground writers never wait for the
//! cleaner: it takes no range lock and touches no page. A move is a compare-and-swap on the
//! inode's mapping (the block is installed only if the file still maps that index to the old
//! address), so a concurrent write, truncate or delete simply wins, and the old block dies
//! with the rest of the superseded data. A crash at any point loses only the intent: nothing on
//! disk changes until the checkpoint commits.
//!
//! Policies: foreground cleaning (an allocation would otherwise fail with ENOSPC) is greedy —
//! fewest valid blocks first; background cleaning (free segments below a threshold and the file
//! system quiet) uses cost-benefit on the SIT's utilisation and age.
//!
//! Invariants: a round never plans more moves than the free segments can take: the segments
//! its checkpoint opens for the victims' valid blocks, the nodes they dirty and what dirty data
//! already claims, counted per log with the room left in each open segment, are at most the
//! free ones; each round is bounded in victims and in blocks read; only one round runs at a
//! time.

use crate::engine::Engine;
use crate::error::Result;
use crate::format::layout::{SegNo, BLOCKS_PER_SEG};
use crate::format::ssa::{SegmentSummary, SummaryKind};
use crate::format::tree::XATTR_NODE_OFS;
use crate::seg::{Victim, VictimPolicy};
use crate::sync::rank::{Mutex, Rank};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

/// Cleaning rounds an allocation may wait for before it gets ENOSPC.
pub const FOREGROUND_ROUNDS: usize = 24;

/// Victims one round considers at most (bounds the SSA reads and the checkpoint's work).
const MAX_VICTIMS: usize = 64;

/// Blocks of slack a round leaves free beyond its plan (node blocks of directories touched
/// meanwhile, a pack's worth of metadata).
const SLACK_BLOCKS: u64 = 64;

/// The cleaner's state and counters.
pub struct Cleaner {
    /// One round at a time (foreground callers queue here; the background one skips).
    round: Mutex<()>,
    /// Rounds run and segments they emptied, since mount.
    pub rounds: AtomicU64,
    pub segments_cleaned: AtomicU64,
    /// Blocks the cleaner asked to move (data and nodes), since mount.
    pub blocks_planned: AtomicU64,
    /// Victims planned but not yet seen emptied by a checkpoint.
    pending_victims: Mutex<Vec<SegNo>>,
    /// Blocks planned rounds asked the next checkpoint to write, by where they go
    /// ([`MoveCost`]): the checkpoint picks its lane by them.
    moves_data: AtomicU64,
    moves_other: AtomicU64,
}

impl Default for Cleaner {
    fn default() -> Self {
        Cleaner {
            round: Mutex::new(Rank::GcRound, ()),
            rounds: AtomicU64::new(0),
            segments_cleaned: AtomicU64::new(0),
            blocks_planned: AtomicU64::new(0),
            pending_victims: Mutex::new(Rank::GcVictims, Vec::new()),
            moves_data: AtomicU64::new(0),
            moves_other: AtomicU64::new(0),
        }
    }
}

/// What one round planned.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RoundPlan {
    pub victims: usize,
    /// Valid blocks asked to move.
    pub blocks: u64,
    /// Invalid blocks the victims will give back.
    pub gain: u64,
}

impl Engine {
    /// Free segments below which background cleaning starts.
    pub(crate) fn gc_threshold(&self) -> u64 {
        (self.disk.g.main_segments as u64 / 8).max(self.disk.g.cleaning_reserve() + 2)
    }

    /// Free segments are so few that the background cleaner runs even under load: a busy
    /// writer's foreground rounds come only once admission refuses, and by then ordinary
    /// checkpoints (each may open a fresh segment in every log it writes) may have taken the
    /// reserve's segments the cleaner's own checkpoint needs.
    pub(crate) fn gc_urgent(&self) -> bool {
        self.disk.table.free_segments()
            < self.disk.g.cleaning_reserve() + crate::format::layout::LOG_TYPES as u64
    }

    /// Foreground cleaning: makes room for `want` more blocks if dirty segments hold enough
    /// invalid ones. Returns false when no round could be planned (nothing left to clean within
    /// the free space). Call it outside the pass-through semaphore and the gate: it waits for a
    /// checkpoint.
    pub(crate) fn clean_foreground(&self, want: u64) -> Result<bool> {
        let before = self.disk.table.free_segments();
        let round = self.ckpt.gc.round.lock();
        // Someone else cleaned while this caller waited: let it look again.
        if self.disk.table.free_segments() > before {
            return Ok(true);
        }
        let plan = self.plan_round(VictimPolicy::Greedy, want + BLOCKS_PER_SEG as u64)?;
        if plan.victims == 0 {
            return Ok(false);
        }
        // The round lock is still held: the checkpoint waited for performs this round's moves.
        debug_assert!(plan.victims <= MAX_VICTIMS && plan.gain > 0, "foreground round {plan:?}");
        // Moves come from the victims' valid blocks only: never more than they hold.
        debug_assert!(plan.blocks < plan.victims as u64 * BLOCKS_PER_SEG as u64, "foreground round {plan:?}");
        self.wait_for_checkpoint()?;
        drop(round);
        Ok(true)
    }

    /// Background cleaning: one cost-benefit round and a checkpoint, if free segments are
    /// below the threshold. Returns what it planned (nothing when another round is running).
    pub(crate) fn clean_background(&self) -> Result<RoundPlan> {
        if self.disk.table.free_segments() >= self.gc_threshold() {
            return Ok(RoundPlan::default());
        }
        let Some(_round) = self.ckpt.gc.round.try_lock() else { return Ok(RoundPlan::default()) };
        // Read once more, and once: a checkpoint another thread took since (an fsync whose
        // transaction did not fit takes one itself) may have freed segments, and a second
        // read for the subtraction could find more free than the threshold.
        let Some(short) = self.gc_threshold().checked_sub(self.disk.table.free_segments()).filter(|&n| n > 0)
        else {
            return Ok(RoundPlan::default());
        };
        let want = short * BLOCKS_PER_SEG as u64;
        let plan = self.plan_round(VictimPolicy::CostBenefit { now: self.disk.elapsed_secs() }, want)?;
        debug_assert!(plan.victims <= MAX_VICTIMS, "background round {plan:?}");
        // A round that planned no victim planned nothing: no move, no gain to wait for.
        debug_assert!(plan.victims > 0 || (plan.blocks == 0 && plan.gain == 0), "background round {plan:?}");
        if plan.victims > 0 {
            self.checkpoint(false)?;
        }
        Ok(plan)
    }

    /// Cleans until no victim is left that gives back space (tests, `sync`-like callers).
    /// Returns the segments freed.
    pub fn clean_all(&self) -> Result<u64> {
        let before = self.ckpt.gc.segments_cleaned.load(Ordering::Relaxed);
        // Blocks that dirty data overwrote die with a checkpoint: take it first, so that the
        // victims show all their invalid blocks.
        if self.mem.dirty_inodes.sum() > 0 {
            self.checkpoint(false)?;
        }
        // Bounded: each round empties at least one victim or stops.
        for _ in 0..self.disk.g.main_segments {
            let _round = self.ckpt.gc.round.lock();
            let plan = self.plan_round(VictimPolicy::Greedy, u64::MAX / 2)?;
            if plan.victims == 0 {
                break;
            }
            debug_assert!(plan.victims <= MAX_VICTIMS && plan.gain > 0, "round {plan:?}");
            self.checkpoint(false)?;
        }
        let cleaned = self.ckpt.gc.segments_cleaned.load(Ordering::Relaxed);
        // The counter only grows (`gc_checkpoint_done`).
        debug_assert!(cleaned >= before, "segments cleaned went back from {before} to {cleaned}");
        Ok(cleaned - before)
    }

    /// Chooses victims worth at least `want` blocks of gain (or as many as fit) and records the
    /// moves their valid blocks need. The caller holds the round lock and then has a checkpoint
    /// taken, which performs the moves.
    fn plan_round(&self, policy: VictimPolicy, want: u64) -> Result<RoundPlan> {
        self.check_writable()?;
        // No checkpoint runs while the owners are looked up: summaries of segments filled
        // since the last checkpoint are in memory until it writes them, and the trees the
        // moves are recorded in stay the ones the next checkpoint rewrites. (A checkpoint's
        // write phase holds `cp_serial`, not the gate; the gate keeps fsync and writeback,
        // which move blocks too, out.)
        let _serial = self.ckpt.cp_serial.lock();
        let _gate = self.ckpt.gate.read();
        let _op = self.mem.pass.shared();
        // Room for the moves: the checkpoint that performs them must find every segment it
        // opens among the free ones (the reserve included: this is what it is for). It writes
        // the moved data to its cold data log and, to its other logs, the nodes the moves dirty
        // and whatever else is dirty by then; counted in segments, with the room left in each
        // log's open segment (`LaneSet::checkpoint_segments`), so that a round can still run
        // when an ordinary checkpoint's fresh segments have taken free ones below the reserve.
        let free = self.disk.table.free_segments();
        let committed = self.mem.committed_blocks() + SLACK_BLOCKS;
        let fits = |data: u64, other: u64| {
            self.disk.lanes.checkpoint_segments(data, committed + other, crate::engine::JOURNAL_LOG) <= free
        };
        let (mut data, mut other) = (0u64, 0u64);
        let mut plan = RoundPlan::default();
        let mut cleaned_segs = Vec::new();
        let victims = self.disk.table.victims(policy, MAX_VICTIMS, &[]);
        debug_assert!(victims.len() <= MAX_VICTIMS, "{} victims", victims.len());
        for v in victims {
            if plan.gain >= want {
                break;
            }
            // A victim is a full segment with at least one invalid block: it gives some back.
            debug_assert!(
                self.disk.g.has_segment(v.segno) && (v.valid_blocks as u32) < BLOCKS_PER_SEG,
                "victim {} with {} valid blocks",
                v.segno,
                v.valid_blocks
            );
            let summary = self.summary_of(v.segno)?;
            let cost = move_cost(&v, &summary);
            if !fits(data + cost.data, other + cost.other) {
                // Greedy order: later victims hold more valid blocks, so they cost more too.
                break;
            }
            let moved = self.plan_victim(&v, &summary)?;
            data += cost.data;
            other += cost.other;
            plan.victims += 1;
            plan.blocks += moved;
            plan.gain += BLOCKS_PER_SEG as u64 - v.valid_blocks as u64;
            cleaned_segs.push(v.segno);
        }
        // What the round asks the checkpoint to move is what it counted room for: every block
        // planned is one of the valid ones `move_cost` charged, each victim once.
        debug_assert!(plan.blocks <= data + other, "{plan:?} moves more than the {data} + {other} counted");
        debug_assert_eq!(cleaned_segs.len(), plan.victims);
        // Each victim gives back its invalid blocks and moves at most its valid ones.
        debug_assert!(plan.gain + plan.blocks <= plan.victims as u64 * BLOCKS_PER_SEG as u64, "{plan:?}");
        tracing::debug!("lanefs gc: {policy:?} round {plan:?}: {data} data and {other} other blocks to move, {free} free segments");
        if plan.victims > 0 {
            self.ckpt.gc.rounds.fetch_add(1, Ordering::Relaxed);
            self.ckpt.gc.blocks_planned.fetch_add(plan.blocks, Ordering::Relaxed);
            self.ckpt.gc.pending_victims.lock().extend(cleaned_segs);
            self.ckpt.gc.moves_data.fetch_add(data, Ordering::Relaxed);
            self.ckpt.gc.moves_other.fetch_add(other, Ordering::Relaxed);
        }
        Ok(plan)
    }

    /// The summary of a segment, from memory if it was filled since the last checkpoint.
    fn summary_of(&self, segno: SegNo) -> Result<SegmentSummary> {
        debug_assert!(self.disk.g.has_segment(segno), "summary of segment {segno}");
        let s = match self.disk.lanes.summary_in_memory(segno) {
            Some(s) => s,
            None => crate::checkpoint::read_summary(&*self.disk.dev, &self.disk.g, segno)?,
        };
        // `plan_victim` and `move_cost` index it by block offset.
        debug_assert_eq!(s.entries.len(), BLOCKS_PER_SEG as usize, "summary of segment {segno}");
        Ok(s)
    }

    /// Records a move for every block of victim `v` that is still valid. Returns how many.
    fn plan_victim(&self, v: &Victim, summary: &SegmentSummary) -> Result<u64> {
        // The offsets listed are the valid bits of the SIT entry whose count came with them.
        debug_assert_eq!(v.valid.len(), v.valid_blocks as usize, "victim {} valid offsets", v.segno);
        debug_assert_eq!(summary.entries.len(), BLOCKS_PER_SEG as usize);
        let start = self.disk.g.seg_start(v.segno);
        let mut planned = 0u64;
        for &off in &v.valid {
            let addr = start + off as u64;
            if !self.disk.table.is_valid(addr) {
                continue;
            }
            let e = summary.entries[off as usize];
            let ok = match e.kind {
                SummaryKind::Data => self.plan_data_move(e.nid, e.ofs as u64, addr as u32)?,
                SummaryKind::Node => self.plan_node_move(e.nid, e.ofs, addr as u32)?,
                SummaryKind::Xattr => self.plan_xattr_move(e.nid, e.ofs, addr as u32)?,
                // Journal blocks are never valid; an unsummarised valid block is something
                // fsck will name. Neither can be moved.
                SummaryKind::Journal | SummaryKind::None => false,
            };
            if ok {
                planned += 1;
            } else {
                tracing::debug!("lanefs gc: block {addr} ({e:?}) has no owner to move it");
            }
        }
        // At most one move per valid block of the victim.
        debug_assert!(planned <= v.valid.len() as u64, "victim {}: {planned} moves", v.segno);
        Ok(planned)
    }

    fn plan_data_move(&self, ino: u32, idx: u64, addr: u32) -> Result<bool> {
        // A victim's block (`plan_victim`): a relocation of anything else would install a move
        // from a block no segment accounts for.
        debug_assert!(self.disk.g.in_main(addr as u64), "data move from block {addr}");
        let Ok(m) = self.mnode(ino) else { return Ok(false) };
        // The relocation goes to the inode the summary names, nobody else's.
        debug_assert_eq!(m.ino, ino, "data move of {ino}: the cell of another inode");
        {
            let mut disk = m.disk.lock();
            if disk.cur_map.get(&idx) == Some(&addr) {
                disk.relocate.push((idx, addr));
            } else if disk.tree_map.get(&idx) != Some(&addr) && !disk.garbage.contains(&addr) {
                return Ok(false);
            }
            // Otherwise the block is superseded: the inode's next checkpoint drops it.
        }
        self.mem.mark_dirty(&m);
        Ok(true)
    }

    fn plan_node_move(&self, nid: u32, node_ofs: u32, addr: u32) -> Result<bool> {
        debug_assert!(self.disk.g.in_main(addr as u64), "node move from block {addr}");
        let e = self.disk.nat.get(nid);
        if e.is_free() || e.block_addr != addr {
            return Ok(false);
        }
        let Ok(m) = self.mnode(e.ino) else { return Ok(false) };
        // The move is recorded in the tree of the inode the NAT names, nobody else's.
        debug_assert_eq!(m.ino, e.ino, "node {nid}: the cell of another inode");
        if node_ofs == XATTR_NODE_OFS {
            // Rewritten with the set; its blocks stay where they are.
            m.meta.lock().xattrs.cp_dirty = true;
        } else if node_ofs != 0 {
            let mut disk = m.disk.lock();
            let found = disk.tree.as_mut().is_some_and(|t| t.relocate(nid, node_ofs));
            if !found {
                return Ok(false);
            }
        }
        // The inode node itself is rewritten whenever its inode is checkpointed.
        self.mem.mark_dirty(&m);
        Ok(true)
    }

    /// Xattr block `idx` of inode `ino`, at `addr`: the next checkpoint writes the set and
    /// copies this block (and rewrites the node that lists it).
    fn plan_xattr_move(&self, ino: u32, idx: u32, addr: u32) -> Result<bool> {
        debug_assert!(self.disk.g.in_main(addr as u64), "xattr move from block {addr}");
        let Ok(m) = self.mnode(ino) else { return Ok(false) };
        debug_assert_eq!(m.ino, ino, "xattr move of {ino}: the cell of another inode");
        {
            let mut disk = m.disk.lock();
            if disk.xattr.blocks.get(idx as usize) != Some(&addr) {
                return Ok(false);
            }
            disk.xattr.relocate.push((idx, addr));
        }
        m.meta.lock().xattrs.cp_dirty = true;
        self.mem.mark_dirty(&m);
        Ok(true)
    }

    /// The lane a checkpoint writes in: the one where the moves planned for it (and a slack's
    /// worth of dirty metadata) open the fewest fresh segments, as `plan_round` counted.
    pub(crate) fn checkpoint_lane(&self) -> u32 {
        let data = self.ckpt.gc.moves_data.load(Ordering::Relaxed);
        let other = self.ckpt.gc.moves_other.load(Ordering::Relaxed) + SLACK_BLOCKS;
        let lane = self.disk.lanes.checkpoint_lane(data, other);
        debug_assert!(lane < self.disk.lanes.lane_count(), "checkpoint lane {lane}");
        lane
    }

    /// After a checkpoint: counts the planned victims that it emptied.
    pub(crate) fn gc_checkpoint_done(&self) {
        let rounds = self.ckpt.gc.rounds.load(Ordering::Relaxed);
        // Each round adds at most MAX_VICTIMS victims, and only one that planned any.
        debug_assert!(
            self.ckpt.gc.pending_victims.lock().len() as u64 <= rounds.saturating_mul(MAX_VICTIMS as u64),
            "more pending victims than {rounds} rounds planned"
        );
        self.ckpt.gc.moves_data.store(0, Ordering::Relaxed);
        self.ckpt.gc.moves_other.store(0, Ordering::Relaxed);
        let mut pending = self.ckpt.gc.pending_victims.lock();
        if pending.is_empty() {
            return;
        }
        // Victims a move missed (a concurrent change won) are picked again by a later round.
        for s in std::mem::take(&mut *pending) {
            debug_assert!(self.disk.g.has_segment(s), "pending victim {s}");
            if self.disk.table.valid_blocks(s) == 0 {
                self.ckpt.gc.segments_cleaned.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Tells the device that freed segments hold nothing (TRIM; a hole in an image file).
    /// Failures are logged, not returned: discard is advice.
    pub(crate) fn discard_segments(&self, segs: &[SegNo]) {
        for &s in segs {
            // A discard past the main area would drop the metadata areas' or beyond the device.
            debug_assert!(self.disk.g.has_segment(s), "discard of segment {s}");
            if let Err(e) = self.disk.dev.discard(self.disk.g.seg_start(s), BLOCKS_PER_SEG as u64) {
                tracing::warn!("lanefs: discard of segment {s} failed: {e}");
                return;
            }
        }
    }
}

/// Blocks a victim's moves will write, by where they go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MoveCost {
    /// Valid data blocks: the checkpoint's cold data log.
    data: u64,
    /// Node and xattr blocks, and for every inode owning a block an inode node and the direct
    /// node that maps its moved blocks (assume one each): the other logs.
    other: u64,
}

fn move_cost(v: &Victim, summary: &SegmentSummary) -> MoveCost {
    debug_assert_eq!(summary.entries.len(), BLOCKS_PER_SEG as usize);
    let mut inodes = BTreeSet::new();
    let mut cost = MoveCost { data: 0, other: 0 };
    for &off in &v.valid {
        debug_assert!(off < BLOCKS_PER_SEG, "victim {} offset {off}", v.segno);
        let e = summary.entries[off as usize];
        inodes.insert(e.nid);
        if e.kind == SummaryKind::Data {
            cost.data += 1;
        } else {
            cost.other += 1;
        }
    }
    debug_assert!(inodes.len() <= v.valid.len());
    cost.other += 2 * inodes.len() as u64;
    // One block per valid block, plus an inode node and a direct node per owner.
    debug_assert_eq!(cost.data + cost.other, (v.valid.len() + 2 * inodes.len()) as u64);
    cost
}

#[cfg(test)]
mod tests {
    //! The cleaner when ordinary checkpoints have taken free segments below the reserve: each
    //! may open a fresh segment in every log it writes, so a file system with two-thirds of its
    //! space invalid can be left with fewer free segments than log types, and nothing dirty.
    //! A round must still run there (it once planned nothing, and every write got ENOSPC).

    use crate::device::{create_image, BlockDevice, DeviceOptions, FileDevice};
    use crate::format::layout::{LogType, BLOCKS_PER_SEG, LOG_TYPES};
    use crate::format::ssa::{SummaryEntry, SummaryKind};
    use crate::fsck::{check, FsckOptions};
    use crate::{Fs, FsOptions, MkfsOptions, ROOT};
    use std::sync::Arc;

    const PAGE: usize = 4096;

    fn page(seed: u64) -> Vec<u8> {
        (0..PAGE / 8)
            .flat_map(|i| (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_round_runs_when_checkpoints_took_free_segments_below_the_reserve() {
        let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
        let dir = tempfile::Builder::new().prefix("lanefs-gc-unit-").tempdir_in(base).unwrap();
        let path = dir.path().join("gc.img");
        create_image(&path, 160 << 20).unwrap();
        let open =
            || Arc::new(FileDevice::open(&path, DeviceOptions::default()).unwrap()) as Arc<dyn BlockDevice>;
        Fs::format(&*open(), &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
        let opts = FsOptions { cache_bytes: 4 << 20, checkpoint_interval: None, ..Default::default() };
        let fs = Fs::open(open(), opts.clone()).unwrap();
        let e = fs.engine.clone();

        // A file over half the user space, then every other page of it overwritten: its first
        // segments are half invalid, and nothing is dirty.
        let pages = e.disk.g.user_blocks() as usize * 55 / 100;
        let ino = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap().ino;
        let small: Vec<u32> = (0..128)
            .map(|i| fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino as u32)
            .collect();
        let mut want: Vec<u64> = (0..pages as u64).collect();
        for chunk in (0..pages).collect::<Vec<_>>().chunks(64) {
            let buf: Vec<u8> = chunk.iter().flat_map(|&p| page(p as u64)).collect();
            fs.write_at(ino, (chunk[0] * PAGE) as u64, &buf).unwrap();
        }
        fs.sync().unwrap();
        for p in (0..pages).step_by(2) {
            want[p] = (pages + p) as u64;
            fs.write_at(ino, (p * PAGE) as u64, &page(want[p])).unwrap();
        }
        fs.sync().unwrap();

        // Ordinary checkpoints that each open a fresh node segment (a small file's inode node
        // goes to the warm node log, which every lane has full, and stays valid there), until
        // fewer segments are free than there are log types. The round lock keeps the
        // background cleaner out meanwhile.
        let round = e.ckpt.gc.round.lock();
        let junk = |lane: u32| SummaryEntry { kind: SummaryKind::Journal, nid: lane, ofs: 0 };
        for &f in &small {
            if e.disk.table.free_segments() < LOG_TYPES as u64 {
                break;
            }
            for lane in 0..e.disk.lanes.lane_count() {
                let at = e.disk.lanes.cursors()[lane as usize][LogType::WarmNode as usize].next_off as u32;
                for _ in at..BLOCKS_PER_SEG {
                    e.disk.lanes.reserve(lane, LogType::WarmNode, junk(lane), 1).unwrap();
                }
            }
            e.mem.mark_dirty(&e.mnode(f).unwrap());
            e.checkpoint(false).unwrap();
        }
        drop(round);
        let free = e.disk.table.free_segments();
        assert!(free < LOG_TYPES as u64 && free > 0, "{free} free segments");
        assert_eq!(e.mem.committed_blocks(), 0);
        assert!(e.disk.table.valid_count() < e.disk.g.user_blocks() * 2 / 3, "most of the space is garbage");

        // Overwrites (each needs a round when they reach the reserve) keep succeeding.
        for (k, p) in (1..pages).step_by(2).take(4 * BLOCKS_PER_SEG as usize).enumerate() {
            want[p] = (2 * pages + p) as u64;
            fs.write_at(ino, (p * PAGE) as u64, &page(want[p]))
                .unwrap_or_else(|err| panic!("overwrite {k} with {free} free segments at the start: {err}"));
            if k % 256 == 255 {
                fs.sync().unwrap();
            }
        }
        assert!(e.ckpt.gc.rounds.load(std::sync::atomic::Ordering::Relaxed) > 0, "the cleaner ran");
        drop(e);
        fs.unmount().unwrap();

        let r = check(&*open(), &FsckOptions::default()).unwrap();
        assert!(r.is_clean(), "fsck: {:#?}", r.problems);
        let fs = Fs::open(open(), opts).unwrap();
        let mut buf = vec![0u8; PAGE];
        for (p, &seed) in want.iter().enumerate() {
            fs.read_at(ino, (p * PAGE) as u64, &mut buf).unwrap();
            assert!(buf == page(seed), "page {p} after the remount");
        }
        fs.unmount().unwrap();
    }
}
