//! MEMFS's state of a mounted file system, gathered in [`Memfs`].

use crate::mem::mnode::MNode;
use crate::mem::pages::CacheStats;
use crate::mem::Cells;
use crate::oplog::InFlight;
use crate::sync::rank::Mutex;
use crate::sync::{PassSem, PerCpu};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8};
use std::sync::Arc;

/// The in-memory file system: the mnodes in their file cells, the pass-through semaphore every
/// operation enters, the operations in flight, and what MEMFS keeps for the next checkpoint
/// (dirty sets, dead lists, lazy atimes, orphans) and for admission (xattr blocks owed, blocks
/// claimed). Every read and every namespace change happens here.
///
/// Invariants: an inode is in at most one dirty set, the one its `MNode::dirty_pos` names,
/// until it dies and moves to a dead list (`Engine::bury`); the dirty sets and dead lists are
/// swapped whole only with `pass` held exclusive (the checkpoint's snapshot), so a change that
/// holds it shared and marks its inode dirty is in the next snapshot or after it, never lost
/// between.
pub(crate) struct Memfs {
    pub(crate) cells: Cells<MNode>,
    pub(crate) pass: PassSem,
    pub(crate) inflight: InFlight,
    pub(crate) rename_lock: Mutex<()>,
    pub(crate) cache: Arc<CacheStats>,
    /// Per-CPU sets of the inodes changed since the last checkpoint snapshot (an inode is in
    /// the one `MNode::dirty_pos` names). An inode that dies leaves its set for a dead list
    /// (`Engine::bury`).
    pub(crate) dirty: PerCpu<Mutex<std::collections::HashSet<u32>>>,
    /// Per-CPU lists of inodes that died (no name, not open) since the last checkpoint
    /// snapshot: the next checkpoint drops them. The snapshot swaps these lists and the dirty
    /// ones whole, so it does no work per dead inode while every operation waits.
    pub(crate) dead: PerCpu<Mutex<Vec<u32>>>,
    /// The access-time policy (`mem::atime::AtimePolicy`, one byte: a remount changes it).
    pub(crate) atime: AtomicU8,
    /// Per-CPU lists of inodes whose atime changed under lazytime and is in no dirty set.
    pub(crate) lazy: PerCpu<Mutex<Vec<u32>>>,
    /// File-system age (`elapsed_secs`) when the oldest lazy atime was queued (0: none).
    pub(crate) lazy_since: AtomicU64,
    /// The next checkpoint writes every lazy atime (a `sync`).
    pub(crate) lazy_flush: AtomicBool,
    /// Unlinked while open.
    pub(crate) orphans: Mutex<std::collections::BTreeSet<u32>>,
    /// Generations of new inodes (`crate::generation`).
    pub(crate) generations: crate::generation::Generations,
    /// Xattr blocks the next checkpoint will write for the sets changed since the last one
    /// (`XattrState::owed`, summed): space admitted but not yet taken.
    pub(crate) xattr_owed: AtomicI64,
    /// Blocks claimed by fallocates making their reservations now (`Engine::claim`): counted
    /// as promised, never recorded by a checkpoint.
    pub(crate) claimed: AtomicU64,
}
