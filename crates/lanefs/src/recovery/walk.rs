//! Mount's second phase: every lane's journal chain walked from the head its checkpoint
//! recorded, and each transaction's data checked before it is kept.
//!
//! A lane ends at its first transaction whose data did not reach the disk: later ones may
//! depend on it. Transactions a flushed-through mark proves durable are not read back (see
//! [`verified_prefix`] for why that is safe). The region's lane journals are proven whole.

use crate::checkpoint::read_blocks;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::engine::FsOptions;
use crate::error::Result;
use crate::format::layout::Geometry;
use crate::format::node::NEW_ADDR;
use crate::format::Checkpoint;
use crate::journal::{merge_by_stamp, read_chain, ChainRead, Record, Transaction};

use super::RecoveryReport;

/// Walks lane `l`'s chain from the head its checkpoint records and keeps the transactions
/// whose data is intact: the read, how many transactions were torn, and how many data blocks
/// were read to find out.
fn walk_lane(
    dev: &dyn BlockDevice,
    g: &Geometry,
    cp: &Checkpoint,
    nonce: u64,
    no_recovery: bool,
    l: usize,
) -> Result<(ChainRead, usize, u64)> {
    // The checkpoint decoder keeps one lane record per lane of the geometry.
    debug_assert!(l < cp.lanes.len() && cp.lanes.len() == g.lanes as usize, "lane {l} of {}", cp.lanes.len());
    let lane = &cp.lanes[l];
    if lane.journal_head == 0 || no_recovery {
        return Ok((ChainRead::empty(lane.journal_head, lane.journal_seq), 0, 0));
    }
    let mut r = read_chain(dev, g, l as u16, nonce, lane.journal_head, lane.journal_seq, g.main_blocks())?;
    let read = r.transactions.len();
    let (kept, checked) = verified_prefix(dev, &r.transactions, r.proven(), cp.stamp)?;
    assert!(kept <= read, "kept {kept} of {read} transactions read");
    r.truncate(kept);
    // The chain only moves forward from the head the checkpoint gave it.
    debug_assert!(r.end_seq >= lane.journal_seq);
    debug_assert!(r.starts.windows(2).all(|w| w[0].seq < w[1].seq));
    // Dropped transactions' blocks stay listed: they are protected from reuse all the same.
    debug_assert!(r.blocks.len() as u64 >= r.end_seq - lane.journal_seq, "lane {l}: blocks dropped");
    Ok((r, read - kept, checked))
}

/// The journals: each lane's chain is walked (and its transactions' data checked) on a thread
/// of its own, since the lanes are independent until their records are merged. One read per
/// lane, in lane order; the counts go to `report`.
pub(super) fn walk_lanes(
    dev: &dyn BlockDevice,
    g: &Geometry,
    cp: &Checkpoint,
    nonce: u64,
    opts: &FsOptions,
    report: &mut RecoveryReport,
) -> Result<Vec<ChainRead>> {
    let walk = |l: usize| walk_lane(dev, g, cp, nonce, opts.no_recovery, l);
    let walked: Vec<Result<(ChainRead, usize, u64)>> = if cp.lanes.len() > 1 {
        std::thread::scope(|scope| {
            let walk = &walk;
            let handles: Vec<_> = (0..cp.lanes.len()).map(|l| scope.spawn(move || walk(l))).collect();
            // A walk that panicked is a bug in the decoder: the mount fails with it.
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        })
    } else {
        (0..cp.lanes.len()).map(walk).collect()
    };
    let mut reads: Vec<ChainRead> = Vec::with_capacity(cp.lanes.len());
    for w in walked {
        let (r, torn, checked) = w?;
        report.torn_transactions += torn;
        report.data_blocks_checked += checked;
        report.transactions += r.transactions.len();
        report.journal_blocks += r.blocks.len() as u64;
        report.lanes += usize::from(!r.transactions.is_empty());
        report.bytes += r.transactions.iter().map(|t| t.encoded_len() as u64).sum::<u64>();
        reads.push(r);
    }
    assert_eq!(reads.len(), cp.lanes.len(), "one chain read per lane");
    debug_assert!(report.lanes <= cp.lanes.len(), "{} lanes replay of {}", report.lanes, cp.lanes.len());
    Ok(reads)
}

/// The region's lane journals: a transaction is committed there only after a device flush
/// that followed the writes of every data block it maps (`Engine::commit_to_region`), so all
/// are proven and none is read back. Returns them per lane, the counts going to `report`.
pub(super) fn check_region_txns(
    dev: &dyn BlockDevice,
    cp: &Checkpoint,
    mut region_txns: Vec<Vec<Transaction>>,
    reads: &[ChainRead],
    report: &mut RecoveryReport,
) -> Result<Vec<Vec<Transaction>>> {
    // The region's journals have one slice per lane of the geometry (or none were read).
    debug_assert!(
        region_txns.is_empty() || region_txns.len() == reads.len(),
        "{} region journals for {} lanes",
        region_txns.len(),
        reads.len()
    );
    for (l, t) in region_txns.iter_mut().enumerate() {
        let (kept, checked) = verified_prefix(dev, t, t.len(), cp.stamp)?;
        assert!(kept <= t.len(), "kept {kept} of {} region transactions", t.len());
        report.data_blocks_checked += checked;
        report.torn_transactions += t.len() - kept;
        t.truncate(kept);
        report.transactions += kept;
        report.bytes += t.iter().map(|t| t.encoded_len() as u64).sum::<u64>();
        // A lane counts once, whether its transactions were on the device or in the region.
        let on_device = reads.get(l).is_some_and(|r| !r.transactions.is_empty());
        report.lanes += usize::from(!t.is_empty() && !on_device);
    }
    debug_assert!(report.lanes <= reads.len().max(region_txns.len()), "a lane counted twice");
    Ok(region_txns)
}

/// The transactions recovery kept: per lane, from its chain on the device and from its
/// journal in the region.
pub(super) struct Journals {
    pub(super) reads: Vec<ChainRead>,
    pub(super) region: Vec<Vec<Transaction>>,
}

impl Journals {
    pub(super) fn transactions(&self) -> impl Iterator<Item = &Transaction> {
        self.reads.iter().flat_map(|r| r.transactions.iter()).chain(self.region.iter().flatten())
    }

    /// Whether recovery has anything to do: blocks to protect, records or orphans to replay, or
    /// a lane without a journal head to start.
    pub(super) fn touched(&self, cp: &Checkpoint) -> bool {
        // One read per lane of the checkpoint, and the region's journals (if read) likewise: a
        // lane left out would have its chain's blocks go unprotected.
        debug_assert_eq!(self.reads.len(), cp.lanes.len(), "one chain read per lane");
        debug_assert!(
            self.region.is_empty() || self.region.len() == cp.lanes.len(),
            "region journals per lane"
        );
        self.reads.iter().any(|r| !r.blocks.is_empty())
            || self.region.iter().any(|t| !t.is_empty())
            || !cp.orphans.is_empty()
            || cp.lanes.iter().any(|l| l.journal_head == 0)
    }

    /// The newest stamp of any record kept (0: none): the mount's clock starts past it.
    pub(super) fn max_stamp(&self) -> u64 {
        self.transactions().flat_map(|t| t.records.iter().map(|x| x.stamp().ticks)).max().unwrap_or(0)
    }

    /// Past every generation the image knows of: its checkpoint's counter, and the inodes the
    /// journals create (files, and the whiteouts of renames).
    pub(super) fn generation_floor(&self, cp: &Checkpoint) -> u64 {
        let floor = self
            .transactions()
            .flat_map(|t| t.records.iter())
            .filter_map(|r| match r {
                Record::Create { attr, .. } | Record::SetAttr { attr, .. } => Some(attr.generation),
                Record::Rename { whiteout: Some(w), .. } => Some(w.attr.generation),
                _ => None,
            })
            .filter(|&g| g != 0)
            .map(|g| crate::generation::lift(g, cp.next_generation) + 1)
            .fold(cp.next_generation, u64::max);
        debug_assert!(floor >= cp.next_generation);
        floor
    }

    /// The records of all lanes newer than the checkpoint's stamp `cp_stamp`, in replay order.
    pub(super) fn into_replay_order(self, cp_stamp: u64) -> Vec<Record> {
        let read: usize = self.transactions().map(|t| t.records.len()).sum();
        let chains = self.reads.into_iter().map(|r| r.transactions).chain(self.region).collect();
        let merged = merge_by_stamp(chains);
        debug_assert_eq!(merged.len(), read, "the merge keeps every record read");
        let records: Vec<Record> = merged.into_iter().filter(|r| r.stamp().ticks > cp_stamp).collect();
        assert!(records.len() <= read, "{} records to replay of {read} read", records.len());
        debug_assert!(records.windows(2).all(|w| w[0].stamp() <= w[1].stamp()));
        records
    }
}

/// Data blocks (address, crc) that records of `t` newer than the checkpoint map.
pub(super) fn newer_data_refs(t: &Transaction, cp_stamp: u64) -> Vec<(u32, u32)> {
    let refs: Vec<(u32, u32)> = t
        .records
        .iter()
        .filter(|r| r.stamp().ticks > cp_stamp)
        .flat_map(|r| match r {
            Record::Map { entries, .. } => {
                entries.iter().filter(|e| e.0 != 0 && e.0 != NEW_ADDR).copied().collect()
            }
            _ => Vec::new(),
        })
        .collect();
    // A subset of what `Transaction::data_refs` lists: the blocks recovery reads back and
    // protects are never more than those the transaction maps.
    debug_assert!(refs.len() <= t.data_refs().len(), "more newer refs than the transaction maps");
    refs
}

/// How many leading transactions of `txns` have every data block they map (past the
/// checkpoint) intact, and how many data blocks it read to find out. The first `proven` are
/// known to be durable and are not read.
///
/// Why skipping them is safe: a transaction is checked so that a crash between its batch and
/// the device flush (journal blocks on disk, data not) cannot expose stale data. A proven one
/// ends at or below the flushed-through mark of a block the chain walk accepted, and that block
/// was written only after a device flush had completed that started after the transaction's
/// batch completed (`journal::ChainMarks`): its data was on stable storage then. It is still
/// there at the crash: a block a journaled transaction maps after the checkpoint is never
/// written again before a later checkpoint is durable (its segment is at most prefree), the
/// same fact the crc check itself relies on to accept a transaction written long before.
fn verified_prefix(
    dev: &dyn BlockDevice,
    txns: &[Transaction],
    proven: usize,
    cp_stamp: u64,
) -> Result<(usize, u64)> {
    debug_assert!(proven <= txns.len());
    let mut checked = 0u64;
    for (k, t) in txns.iter().enumerate().skip(proven) {
        let refs = newer_data_refs(t, cp_stamp);
        let data = read_blocks(dev, &refs.iter().map(|x| x.0 as u64).collect::<Vec<_>>())?;
        // One block per ref: a short read would let `zip` accept a transaction unchecked.
        debug_assert_eq!(data.len(), refs.len() * BLOCK_SIZE, "data blocks read for transaction {k}");
        checked += refs.len() as u64;
        let ok = refs.iter().zip(data.chunks(BLOCK_SIZE)).all(|((_, crc), b)| crc32c::crc32c(b) == *crc);
        if !ok {
            // Only a transaction past the proven prefix is read, so only one can end the lane.
            assert!(
                k >= proven && k < txns.len(),
                "transaction {k} of {} dropped, {proven} proven",
                txns.len()
            );
            return Ok((k, checked));
        }
    }
    Ok((txns.len(), checked))
}

impl ChainRead {
    /// An empty read positioned at (head, seq).
    pub(crate) fn empty(head: u32, seq: u64) -> ChainRead {
        ChainRead {
            transactions: Vec::new(),
            starts: Vec::new(),
            blocks: Vec::new(),
            end_addr: head,
            end_seq: seq,
            end_link: 0,
            flushed: 0,
        }
    }
}
