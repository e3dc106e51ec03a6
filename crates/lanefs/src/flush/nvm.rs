//! Hooks for the persistent-memory region (`FsOptions::nvm`; protocols and crash-safety
//! arguments in `crate::pmem`): the NAT a checkpoint logs there instead of writing NAT blocks,
//! and the lane journals fsync commits to instead of writing journal blocks. Without a region
//! every hook is a no-op and both go to the device as before.

use crate::disk::WriteKind;
use crate::engine::Engine;
use crate::error::Result;
use crate::journal::Transaction;
use crate::pmem::journal::Appended;

impl Engine {
    /// fsync's commit with region journals: writes the transaction's data blocks `writes`,
    /// flushes the device when the transaction maps any written block (its own, or blocks
    /// writeback wrote without a flush), then appends `txn` to lane `lane`'s journal in the
    /// region, durable when this returns `Committed` (data=ordered: the data is durable before
    /// the commit word that makes the transaction count). A metadata-only transaction costs no
    /// device I/O at all. `Full`: the lane's journal has no room; nothing was committed, and
    /// the caller takes a checkpoint, which makes the changes durable and empties the journals.
    /// `NoRegion`: the caller journals on the device as without one.
    ///
    /// With a region nothing is ever appended to the device chains: their heads, reserved at
    /// mount and never written, may lie in a segment that was reused by the time a transaction
    /// came.
    pub(crate) fn commit_to_region(
        &self,
        lane: u32,
        txn: &Transaction,
        writes: &[(u64, crate::mem::pages::PageBuf)],
    ) -> Result<RegionCommit> {
        let (Some(nvm), Some(log)) = (&self.disk.nvm, &self.disk.nvm_log) else {
            return Ok(RegionCommit::NoRegion);
        };
        let bytes = txn.encode()?;
        if !log.has_room(lane, bytes.len()) {
            return Ok(RegionCommit::Full);
        }
        let reqs: Vec<_> = super::page_reqs(writes).collect();
        self.disk.write_reqs(&reqs, WriteKind::Journal)?;
        if !txn.data_refs().is_empty() {
            self.disk.fsync_flush()?;
        }
        match log.append(nvm.region(), lane, &bytes)? {
            Appended::Full => Ok(RegionCommit::Full),
            Appended::Committed { before, after } => {
                self.disk.io.nvm_journal.add((after - before) as u64);
                // The journal bound counts region bytes as blocks' worth; a checkpoint is also
                // asked for once a lane's journal is half full.
                let blocks = (after / crate::device::BLOCK_SIZE - before / crate::device::BLOCK_SIZE) as u64;
                if blocks > 0 {
                    self.ckpt.requests.count_journal(blocks);
                }
                let half = log.layout().capacity() / 2;
                if before < half && after >= half {
                    self.ckpt.requests.kick_checkpoint();
                }
                Ok(RegionCommit::Committed)
            }
        }
    }
}

/// What [`Engine::commit_to_region`] did.
pub(crate) enum RegionCommit {
    /// Durable in the region.
    Committed,
    /// No room in the lane's journal: nothing committed.
    Full,
    /// No region: nothing done.
    NoRegion,
}
