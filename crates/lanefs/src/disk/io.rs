//! Bytes written by cause since mount, for write amplification (everything over user bytes).
//!
//! Counted per CPU so no write path shares a line; summed only on read, and each checkpoint
//! adds to its persistent counters only what grew since the last one.

use crate::sync::rank::{Mutex, Rank};
use crate::sync::PerCpuCounter;

/// What a device write is for (write amplification is everything over user bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    /// fsync: data blocks and journal blocks.
    Journal,
    /// Dirty pages pushed out under cache pressure.
    Writeback,
    /// A checkpoint's data, nodes and metadata.
    Checkpoint,
    /// Blocks the cleaner moved.
    Cleaning,
}

/// Bytes written by cause since mount (per CPU, summed on read).
pub(crate) struct IoCounters {
    /// Bytes users wrote (what write amplification is measured against).
    pub user: PerCpuCounter,
    pub journal: PerCpuCounter,
    pub writeback: PerCpuCounter,
    pub checkpoint: PerCpuCounter,
    pub cleaning: PerCpuCounter,
    /// Bytes fsync committed to the region's lane journals (not device bytes).
    pub nvm_journal: PerCpuCounter,
    /// Device flushes fsync asked for (each may be shared by a group of fsyncs).
    pub fsync_flushes: PerCpuCounter,
    /// Device flushes group commit issued for them: at most `fsync_flushes`, fewer when
    /// concurrent fsyncs shared one.
    pub fsync_device_flushes: PerCpuCounter,
    /// Scatter-gather batches cooperative commit submitted (each one submission of every
    /// queued fsync's writes, then one flush): at most the fsyncs that queued.
    pub fsync_batches: PerCpuCounter,
    /// fsyncs and writebacks that waited for a checkpoint in progress (`Engine::enter_flush`).
    pub cp_waits: PerCpuCounter,
    /// fsyncs that journaled a checkpoint's bridge (`mem::mnode::Bridge`).
    pub cp_bridges: PerCpuCounter,
    /// Captured inodes an fsync or writeback installed for the checkpoint in progress instead
    /// of waiting for it (`Engine::help_install`).
    pub cp_helped: PerCpuCounter,
    /// (user, cleaning, other) totals already added to the checkpoint's persistent counters:
    /// each checkpoint adds what the totals grew by since.
    saved: Mutex<[u64; 3]>,
}

impl Default for IoCounters {
    fn default() -> Self {
        IoCounters {
            user: PerCpuCounter::default(),
            journal: PerCpuCounter::default(),
            writeback: PerCpuCounter::default(),
            checkpoint: PerCpuCounter::default(),
            cleaning: PerCpuCounter::default(),
            nvm_journal: PerCpuCounter::default(),
            fsync_flushes: PerCpuCounter::default(),
            fsync_device_flushes: PerCpuCounter::default(),
            fsync_batches: PerCpuCounter::default(),
            cp_waits: PerCpuCounter::default(),
            cp_bridges: PerCpuCounter::default(),
            cp_helped: PerCpuCounter::default(),
            saved: Mutex::new(Rank::IoSaved, [0; 3]),
        }
    }
}

impl IoCounters {
    pub fn count(&self, kind: WriteKind, bytes: u64) {
        match kind {
            WriteKind::Journal => self.journal.add(bytes),
            WriteKind::Writeback => self.writeback.add(bytes),
            WriteKind::Checkpoint => self.checkpoint.add(bytes),
            WriteKind::Cleaning => self.cleaning.add(bytes),
        };
    }

    /// Bytes (by users, by cleaning, by everything else) written since the last call.
    pub fn take_unsaved(&self) -> [u64; 3] {
        let now = [
            self.user.sum(),
            self.cleaning.sum(),
            self.journal.sum() + self.writeback.sum() + self.checkpoint.sum(),
        ];
        let mut saved = self.saved.lock();
        let delta = std::array::from_fn(|i| now[i].saturating_sub(saved[i]));
        *saved = now;
        delta
    }
}
