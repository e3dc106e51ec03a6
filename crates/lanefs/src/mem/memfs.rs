//! MEMFS's state of a mounted file system, gathered in [`Memfs`].

use crate::format::layout::ORPHAN_CAPACITY;
use crate::format::xattr::blocks_for;
use crate::mem::atime::AtimePolicy;
use crate::mem::mnode::MNode;
use crate::mem::pages::CacheStats;
use crate::mem::xattr::XattrState;
use crate::mem::Cells;
use crate::oplog::InFlight;
use crate::sync::rank::Mutex;
use crate::sync::{PassSem, PerCpu, PerCpuCounter};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

/// The in-memory file system: the mnodes in their file cells, the pass-through semaphore every
/// operation enters, the operations in flight, and what MEMFS keeps for the next checkpoint
/// (dirty sets, dead lists, lazy atimes, orphans) and for admission (xattr blocks owed, blocks
/// claimed). Every read and every namespace change happens here.
///
/// Invariants: an inode is in at most one dirty set, the one its `MNode::dirty_pos` names,
/// until it dies and moves to a dead list (`Memfs::bury`); the dirty sets and dead lists are
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
    /// (`Memfs::bury`). The sets hold the mnodes themselves, not their numbers: the snapshot
    /// visits each while every operation waits, and a lookup in the cells per inode was most
    /// of that wait. (An mnode leaves the cells only dead, at the checkpoint that drops it, so
    /// the one held here is the one the cells hold.)
    pub(crate) dirty: PerCpu<Mutex<std::collections::HashMap<u32, Arc<MNode>>>>,
    /// Per-CPU lists of inodes that died (no name, not open) since the last checkpoint
    /// snapshot: the next checkpoint drops them. The snapshot swaps these lists and the dirty
    /// ones whole, so it does no work per dead inode while every operation waits.
    pub(crate) dead: PerCpu<Mutex<Vec<Arc<MNode>>>>,
    /// The access-time policy (`mem::atime::AtimePolicy`, one byte: a remount changes it).
    pub(crate) atime: AtomicU8,
    /// Per-CPU lists of inodes whose atime changed under lazytime and is in no dirty set.
    pub(crate) lazy: PerCpu<Mutex<Vec<u32>>>,
    /// File-system age (`elapsed_secs`) when the oldest lazy atime was queued (0: none).
    pub(crate) lazy_since: AtomicU64,
    /// The next checkpoint writes every lazy atime (a `sync`).
    pub(crate) lazy_flush: AtomicBool,
    /// Inodes with no name that something still holds (open, or referenced by a kernel): a
    /// checkpoint lists them so that recovery deletes them. Each is here exactly while its
    /// `MNode::orphaned` is set.
    pub(crate) orphans: Mutex<std::collections::BTreeSet<u32>>,
    /// How many `orphans` holds (read without its lock, by `Memfs::kernel_may_hold`).
    pub(crate) orphan_count: AtomicUsize,
    /// Generations of new inodes (`crate::generation`).
    pub(crate) generations: crate::generation::Generations,
    /// Xattr blocks the next checkpoint will write for the sets changed since the last one
    /// (`XattrState::owed`, summed): space admitted but not yet taken.
    pub(crate) xattr_owed: AtomicI64,
    /// Inodes that joined the dirty set since the last checkpoint snapshot.
    pub(crate) dirty_inodes: PerCpuCounter,
    /// The checkpoint whose dirty set an inode changed now joins (`MNode::dirty_epoch`): one
    /// past the last snapshot's, moved by each snapshot in its exclusive phase, so read under
    /// the pass-through semaphore or the gate it is stable.
    pub(crate) epoch: AtomicU64,
    /// Blocks claimed by fallocates making their reservations now (`Engine::claim`): counted
    /// as promised, never recorded by a checkpoint.
    pub(crate) claimed: AtomicU64,
}

impl Memfs {
    /// Blocks the next checkpoint will need for what is dirty now: a block per dirty page,
    /// (generously) two per dirty inode for its node and directory blocks, and the blocks of
    /// the xattr sets that changed.
    pub(crate) fn committed_blocks(&self) -> u64 {
        let pages = self.cache.dirty_pages.load(Ordering::Relaxed).max(0) as u64;
        let xattrs = self.xattr_owed.load(Ordering::Relaxed).max(0) as u64;
        pages + xattrs + 2 * self.dirty_inodes.sum()
    }

    /// Adds `m` to the dirty set of the next checkpoint (idempotent and cheap when it is there
    /// already: two reads, no write to a line other cores share).
    ///
    /// The caller changed `m` under the pass-through semaphore (or the gate), after
    /// `Engine::capture_if_owed` let it: an inode still owed to the checkpoint in progress is
    /// never changed, so it is never found here.
    pub(crate) fn mark_dirty(&self, m: &Arc<MNode>) {
        let cur = self.epoch.load(Ordering::Acquire);
        // Bounded: the one change that can come between the load and the exchange is another
        // thread's mark (0 to `cur`); after it the first test returns.
        for _ in 0..2 {
            let e = m.dirty_epoch.load(Ordering::Acquire);
            if e == cur {
                return;
            }
            debug_assert_eq!(e, 0, "inode {} changed while owed to checkpoint {e} (epoch {cur})", m.ino);
            if m.dirty_epoch.compare_exchange(0, cur, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.dirty_inodes.add(1);
                let slot = self.dirty.current_slot();
                let mut set = self.dirty.get(slot).lock();
                m.dirty_pos.store(slot as u64 + 1, Ordering::Relaxed);
                set.insert(m.ino, m.clone());
                return;
            }
        }
        debug_assert!(
            false,
            "inode {} not marked dirty: epoch {}",
            m.ino,
            m.dirty_epoch.load(Ordering::Acquire)
        );
    }

    /// `m` just died (its last name went with it closed, or its last handle with no name):
    /// moves it from the dirty set to a dead list, so that the checkpoint's snapshot neither
    /// visits nor captures it. The caller holds the pass-through semaphore shared (the
    /// snapshot swaps the lists only with it exclusive) and marked `m` dirty under that hold.
    pub(crate) fn bury(&self, m: &Arc<MNode>) {
        debug_assert_eq!(
            m.dirty_epoch.load(Ordering::Acquire),
            self.epoch.load(Ordering::Acquire),
            "inode {} dies dirty, in the next checkpoint's set",
            m.ino
        );
        if m.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        let slot = m.dirty_pos.load(Ordering::Relaxed);
        debug_assert!(slot != 0, "inode {} was marked dirty", m.ino);
        if let Some(slot) = (slot as usize).checked_sub(1) {
            let gone = self.dirty.get(slot).lock().remove(&m.ino);
            debug_assert!(
                gone.is_some_and(|g| Arc::ptr_eq(&g, m)),
                "inode {} is in the set its dirty_pos names",
                m.ino
            );
        }
        self.dead.current().lock().push(m.clone());
    }

    /// `m` has no name but is held: on the orphan list (idempotent; the flag's swap keeps the
    /// list and the flags in step). Called where `m`'s life is decided: under its meta lock, or
    /// before anyone else can see it.
    pub(crate) fn orphan(&self, m: &MNode) {
        if !m.orphaned.swap(true, Ordering::AcqRel) {
            self.orphans.lock().insert(m.ino);
            self.orphan_count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether a kernel's references alone may keep an inode with no name (`mem::ops::life`):
    /// while the orphan list is at most half full. Every checkpoint records the list, which holds
    /// at most `ORPHAN_CAPACITY`; the kernel lets go of an unlinked inode within moments (a
    /// rm of 40,000 files from 4 processes on 2 cores left at most about 200 waiting for their
    /// FORGET at a checkpoint), and the other half stays for files unlinked while open. Past
    /// it, such an inode dies as it did before the kernel's counts were kept, and a request the
    /// kernel still sends for it may find it gone.
    pub(crate) fn kernel_may_hold(&self) -> bool {
        self.orphan_count.load(Ordering::Relaxed) < (ORPHAN_CAPACITY / 2) as usize
    }

    /// `m` got a name, or died: off the orphan list if it was on it, at the cost of one flag
    /// read if it never was (the common death: no list every core would share).
    pub(crate) fn unorphan(&self, m: &MNode) {
        if m.orphaned.load(Ordering::Acquire) && m.orphaned.swap(false, Ordering::AcqRel) {
            self.orphans.lock().remove(&m.ino);
            self.orphan_count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Blocks promised to preallocated, unwritten ranges, and claimed by fallocates that are
    /// making their promises now.
    pub(crate) fn promised_blocks(&self) -> u64 {
        self.cache.reserved_blocks.load(Ordering::Acquire) + self.claimed.load(Ordering::Acquire)
    }

    /// The access-time policy in force.
    pub fn atime_policy(&self) -> AtimePolicy {
        AtimePolicy::decode(self.atime.load(Ordering::Relaxed))
    }

    /// Changes the policy (a remount).
    pub fn set_atime_policy(&self, p: AtimePolicy) {
        self.atime.store(p.encode(), Ordering::Relaxed);
    }

    /// Notes (under the inode's meta lock) that xattr `name` changed: the next fsync journals
    /// it, the next checkpoint writes the set, and the blocks that takes are owed until then.
    pub(crate) fn xattr_changed(&self, x: &mut XattrState, name: &[u8]) {
        x.unjournaled.insert(name.to_vec());
        x.cp_dirty = true;
        // An upper bound: a small set goes inline in its node, and a checkpoint rewrites only
        // the blocks that changed.
        let need = blocks_for(x.set.stream_len()) as u64;
        self.xattr_owed.fetch_add(need as i64 - x.owed as i64, Ordering::Relaxed);
        x.owed = need;
    }

    /// The blocks owed for `x` are no longer (a checkpoint took the set, or the inode is gone).
    pub(crate) fn xattr_settled(&self, x: &mut XattrState) {
        self.xattr_owed.fetch_sub(std::mem::take(&mut x.owed) as i64, Ordering::Relaxed);
    }
}
