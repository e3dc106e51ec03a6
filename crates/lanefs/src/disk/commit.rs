//! Cooperative commit of fsync's device writes (Son, SNU 2018; issue 18).
//!
//! An fsync does not write its data and journal blocks itself and then wait for a group
//! flush: it queues them ([`Disk::commit_slot`], then `Slot::push` under its lane's chain
//! lock) and waits ([`Disk::commit_wait`]). Whichever waiter finds no batch in flight takes
//! every queued request, from every lane, writes them in one scatter-gather batch
//! (`Disk::write_reqs`) and then waits for the device flush that covers them all; the others
//! sleep and are covered. The flush is group commit's (`disk/group_commit.rs`): while one
//! batch flushes, the next one is written beside it, and its flush follows (or is the one in
//! flight, if that started after the write completed). The queue is per device, not per
//! lane: the flush is the device's, so a batch across lanes costs one flush where per-lane
//! queues would each need one (or share them through group commit again), and the queue's
//! lock is held only to push or take.
//!
//! Ordering, as before: a transaction's data and journal blocks (its commit record, the
//! `TXN_END` block, among them) go in one batch, and the fsync returns only after a flush that
//! started once that batch had completed. Same batch is safe for the reason it was before:
//! recovery replays a transaction only if the data it maps has the checksums it recorded, or
//! a flushed-through mark proves it durable, and a mark is set only after such a flush
//! (`journal::ChainMarks`). Within a lane, transactions must complete in chain order (a later
//! one durable over a hole would be lost with it): requests are pushed under the lane's chain
//! lock, so queue order is chain order, and batches are written one at a time in queue order,
//! each taken only once the one before it is written. A batch that fails to write fails each
//! of its callers; its lanes' chains go back to before their first transaction in it, and
//! every request of those lanes still queued (after the hole) fails too (`rewind`). A failed
//! flush fails its batch's callers, whose blocks are written, as group commit's did.
//!
//! Bound: [`COMMIT_QUEUE_BOUND`] requests queued or reserved; a caller reserves before it
//! takes its chain lock and waits there for room, which the next batch taken frees.

use super::{Disk, WriteKind};
use crate::device::{BlockData, WriteReq};
use crate::error::{Error, Result};
use crate::journal::ChainWriter;
use crate::sync::commit_queue::{self, Pending};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Requests queued or reserved at most: a batch then holds at most this many transactions
/// (each bounded by its lane's journal room and the fsync's dirty pages). About four per CPU
/// on a large machine; past it, an fsync waits for the batch in flight before it appends.
pub(crate) const COMMIT_QUEUE_BOUND: usize = 64;

/// The device's commit queue.
pub(crate) type CommitQueue = commit_queue::CommitQueue<CommitReq, CommitError>;
/// A reserved place in it.
pub(crate) type CommitSlot<'a> = commit_queue::Slot<'a, CommitReq, CommitError>;

/// One block's bytes: a file page, shared with the page cache (copy-on-write), or a journal
/// block.
pub(crate) enum BlockBytes {
    Page(Arc<BlockData>),
    Owned(Vec<u8>),
}

impl BlockBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            BlockBytes::Page(p) => &p[..],
            BlockBytes::Owned(v) => v,
        }
    }
}

/// One fsync's writes, with where they leave its lane's chain.
pub(crate) struct CommitReq {
    /// (block address, bytes): data blocks and journal blocks.
    pub writes: Vec<(u64, BlockBytes)>,
    /// The lane chain the journal blocks extend, if any (an fsync with nothing to write queues
    /// a request without writes, for the flush).
    pub chain: Option<ChainPart>,
}

/// Where a request leaves its lane's chain.
pub(crate) struct ChainPart {
    pub lane: u32,
    /// The seq past its transaction's last block (`ChainMarks::wrote` once written).
    pub end: u64,
    /// The chain writer as it was before the transaction: where the chain goes back to if the
    /// batch fails.
    pub before: ChainWriter,
}

/// Why a cooperative commit failed, shared by every caller of the batch.
#[derive(Clone, Debug)]
pub(crate) enum CommitError {
    /// The batch was not written: nothing of it counts (the chain went back).
    Write(Arc<Error>),
    /// The batch was written and its flush failed.
    Flush(Arc<Error>),
}

/// A shared error as the caller's own.
pub(crate) fn unshare(e: Arc<Error>) -> Error {
    Arc::try_unwrap(e).unwrap_or_else(|e| {
        let kind = match &*e {
            Error::Io(io) => io.kind(),
            _ => std::io::ErrorKind::Other,
        };
        Error::Io(std::io::Error::new(kind, e.to_string()))
    })
}

impl Disk {
    /// A place in the commit queue, waiting for room: taken before the lane's chain lock (a
    /// failed batch's submitter takes that lock to rewind the chain).
    pub(crate) fn commit_slot(&self) -> CommitSlot<'_> {
        debug_assert!(
            !crate::sync::rank::held().contains(&crate::sync::Rank::Chain),
            "a commit slot reserved under a chain lock"
        );
        self.commit.reserve()
    }

    /// Waits until the queued request `p` is written and flushed, writing the batch that
    /// holds it (and everyone else's queued requests) if no batch is being written.
    pub(crate) fn commit_wait(&self, p: Pending) -> std::result::Result<(), CommitError> {
        self.io.fsync_flushes.add(1);
        self.commit.wait(p, |batch| self.write_batch(batch), |batch| self.flush_batch(batch))
    }

    /// A device flush for an fsync that wrote nothing itself, shared with the next batch.
    pub(crate) fn commit_flush(&self) -> Result<()> {
        let p = self.commit_slot().push(CommitReq { writes: Vec::new(), chain: None });
        self.commit_wait(p).map_err(|e| match e {
            CommitError::Write(e) | CommitError::Flush(e) => unshare(e),
        })
    }

    /// A batch's write stage: every block in one scatter-gather submission. On failure, the
    /// chains of its lanes go back before it, and their requests queued since fail too.
    fn write_batch(&self, batch: &[CommitReq]) -> std::result::Result<(), CommitError> {
        debug_assert!(!batch.is_empty(), "a batch holds its submitter's request");
        self.io.fsync_batches.add(1);
        let reqs: Vec<WriteReq> = batch
            .iter()
            .flat_map(|r| r.writes.iter().map(|(a, b)| WriteReq { addr: *a, data: b.as_slice() }))
            .collect();
        if let Err(e) = self.write_reqs(&reqs, WriteKind::Journal) {
            let e = CommitError::Write(Arc::new(e));
            self.rewind(batch, &e);
            return Err(e);
        }
        // Every transaction of the batch is written: its lane's mark may say so.
        for c in batch.iter().filter_map(|r| r.chain.as_ref()) {
            self.chain_marks[c.lane as usize].wrote(c.end);
        }
        Ok(())
    }

    /// A written batch's flush stage, shared with the batches around it (group commit): the
    /// next batch is written while this one flushes, and one device flush covers every batch
    /// written before it started.
    fn flush_batch(&self, batch: &[CommitReq]) -> std::result::Result<(), CommitError> {
        // Read before the flush's ticket: everything counted written completed before it, so
        // the flush that covers the ticket covers it (earlier batches were written first).
        let mut upto: BTreeMap<u32, u64> = BTreeMap::new();
        for c in batch.iter().filter_map(|r| r.chain.as_ref()) {
            let written = self.chain_marks[c.lane as usize].written();
            debug_assert!(written >= c.end, "lane {} flushed before it is written", c.lane);
            upto.insert(c.lane, written);
        }
        match self.group.sync(&*self.dev) {
            Ok(issued) => {
                if issued {
                    self.io.fsync_device_flushes.add(1);
                }
                for (lane, u) in upto {
                    self.chain_marks[lane as usize].flushed(u);
                }
                Ok(())
            }
            Err(e) => Err(CommitError::Flush(Arc::new(e))),
        }
    }

    /// After a batch failed to write: each of its lanes' chains goes back to where it stood
    /// before its first transaction in the batch, and that lane's requests still queued (made
    /// after the hole) fail with the batch.
    fn rewind(&self, batch: &[CommitReq], e: &CommitError) {
        // Push order is chain order within a lane: the first request of a lane is its earliest.
        let mut first: BTreeMap<u32, &ChainWriter> = BTreeMap::new();
        for c in batch.iter().filter_map(|r| r.chain.as_ref()) {
            first.entry(c.lane).or_insert(&c.before);
        }
        for (lane, before) in first {
            // Under the chain lock nobody appends: every request of this lane made since is
            // queued now, and the next append starts from `before`.
            let mut chain = self.chains[lane as usize].lock();
            *chain = before.clone();
            self.commit.fail_queued(|r| r.chain.as_ref().is_some_and(|c| c.lane == lane), e);
            drop(chain);
        }
    }
}
