//! The engine's lock hierarchy, and the checker that enforces it in test builds.
//!
//! Every lock of the engine has a [`Rank`]. A thread may acquire a lock only if its rank is
//! greater than the rank of every lock the thread already holds: locks are taken outermost
//! first, in the order of the enum below. A hierarchy with no cycle cannot deadlock, whatever
//! the interleaving; a checker that fails on the first out-of-order *acquisition* finds an
//! inversion the first time its two halves run on one thread, long before two threads meet in
//! it (the 2026-11 mount hang needed two FUSE workers and a cold page to show; its first half
//! alone panics here).
//!
//! Why a rank checker and not parking_lot's `deadlock_detection`: that feature finds a cycle
//! only once threads are actually stuck in it, so a test must hit the race; and it cannot see
//! waits outside parking_lot (the range lock, the pass-through semaphore, the gate's drain).
//! A rank is checked on every acquisition, on one thread, deterministically, and covers the
//! custom primitives through [`Held`].
//!
//! The check runs where `debug_assertions` are on (every `cargo test` build, including the
//! `lanefs` binary the FUSE tests mount with) and compiles to nothing in release builds: the
//! wrappers are then parking_lot's types plus a byte.
//!
//! Rules that go with the hierarchy (docs/ARCHITECTURE.md, "The lock hierarchy"):
//! - No device I/O under a lock ranked at or above [`Rank::Disk`], except where a comment says
//!   why (a device read waits for no lock, so it can delay, never deadlock).
//! - A lock class whose instances may nest (two directories' shards in a rename) is marked in
//!   [`Rank::nests`], and its instances are then taken in a fixed order stated where they are.
//! - Waiting on a condition variable keeps the lock's rank: the waiter acquires nothing else.

use parking_lot as pl;
use std::ops::{Deref, DerefMut};

/// Lock classes, outermost first. A thread holding a lock of rank `r` may only acquire locks
/// of rank greater than `r` (or equal, for classes that [`Rank::nests`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Rank {
    // The checkpointer and the cleaner: whole rounds.
    /// One cleaning round at a time (`Cleaner::round`).
    GcRound,
    /// One checkpoint at a time (`Engine::cp_serial`).
    CpSerial,
    /// The checkpoint gate: shared by fsync and writeback while they place blocks, exclusive
    /// for a checkpoint's snapshot (its write phase runs beside them: `Engine::enter_flush`).
    Gate,

    // fsync: what one transaction holds while it decides and writes.
    /// An inode's fsync transaction order (`MNode::fsync_order`).
    FsyncOrder,
    /// A directory's journal flush (`DirState::flush_lock`), held while a flush collects the
    /// directory's records (not while it writes them); several are taken in ascending inode
    /// order (`Engine::take_dir_ops`).
    DirFlush,

    // MEMFS: every operation.
    /// The pass-through semaphore: shared by every operation, exclusive in the snapshot.
    /// (Flushes hold the gate, never the semaphore: a checkpoint holding the gate drains it.)
    PassSem,
    /// Cross-directory rename of a directory (loop prevention; `Engine::rename_lock`).
    Rename,
    /// A file's byte-range lock (held for a whole read, write, truncate or punch), or a
    /// page-level hold of one of its pages (`mem::page_lock`, whose wait mutex is a leaf).
    Range,
    /// One shard of a directory's name map; a rename takes two in ascending (inode, shard)
    /// order (`mem::dir::update_two`).
    DirShard,
    /// Waiting for directory operations stamped before a merge to append their records
    /// (`oplog::clock::InFlight::wait_below`). A registered operation takes only locks ranked
    /// below this one until it finishes, so a merge holding nothing ranked here or below
    /// cannot wait forever. Registration itself never waits.
    InFlightOp,
    /// Where an inode's data lives on disk (`MNode::disk`).
    Disk,
    /// One shard of a file's page map. Below `Disk`: readers, writeback and fsync look pages
    /// up while they hold the mapping, so a partial write's load happens with neither held.
    PageShard,
    /// An inode's rarely-changing attributes (`MNode::meta`).
    Meta,
    /// An inode's unjournaled-record counts per directory (`MNode::pending`).
    Pending,
    /// Per-CPU shard of a directory's operation log.
    OplogShard,
    /// An operation-log timestamp slot.
    ClockSlot,
    /// Inodes unlinked while open.
    Orphans,
    /// Per-CPU list of dirty inodes.
    DirtySet,
    /// Per-CPU list of inodes that died (no name, not open) since the last checkpoint
    /// snapshot; taken by a dying inode after its dirty-set slot, a leaf otherwise.
    DeadList,
    /// Per-CPU list of inodes with a lazytime atime to write (taken like `DirtySet`, after
    /// the semaphore, never with it).
    LazyAtime,

    // DISKFS: the checkpoint's bookkeeping, journals, segments, the NAT.
    /// The cleaner's victims waiting for a checkpoint.
    GcVictims,
    /// Checkpoint bookkeeping (`Engine::cp`).
    CpState,
    /// A lane's journal chain writer (held while its batch is written: ordering).
    Chain,
    /// A lane journal in the persistent-memory region; a reset takes all of them in lane
    /// order.
    NvmJournalLane,
    /// The NAT's staged checkpoint records in the region.
    NvmNatStaged,
    /// A lane's active log of one type.
    LaneLog,
    /// Summaries of segments a lane closed.
    LaneClosed,
    /// A lane's cache of free segments.
    LaneCache,
    /// The segment table's free map.
    FreeMap,
    /// One segment's validity entry.
    Segment,
    /// The NAT: ids being committed.
    NatCommitting,
    /// The NAT: the free-id scanner.
    NatScanner,
    /// The NAT: a per-CPU cache of free ids.
    NatCache,
    /// The cooperative commit queue (`sync::commit_queue`): pushed to under a lane's chain
    /// lock, which a failed batch's submitter takes before it (never held across I/O).
    CommitQueue,

    // Leaves: held for a few instructions, nothing taken under them but devices.
    /// Group commit's flush state.
    GroupCommit,
    /// The background checkpoint thread's wake-up flag.
    CpKick,
    /// Why the file system failed.
    Failure,
    /// I/O totals already saved by a checkpoint.
    IoSaved,
    /// A range lock's own request list (never held while waiting).
    RangeInner,
    /// A flush's ticket (`sync::ticket`): held only to wait for it or resolve it.
    Ticket,
    /// The FUSE adapter's table of open directory handles (never held across an engine call).
    DirHandles,
    /// The FUSE adapter's set of inodes whose ctime the engine moved past the kernel's
    /// (`LaneFuse::ctime_ahead`): a leaf.
    CtimeAhead,
    /// The FUSE session's count of workers per queue and of those waiting for the kernel
    /// (`lanefs_fuse::proto::spares`): a leaf, held only to count.
    FuseWorkers,

    // Devices, innermost.
    /// The crash-recording device's barrier (test harness).
    CrashBarrier,
    /// The region's crash recorder (test harness).
    PmemRecorder,
    /// The crash-recording device's injected faults (test harness).
    CrashFaults,
    /// The crash-recording device's event log (test harness).
    CrashLog,
    /// A device's internals: an io_uring ring, a memory device's block group.
    Device,
}

impl Rank {
    /// Number of lock classes.
    pub const COUNT: usize = Rank::Device as usize + 1;

    /// Every class, outermost first (`ALL[r as usize] == r`).
    pub const ALL: [Rank; Rank::COUNT] = [
        Rank::GcRound,
        Rank::CpSerial,
        Rank::Gate,
        Rank::FsyncOrder,
        Rank::DirFlush,
        Rank::PassSem,
        Rank::Rename,
        Rank::Range,
        Rank::DirShard,
        Rank::InFlightOp,
        Rank::Disk,
        Rank::PageShard,
        Rank::Meta,
        Rank::Pending,
        Rank::OplogShard,
        Rank::ClockSlot,
        Rank::Orphans,
        Rank::DirtySet,
        Rank::DeadList,
        Rank::LazyAtime,
        Rank::GcVictims,
        Rank::CpState,
        Rank::Chain,
        Rank::NvmJournalLane,
        Rank::NvmNatStaged,
        Rank::LaneLog,
        Rank::LaneClosed,
        Rank::LaneCache,
        Rank::FreeMap,
        Rank::Segment,
        Rank::NatCommitting,
        Rank::NatScanner,
        Rank::NatCache,
        Rank::CommitQueue,
        Rank::GroupCommit,
        Rank::CpKick,
        Rank::Failure,
        Rank::IoSaved,
        Rank::RangeInner,
        Rank::Ticket,
        Rank::DirHandles,
        Rank::CtimeAhead,
        Rank::FuseWorkers,
        Rank::CrashBarrier,
        Rank::PmemRecorder,
        Rank::CrashFaults,
        Rank::CrashLog,
        Rank::Device,
    ];

    /// Whether two locks of this class may be held at once (their order is then fixed by the
    /// code that takes them, and stated there).
    pub const fn nests(self) -> bool {
        matches!(self, Rank::DirFlush | Rank::DirShard | Rank::NvmJournalLane)
    }
}

#[cfg(debug_assertions)]
mod check {
    use super::Rank;
    use std::cell::RefCell;

    thread_local! {
        /// Ranks this thread holds, in acquisition order (bounded by the hierarchy's depth
        /// plus nesting classes).
        static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
        /// Set by a primitive's own unit test that holds two of its guards on purpose.
        static EXEMPT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    #[cfg(test)]
    pub fn exempt() {
        EXEMPT.with(|e| e.set(true));
    }

    /// Records that this thread is about to wait for a lock of `rank`; panics if that breaks
    /// the hierarchy. Called before blocking, so an inversion panics instead of hanging.
    pub fn acquire(rank: Rank) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(&top) = h.iter().max().filter(|_| !EXEMPT.with(|e| e.get())) {
                let ok = rank > top || (rank == top && rank.nests());
                if !ok {
                    let held = h.clone();
                    drop(h);
                    panic!(
                        "lock order violated: acquiring {rank:?} while holding {held:?} \
                         (sync::rank: locks are taken in Rank order, outermost first)"
                    );
                }
            }
            assert!(h.len() < 64, "more than 64 locks held by one thread: {h:?}");
            h.push(rank);
        });
    }

    /// Records a lock taken without waiting: no check, since a try-lock cannot wait.
    pub fn push_unchecked(rank: Rank) {
        HELD.with(|h| h.borrow_mut().push(rank));
    }

    /// Records that this thread let go of a lock of `rank` (guards may drop in any order).
    pub fn release(rank: Rank) {
        // A thread-local is gone during thread exit; nothing to check then.
        let _ = HELD.try_with(|h| {
            let mut h = h.borrow_mut();
            let at = h.iter().rposition(|&r| r == rank).expect("released a lock this thread does not hold");
            h.remove(at);
        });
    }

    /// The ranks this thread holds.
    pub fn held() -> Vec<Rank> {
        HELD.with(|h| h.borrow().clone())
    }
}

/// Proof that this thread holds a lock of some rank, for primitives that are not the wrappers
/// below (the range lock, the pass-through semaphore): acquire one before waiting, keep it in
/// the guard. Zero-sized in release builds.
#[derive(Debug)]
pub struct Held {
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl Held {
    /// Checks and records that this thread is about to take a lock of `rank`.
    #[inline]
    pub fn acquire(rank: Rank) -> Held {
        #[cfg(debug_assertions)]
        check::acquire(rank);
        #[cfg(not(debug_assertions))]
        let _ = rank;
        Held {
            #[cfg(debug_assertions)]
            rank,
        }
    }
}

impl Drop for Held {
    #[inline]
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        check::release(self.rank);
    }
}

/// The ranks the current thread holds (always empty in release builds): for assertions such
/// as "no lock is held here".
pub fn held() -> Vec<Rank> {
    #[cfg(debug_assertions)]
    return check::held();
    #[cfg(not(debug_assertions))]
    Vec::new()
}

/// Turns the order check off for the calling thread: only for a unit test of a primitive
/// (the range lock, the semaphore, the in-flight registry) that holds two of its own guards
/// on one thread on purpose, to test how they interact.
#[cfg(test)]
pub fn exempt_this_thread() {
    #[cfg(debug_assertions)]
    check::exempt();
}

/// A parking_lot mutex with a rank.
pub struct Mutex<T: ?Sized> {
    rank: Rank,
    inner: pl::Mutex<T>,
}

/// A held [`Mutex`].
pub struct MutexGuard<'a, T: ?Sized> {
    guard: pl::MutexGuard<'a, T>,
    _held: Held,
}

impl<T> Mutex<T> {
    /// A mutex of class `rank` holding `value`.
    pub const fn new(rank: Rank, value: T) -> Self {
        Mutex { rank, inner: pl::Mutex::new(value) }
    }

    /// The value, consuming the mutex.
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Tries first, so that a wait is counted in the contention census (`sync::census`): the
    /// uncontended cost is the one compare-and-swap a plain lock makes.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let held = Held::acquire(self.rank);
        let guard = super::census::take_counted(self.rank, || self.inner.try_lock(), || self.inner.lock());
        MutexGuard { guard, _held: held }
    }

    /// Never waits, so it may be called in any order (a failed try records nothing).
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let guard = self.inner.try_lock()?;
        Some(MutexGuard { guard, _held: Held::without_waiting(self.rank) })
    }

    /// The value, through exclusive access (no locking, no rank check).
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    /// The lock's class in the hierarchy.
    pub fn rank(&self) -> Rank {
        self.rank
    }
}

impl Held {
    /// Records a lock taken without waiting (a successful try-lock): it cannot close a cycle
    /// by itself, but what is acquired under it is checked against it.
    #[inline]
    pub fn without_waiting(rank: Rank) -> Held {
        #[cfg(debug_assertions)]
        check::push_unchecked(rank);
        #[cfg(not(debug_assertions))]
        let _ = rank;
        Held {
            #[cfg(debug_assertions)]
            rank,
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mutex").field("rank", &self.rank).field("inner", &self.inner).finish()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock").field("rank", &self.rank).field("inner", &self.inner).finish()
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// A parking_lot reader-writer lock with a rank (shared and exclusive take the same rank).
pub struct RwLock<T: ?Sized> {
    rank: Rank,
    inner: pl::RwLock<T>,
}

/// A [`RwLock`] held shared.
pub struct RwLockReadGuard<'a, T: ?Sized> {
    guard: pl::RwLockReadGuard<'a, T>,
    _held: Held,
}

/// A [`RwLock`] held exclusively.
pub struct RwLockWriteGuard<'a, T: ?Sized> {
    guard: pl::RwLockWriteGuard<'a, T>,
    _held: Held,
}

impl<T> RwLock<T> {
    /// A reader-writer lock of class `rank` holding `value`.
    pub const fn new(rank: Rank, value: T) -> Self {
        RwLock { rank, inner: pl::RwLock::new(value) }
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Tries first, counting a wait in the contention census (as [`Mutex::lock`]).
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        let held = Held::acquire(self.rank);
        let guard = super::census::take_counted(self.rank, || self.inner.try_read(), || self.inner.read());
        RwLockReadGuard { guard, _held: held }
    }

    /// Tries first, counting a wait in the contention census (as [`Mutex::lock`]).
    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        let held = Held::acquire(self.rank);
        let guard = super::census::take_counted(self.rank, || self.inner.try_write(), || self.inner.write());
        RwLockWriteGuard { guard, _held: held }
    }

    /// The value, through exclusive access (no locking, no rank check).
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }
}

impl<T: ?Sized> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// A condition variable for [`Mutex`]: waiting releases and retakes the lock without changing
/// what the thread is recorded to hold (it acquires nothing else meanwhile).
#[derive(Default)]
pub struct Condvar(pl::Condvar);

impl Condvar {
    /// A condition variable no thread waits on.
    pub const fn new() -> Self {
        Condvar(pl::Condvar::new())
    }

    /// Releases `g`'s mutex, waits for a notification and takes it again.
    pub fn wait<T: ?Sized>(&self, g: &mut MutexGuard<'_, T>) {
        self.0.wait(&mut g.guard);
    }

    /// Returns whether it timed out.
    pub fn wait_for<T: ?Sized>(&self, g: &mut MutexGuard<'_, T>, d: std::time::Duration) -> bool {
        self.0.wait_for(&mut g.guard, d).timed_out()
    }

    /// Wakes every waiter; returns how many.
    pub fn notify_all(&self) -> usize {
        self.0.notify_all()
    }

    /// Wakes one waiter; returns whether there was one.
    pub fn notify_one(&self) -> bool {
        self.0.notify_one()
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn every_class_is_listed_once_in_order() {
        for (i, r) in Rank::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?}");
        }
        assert!(Rank::ALL.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn locks_taken_in_rank_order_are_recorded_and_released() {
        let (disk, page) = (Mutex::new(Rank::Disk, 1), Mutex::new(Rank::PageShard, 2));
        let d = disk.lock();
        let p = page.lock();
        assert_eq!(held(), vec![Rank::Disk, Rank::PageShard]);
        // Guards may go in any order.
        drop(d);
        assert_eq!(held(), vec![Rank::PageShard]);
        drop(p);
        assert!(held().is_empty());
    }

    #[test]
    #[should_panic(expected = "lock order violated: acquiring Disk while holding [PageShard]")]
    fn the_partial_page_deadlock_shape_panics_on_one_thread() {
        // The 2026-11 mount hang: a page shard held while the loader took the inode's `disk`.
        let (disk, page) = (Mutex::new(Rank::Disk, ()), Mutex::new(Rank::PageShard, ()));
        let _p = page.lock();
        let _d = disk.lock();
    }

    #[test]
    #[should_panic(expected = "lock order violated")]
    fn a_class_that_does_not_nest_cannot_be_taken_twice() {
        let (a, b) = (Mutex::new(Rank::Meta, ()), Mutex::new(Rank::Meta, ()));
        let _a = a.lock();
        let _b = b.lock();
    }

    #[test]
    fn nesting_classes_and_try_locks_are_allowed() {
        let (a, b) = (RwLock::new(Rank::DirShard, ()), RwLock::new(Rank::DirShard, ()));
        let _a = a.write();
        let _b = b.read();
        // A try-lock never waits, so it may go against the order; what follows is checked
        // against it.
        let gate = RwLock::new(Rank::Gate, ());
        let m = Mutex::new(Rank::GcRound, ());
        let t = m.try_lock().expect("free");
        assert_eq!(held(), vec![Rank::DirShard, Rank::DirShard, Rank::GcRound]);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(gate.read())));
        assert!(r.is_err(), "the gate ranks below a held GcRound");
        drop(t);
    }

    #[test]
    fn a_condvar_wait_keeps_the_rank_and_other_threads_are_independent() {
        let m = std::sync::Arc::new(Mutex::new(Rank::GroupCommit, false));
        let cv = std::sync::Arc::new(Condvar::new());
        let (m2, cv2) = (m.clone(), cv.clone());
        let t = std::thread::spawn(move || {
            // This thread holds nothing, whatever the other one holds.
            let outer = Mutex::new(Rank::GcRound, ());
            let _outer = outer.lock();
            *m2.lock() = true;
            cv2.notify_all();
        });
        let mut g = m.lock();
        while !*g {
            cv.wait_for(&mut g, std::time::Duration::from_millis(10));
        }
        assert_eq!(held(), vec![Rank::GroupCommit]);
        drop(g);
        t.join().unwrap();
    }
}
