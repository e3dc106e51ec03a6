//! The checkpointer's state of a mounted file system, gathered in [`Checkpointer`], and the
//! requests for checkpoints the layers under it make ([`CpRequests`]).

use crate::format::Checkpoint;
use crate::sync::rank::{Condvar, Mutex, RwLock};
use crate::sync::PerCpuCounter;
use std::sync::atomic::{AtomicBool, Ordering};

/// Inodes deleted between checkpoints before one is asked for (see `CpRequests::count_deleted`).
pub(crate) const DELETED_INODES_PER_CHECKPOINT: u64 = 4096;

/// Checkpoint bookkeeping.
pub(crate) struct CpState {
    pub cp: Checkpoint,
    pub pack: u32,
    /// Sequence number of the last checkpoint started / made durable.
    pub started: u64,
    pub durable: u64,
    /// The last checkpoint whose emptied segments are free again (after `durable`: they are
    /// discarded first, outside the gate). What waits for space waits for this one.
    pub settled: u64,
    /// The checkpoint every fsync waits for, whatever it flushes (0: none): one that moved a
    /// lane's journal head, or any with region journals (`Engine::enter_flush`).
    pub fence: u64,
    /// The stamp of the last checkpoint snapshot: unjournaled directory records stamped at or
    /// before it are held by that checkpoint until it is durable.
    pub snap_stamp: u64,
    /// The checkpoint in progress's captured inodes not yet claimed for install.
    pub installs: crate::flush::checkpoint::Installs,
}

/// What asks for a checkpoint: the per-CPU counters MEMFS and fsync count toward the
/// checkpoint bounds (`FsOptions::journal_blocks_limit`, `logged_ops_limit`,
/// [`DELETED_INODES_PER_CHECKPOINT`]), the bounds themselves, and the kick that wakes the
/// background thread. It is the
/// one handle the layers a checkpoint runs over need to ask for one: they never see the rest
/// of the checkpointer.
///
/// Invariant: every counter is reset by each checkpoint snapshot (in its exclusive phase), so
/// each counts since the last snapshot.
pub(crate) struct CpRequests {
    pub(crate) journal_blocks: PerCpuCounter,
    pub(crate) logged_ops: PerCpuCounter,
    /// Inodes whose last name went since the last checkpoint snapshot.
    pub(crate) deleted_inodes: PerCpuCounter,
    /// Wakes the background checkpoint thread.
    pub(crate) kick: (Mutex<bool>, Condvar),
    /// `FsOptions::logged_ops_limit` and `journal_blocks_limit`, as the mount set them.
    pub(crate) logged_ops_limit: u64,
    pub(crate) journal_blocks_limit: u64,
}

/// The checkpointer and the cleaner: the gate fsyncs pass and a checkpoint closes, the
/// serialization of checkpoints, their bookkeeping and who waits for them, what they cost the
/// foreground, the failure that stops the file system, and the cleaner's state.
///
/// Invariants: one checkpoint at a time (`cp_serial`, held across its I/O); the gate is held
/// exclusive only by a checkpoint's snapshot, so every fsync and writeback it lets in sees
/// block validity as the snapshot left it; once `failed` is set it stays set, and `failure`
/// says why.
pub(crate) struct Checkpointer {
    pub(crate) gate: RwLock<()>,
    pub(crate) cp_serial: Mutex<()>,
    pub(crate) cp: Mutex<CpState>,
    pub(crate) cp_done: Condvar,
    /// What asks for the next checkpoint.
    pub(crate) requests: CpRequests,
    /// Set after a failed checkpoint: the in-memory state no longer matches what can be made
    /// durable, so every further change is refused (like ext4's errors=remount-ro).
    pub(crate) failed: AtomicBool,
    /// Why it failed, for the error every later change gets.
    pub(crate) failure: Mutex<String>,
    /// Tells the background thread to end.
    pub(crate) stop: AtomicBool,
    /// The cleaner's state (one cleaning round at a time).
    pub(crate) gc: crate::gc::Cleaner,
    /// How long checkpoints held operations out (`flush::checkpoint::CpPauses`).
    pub(crate) cp_pauses: crate::flush::checkpoint::CpPauses,
}

impl CpRequests {
    /// Asks the background thread for a checkpoint.
    pub(crate) fn kick_checkpoint(&self) {
        let (m, cv) = &self.kick;
        *m.lock() = true;
        cv.notify_one();
    }

    /// Counts an inode that lost its last name: it keeps its memory (mnode, cached pages) until
    /// the checkpoint that deletes it, so a checkpoint is asked for every
    /// [`DELETED_INODES_PER_CHECKPOINT`] of them. Without a region the journal's bound comes
    /// first in a mail spool's delete-heavy loop; with one, checkpoints are rare otherwise and
    /// the dead files' pages pile up (varmail: gigabytes in seconds).
    pub(crate) fn count_deleted(&self) {
        self.count_toward(&self.deleted_inodes, DELETED_INODES_PER_CHECKPOINT, 1);
    }

    /// Counts one logged namespace operation toward `FsOptions::logged_ops_limit`.
    pub(crate) fn count_op(&self) {
        self.count_toward(&self.logged_ops, self.logged_ops_limit, 1);
    }

    /// Counts journal blocks written toward `FsOptions::journal_blocks_limit`.
    pub(crate) fn count_journal(&self, blocks: u64) {
        self.count_toward(&self.journal_blocks, self.journal_blocks_limit, blocks);
    }

    /// Adds `n` to this CPU's slot of `counter` (reset by each checkpoint snapshot) and asks for
    /// a checkpoint once the total reaches `bound`. The total is summed only when the slot
    /// crosses a multiple of a quarter of its share (no shared line is written on the path).
    /// Not when one slot alone reaches its share: a single thread would then checkpoint at
    /// `bound / slots` (half the bound on two CPUs), twice as often as the bound asks for.
    fn count_toward(&self, counter: &PerCpuCounter, bound: u64, n: u64) {
        let step = (bound / (4 * counter.slots() as u64)).max(1);
        let now = counter.add(n);
        if now / step != (now - n) / step && counter.sum() >= bound {
            self.kick_checkpoint();
        }
    }
}

impl Checkpointer {
    /// Stops the file system: every later change fails with EIO naming `why`, and whoever
    /// waits for a checkpoint wakes up to that error.
    pub(crate) fn stop_with_failure(&self, why: String) {
        tracing::error!("lanefs: file system stopped: {why}");
        *self.failure.lock() = why;
        self.failed.store(true, Ordering::Release);
        self.cp_done.notify_all();
    }

    /// Waits until no fsync or writeback is still installing an inode for the checkpoint in
    /// progress (their node blocks must be written, and their NAT entries set, before the
    /// checkpoint takes the NAT and the SIT).
    pub(super) fn wait_for_helpers(&self) {
        let mut cp = self.cp.lock();
        // Bounded: each helper finishes its one inode and counts itself out.
        while cp.installs.helping > 0 {
            self.cp_done.wait(&mut cp);
        }
    }
}
