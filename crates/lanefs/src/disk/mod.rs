//! DISKFS's state of a mounted file system: the device and everything that decides where
//! blocks go and how a lane's journal stands, gathered in [`Disk`].
//!
//! - `group_commit`: concurrent fsyncs sharing one device flush.
//! - `commit`: cooperative commit, where waiting fsyncs submit everyone's queued writes in one
//!   batch and one flush (`FsOptions::cooperative`).
//! - `io`: bytes written by cause, for write amplification.

mod commit;
mod group_commit;
mod io;

pub(crate) use commit::{
    unshare, BlockBytes, ChainPart, CommitError, CommitQueue, CommitReq, COMMIT_QUEUE_BOUND,
};
pub(crate) use group_commit::GroupCommit;
pub(crate) use io::{IoCounters, WriteKind};

use crate::device::{BlockDevice, WriteReq};
use crate::error::{Error, Result};
use crate::format::checkpoint::CP_FLAG_NVM_NAT;
use crate::format::layout::Geometry;
use crate::format::{Checkpoint, NatBlock};
use crate::journal::ChainWriter;
use crate::nat::NatTable;
use crate::seg::{LaneSet, SegmentTable};
use crate::sync::current_cpu;
use crate::sync::rank::Mutex;
use std::sync::Arc;

/// The disk side of a mount: the device behind its shutdown gate, the geometry, the NAT (in
/// blocks or in the region), the segment table and the lanes of active logs, each lane's
/// journal chain, group commit and the I/O counters. It knows nothing of inodes in memory or
/// of checkpoints in progress: MEMFS and the checkpointer reach the disk through it.
///
/// Invariants: every write of this mount goes through `dev`, which passes `halt`; `chains`
/// and `chain_marks` have one entry per lane of `lanes`; a lane's chain is appended to only
/// under its `chains` lock, which is held across the chain's device I/O (journal blocks of one
/// lane complete in chain order), or, with cooperative commit, across the push of its blocks
/// into `commit`, whose batches run one at a time in queue order (`disk/commit.rs`).
pub(crate) struct Disk {
    /// The device, behind `halt`: a [`crate::device::HaltDevice`].
    pub(crate) dev: Arc<dyn BlockDevice>,
    /// The shutdown gate every device and region write of this mount passes (`Fs::shutdown`).
    pub(crate) halt: Arc<crate::device::Halt>,
    pub(crate) g: Geometry,
    pub(crate) nat: NatTable,
    /// The persistent-memory region holding the NAT (`FsOptions::nvm`), when mounted with one.
    pub(crate) nvm: Option<crate::pmem::nat::NvmNat>,
    /// The lane journals in that region: fsync commits there (see `crate::pmem`).
    pub(crate) nvm_log: Option<crate::pmem::journal::NvmJournal>,
    pub(crate) table: Arc<SegmentTable>,
    pub(crate) lanes: LaneSet,
    pub(crate) chains: Vec<Mutex<ChainWriter>>,
    /// Per lane: how far its chain is written and durable, for the flushed-through mark that
    /// spares recovery reading back durable transactions' data (`journal::ChainMarks`).
    pub(crate) chain_marks: Vec<crate::journal::ChainMarks>,
    pub(crate) group: GroupCommit,
    /// The cooperative commit queue (`disk/commit.rs`), used when `FsOptions::cooperative`.
    pub(crate) commit: CommitQueue,
    /// Bytes written to the device, by cause.
    pub(crate) io: IoCounters,
    /// File-system age at mount (seconds) and when that was: segment ages for cleaning.
    pub(crate) age_at_mount: u64,
    pub(crate) mounted_at: std::time::Instant,
}

impl Disk {
    /// The lane and CPU slot of the calling thread.
    pub(crate) fn lane(&self) -> (u32, usize) {
        let cpu = current_cpu();
        (cpu as u32 % self.lanes.lane_count(), cpu)
    }

    /// Refuses every operation once the file system is shut down (`Fs::shutdown`).
    pub(crate) fn check_live(&self) -> Result<()> {
        if self.halt.is_halted() {
            return Err(Error::Io(crate::device::halt::halted_error()));
        }
        Ok(())
    }

    /// Blocks that can be allocated now without touching the cleaner's reserve. (Prefree
    /// segments do not count: the checkpoint that frees them must fit without them.)
    pub(crate) fn available_blocks(&self) -> u64 {
        self.table.free_segments().saturating_sub(self.g.cleaning_reserve()) * 512
    }

    /// The device flush of an fsync, shared with every concurrent one (group commit).
    pub(crate) fn fsync_flush(&self) -> Result<()> {
        self.io.fsync_flushes.add(1);
        if self.group.sync(&*self.dev)? {
            self.io.fsync_device_flushes.add(1);
        }
        Ok(())
    }

    /// Writes (address, bytes) pairs in bounded batches, counted as `kind`.
    pub(crate) fn write_all(&self, writes: &[(u64, Vec<u8>)], kind: WriteKind) -> Result<()> {
        let reqs: Vec<WriteReq> = writes.iter().map(|(a, d)| WriteReq { addr: *a, data: d }).collect();
        self.write_reqs(&reqs, kind)
    }

    /// Writes `reqs` in bounded batches, counted as `kind`.
    pub(crate) fn write_reqs(&self, reqs: &[WriteReq], kind: WriteKind) -> Result<()> {
        for chunk in reqs.chunks(256) {
            self.dev.write_batch(chunk)?;
            self.io.count(kind, chunk.iter().map(|r| r.data.len() as u64).sum());
        }
        Ok(())
    }

    /// File-system age in seconds (segment mtimes for cleaning): the age the last checkpoint
    /// recorded at mount plus the time mounted since.
    pub(crate) fn elapsed_secs(&self) -> u64 {
        self.age_at_mount + self.mounted_at.elapsed().as_secs()
    }

    /// Before the pack of `cp` is written: with a region, the changed entries of the dirty NAT
    /// blocks `nat` are logged and committed there, the pack is flagged, and no NAT block is
    /// left for the device. Returns the NAT blocks the device must still get.
    pub(crate) fn stage_nat(&self, cp: &mut Checkpoint, nat: Vec<NatBlock>) -> Result<Vec<NatBlock>> {
        let Some(nvm) = &self.nvm else { return Ok(nat) };
        nvm.stage(cp.version, &nat)?;
        cp.flags |= CP_FLAG_NVM_NAT;
        Ok(Vec::new())
    }

    /// After the pack of checkpoint `version` is durable: its logged entries go in place, and
    /// the lane journals are emptied (every record in them is part of the checkpoint).
    pub(crate) fn apply_nat(&self, version: u64) -> Result<()> {
        match &self.nvm {
            Some(nvm) => {
                nvm.apply(version)?;
                self.reset_nvm_journals(version)
            }
            None => Ok(()),
        }
    }

    /// Empties the region's lane journals under the checkpoint of `version`, the pack in force.
    /// Callers: a checkpoint once its pack is durable (holding the gate, so no fsync appends),
    /// and mount before any fsync can run.
    pub(crate) fn reset_nvm_journals(&self, version: u64) -> Result<()> {
        match (&self.nvm, &self.nvm_log) {
            (Some(nvm), Some(log)) => log.reset(nvm.region(), version),
            _ => Ok(()),
        }
    }
}
