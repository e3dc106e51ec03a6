//! The checkpointer's state of a mounted file system, gathered in [`Checkpointer`], and the
//! requests for checkpoints the layers under it make ([`CpRequests`]).

use crate::format::Checkpoint;
use crate::sync::rank::{Condvar, Mutex, RwLock};
use crate::sync::PerCpuCounter;
use std::sync::atomic::AtomicBool;

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
/// `DELETED_INODES_PER_CHECKPOINT`), and the kick that wakes the background thread. It is the
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
    /// Inodes that joined the dirty set since the last checkpoint snapshot.
    pub(crate) dirty_inodes: PerCpuCounter,
    /// Wakes the background checkpoint thread.
    pub(crate) kick: (Mutex<bool>, Condvar),
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
