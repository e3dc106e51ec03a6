//! The reader pass-through semaphore (Max, ATC'21).
//!
//! Every file-system operation runs in *shared* mode; a checkpoint's short swap of dirty sets runs
//! in *exclusive* mode. Shared entry and exit touch only the caller's per-CPU counter (one locked
//! add on a line no other core writes) and read the `exclusive` flag (a line that is written only
//! when a checkpoint starts or ends, so it stays shared in every cache). No shared cache line is
//! written on the common path.
//!
//! Invariants:
//! - While an [`ExclusiveGuard`] exists, no [`SharedGuard`] exists, and at most one
//!   `ExclusiveGuard` exists.
//! - A slot's counter counts the shared holders that incremented *that* slot and have not yet
//!   decremented it. A guard remembers its slot because the thread may migrate between entry and
//!   exit; counters therefore never go below zero and "every slot is zero" means "no holder".
//! - Writers are not starved: once the flag is up, new readers back off and wait, so the set of
//!   holders only shrinks until the writer gets in.
//!
//! Neither mode is reentrant: a thread that holds a shared guard and enters again (or asks for
//! exclusive) can deadlock against a pending writer.
//!
//! Memory ordering, the heart of it, is a Dekker-style handshake between two locations:
//!
//! ```text
//!   reader enter/exit                     writer (exclusive)
//!   counter[slot] += 1 / -= 1   (SeqCst)  exclusive = true           (SeqCst)
//!   read exclusive              (SeqCst)  read every counter[i]      (SeqCst)
//! ```
//!
//! All four are sequentially consistent, so they sit in one total order, and the store-buffer
//! outcome where each side misses the other's write is impossible. On entry: either the reader
//! sees the flag (and backs off) or the writer sees its increment (and waits for it). On exit:
//! either the reader sees the flag (and takes the mutex to wake the writer, which checks the
//! counters under that mutex, so the wake-up cannot be lost) or the writer sees the decrement.
//! On x86 the counter update is a `lock xadd`, already a full barrier, so SeqCst costs nothing
//! extra there. The SeqCst read/writes also give acquire/release edges: a writer that sees a
//! counter drop sees everything the reader did inside its critical section, and a reader that sees
//! the flag go down sees everything the writer did.
//!
//! In the crate's own tests under `cfg(loom)` the same code runs on loom's primitives for model
//! checking (other `cfg(loom)` builds use std: loom is only a dev-dependency). Loom models SeqCst
//! *accesses* only as acquire/release (it documents this) but models SeqCst *fences* exactly, so
//! under loom we add an explicit `fence(SeqCst)` between the two accesses of each side, which is
//! what the SeqCst accesses guarantee in the real memory model.

use super::percpu::PerCpu;
use std::sync::PoisonError;

// The slow path (back-off, drain) uses std's Mutex/Condvar rather than parking_lot's: loom mirrors
// std's API, so one code path is both run and model-checked, and the slow path is off the common
// path anyway.

#[cfg(all(loom, test))]
use loom::sync::{
    atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
    Condvar, Mutex, MutexGuard,
};
#[cfg(not(all(loom, test)))]
use std::sync::{
    atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
    Condvar, Mutex, MutexGuard,
};

/// How many times a writer re-reads the counters before parking. Readers hold the semaphore for
/// one file-system operation (microseconds), so a short spin usually avoids a sleep/wake pair.
#[cfg(not(all(loom, test)))]
const DRAIN_SPINS: u32 = 128;
/// In the model, one unlocked check keeps both the spin path and the parking path explored;
/// more would only add states.
#[cfg(all(loom, test))]
const DRAIN_SPINS: u32 = 1;

/// The semaphore's place in the lock hierarchy (`sync::rank`), held by every guard. Not under
/// loom: its model threads share one OS thread's thread-locals, where a rank record would mix
/// them up.
#[cfg(not(all(loom, test)))]
use super::rank::{Held as RankHeld, Rank};
#[cfg(all(loom, test))]
struct RankHeld;
#[cfg(all(loom, test))]
impl RankHeld {
    fn acquire(_: ()) -> Self {
        RankHeld
    }
    fn without_waiting(_: ()) -> Self {
        RankHeld
    }
}
#[cfg(all(loom, test))]
#[allow(non_upper_case_globals)]
mod rank_stub {
    pub struct Rank;
    impl Rank {
        pub const PassSem: () = ();
    }
}
#[cfg(all(loom, test))]
use rank_stub::Rank;

/// See the module documentation: restores SeqCst-access semantics under loom; a no-op otherwise.
#[inline(always)]
fn store_load_fence() {
    #[cfg(all(loom, test))]
    loom::sync::atomic::fence(SeqCst);
}

#[derive(Debug, Default)]
struct Slow {
    /// An exclusive holder exists (or is draining readers). Mirrors `PassSem::exclusive` but is
    /// read under the mutex, so a waiter's check-then-sleep cannot race with the holder's release.
    writer: bool,
}

/// A reader pass-through semaphore: cheap shared mode on per-CPU counters, rare exclusive mode.
pub struct PassSem {
    /// Shared holders per CPU slot. Only the owning CPU's threads write a slot, as a rule.
    counters: PerCpu<AtomicUsize>,
    /// Raised for the whole exclusive phase, from "start draining" to release. Read by every
    /// shared entry; written twice per checkpoint.
    exclusive: crossbeam::utils::CachePadded<AtomicBool>,
    slow: Mutex<Slow>,
    /// Readers that backed off and writers waiting for another writer sleep here until the
    /// exclusive phase ends.
    phase_over: Condvar,
    /// The draining writer sleeps here until the last reader leaves.
    drained: Condvar,
}

impl PassSem {
    /// A semaphore with one counter per possible CPU.
    pub fn new() -> Self {
        Self::with_slots(crate::sync::percpu::possible_cpus())
    }

    /// A semaphore with exactly `n` counters (at least one). Correct for any `n`; fewer slots than
    /// CPUs only means some cores share a counter line.
    pub fn with_slots(n: usize) -> Self {
        PassSem {
            counters: PerCpu::with_slots(n, |_| AtomicUsize::new(0)),
            exclusive: crossbeam::utils::CachePadded::new(AtomicBool::new(false)),
            slow: Mutex::new(Slow::default()),
            phase_over: Condvar::new(),
            drained: Condvar::new(),
        }
    }

    /// Enters shared mode on the counter of the CPU the caller runs on. Waits only while an
    /// exclusive phase is pending or running.
    #[inline]
    pub fn shared(&self) -> SharedGuard<'_> {
        self.shared_on(crate::sync::percpu::current_cpu())
    }

    /// Enters shared mode on the counter for `cpu` (wrapping modulo [`slots`](Self::slots)).
    /// For callers that already know their CPU, such as a lane, and for deterministic tests; any
    /// value is correct.
    pub fn shared_on(&self, cpu: usize) -> SharedGuard<'_> {
        let slot = self.counters.slot_of(cpu);
        let mut held = Some(RankHeld::acquire(Rank::PassSem));
        // Bounded by the number of exclusive phases that start while we try: each retry follows
        // a wait for one phase to end.
        loop {
            if let Some(g) = self.try_shared_on(slot, &mut held) {
                return g;
            }
            // Counted for the census; not in the model, whose rank is a stub.
            #[cfg(not(all(loom, test)))]
            super::census::contended(Rank::PassSem);
            self.wait_phase_over();
        }
    }

    /// Enters shared mode unless an exclusive phase is pending or running.
    #[cfg(test)]
    pub fn try_shared(&self) -> Option<SharedGuard<'_>> {
        self.try_shared_on(self.counters.current_slot(), &mut None)
    }

    /// `held`: the rank record of a caller that checked the hierarchy before waiting (taken
    /// into the guard on success); none for a try, which never waits.
    fn try_shared_on(&self, slot: usize, held: &mut Option<RankHeld>) -> Option<SharedGuard<'_>> {
        self.counters.get(slot).fetch_add(1, SeqCst);
        store_load_fence();
        if !self.exclusive.load(SeqCst) {
            let held = held.take().unwrap_or_else(|| RankHeld::without_waiting(Rank::PassSem));
            return Some(SharedGuard { sem: self, slot, _held: held });
        }
        // A writer is draining and may already have counted us: undo through the normal exit so
        // that it gets woken if we were the last one it waited for.
        self.exit(slot);
        None
    }

    fn exit(&self, slot: usize) {
        self.counters.get(slot).fetch_sub(1, SeqCst);
        store_load_fence();
        if self.exclusive.load(SeqCst) {
            // Taking the mutex orders our decrement before the writer's next check under it,
            // so this notification cannot fall between its check and its sleep.
            let _g = self.lock();
            self.drained.notify_all();
        }
    }

    fn wait_phase_over(&self) {
        let mut g = self.lock();
        while g.writer {
            g = self.phase_over.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Enters exclusive mode: waits for any other exclusive holder, stops new shared entries, and
    /// waits until every current shared holder has left. Keep the phase short: every file-system
    /// operation waits for it.
    pub fn exclusive(&self) -> ExclusiveGuard<'_> {
        let held = RankHeld::acquire(Rank::PassSem);
        {
            let mut g = self.lock();
            while g.writer {
                g = self.phase_over.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
            g.writer = true;
            self.exclusive.store(true, SeqCst);
        }
        store_load_fence();
        for _ in 0..DRAIN_SPINS {
            if self.all_zero() {
                return ExclusiveGuard { sem: self, _held: held };
            }
            std::hint::spin_loop();
        }
        let mut g = self.lock();
        // Each wake-up follows a reader's exit; readers cannot re-enter while the flag is up,
        // so this loop ends after at most (holders at flag time + back-off attempts) wake-ups.
        while !self.all_zero() {
            g = self.drained.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        drop(g);
        ExclusiveGuard { sem: self, _held: held }
    }

    /// True when no shared holder is counted on any slot. Only meaningful with the flag up
    /// (otherwise it is a snapshot that may be stale at once).
    fn all_zero(&self) -> bool {
        self.counters.iter().all(|c| c.load(SeqCst) == 0)
    }

    fn release_exclusive(&self) {
        let mut g = self.lock();
        g.writer = false;
        self.exclusive.store(false, SeqCst);
        drop(g);
        self.phase_over.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, Slow> {
        // The critical sections under this mutex cannot panic, so a poisoned lock still holds a
        // consistent `Slow`; recover rather than propagate.
        self.slow.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for PassSem {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for PassSem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassSem")
            .field("slots", &self.counters.len())
            .field("exclusive", &self.exclusive.load(SeqCst))
            .finish()
    }
}

/// Shared-mode membership; leaves on drop, on the slot it entered (not the caller's current CPU).
#[must_use = "the shared section ends when the guard is dropped"]
pub struct SharedGuard<'a> {
    sem: &'a PassSem,
    slot: usize,
    _held: RankHeld,
}

impl SharedGuard<'_> {
    /// The counter slot this guard incremented.
    #[cfg(test)]
    pub fn slot(&self) -> usize {
        self.slot
    }
}

impl Drop for SharedGuard<'_> {
    fn drop(&mut self) {
        self.sem.exit(self.slot);
    }
}

/// Exclusive-mode ownership; ends the exclusive phase and lets readers back in on drop.
#[must_use = "the exclusive section ends when the guard is dropped"]
pub struct ExclusiveGuard<'a> {
    sem: &'a PassSem,
    _held: RankHeld,
}

impl Drop for ExclusiveGuard<'_> {
    fn drop(&mut self) {
        self.sem.release_exclusive();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
    use std::sync::Arc;

    #[test]
    fn shared_guards_coexist_and_exclusive_waits_for_them() {
        crate::sync::rank::exempt_this_thread();
        let sem = Arc::new(PassSem::with_slots(2));
        let a = sem.shared_on(0);
        let b = sem.shared_on(1);
        assert_eq!((a.slot(), b.slot()), (0, 1));
        let got = Arc::new(AtomicBool::new(false));
        let t = {
            let (sem, got) = (sem.clone(), got.clone());
            std::thread::spawn(move || {
                crate::sync::rank::exempt_this_thread();
                let _x = sem.exclusive();
                got.store(true, SeqCst);
            })
        };
        // The writer raises the flag before draining. From then on new readers back off.
        while !sem.exclusive.load(SeqCst) {
            std::thread::yield_now();
        }
        assert!(sem.try_shared().is_none(), "reader entered while a writer was draining");
        assert!(!got.load(SeqCst), "exclusive granted while shared holders exist");
        drop(a);
        assert!(!got.load(SeqCst), "exclusive granted while a shared holder exists");
        drop(b);
        t.join().unwrap();
        assert!(got.load(SeqCst));
        // And readers get back in afterwards.
        drop(sem.shared());
    }

    #[test]
    fn guard_exits_on_the_slot_it_entered() {
        crate::sync::rank::exempt_this_thread();
        let sem = PassSem::with_slots(4);
        let g = sem.shared_on(6);
        assert_eq!(g.slot(), 2);
        assert_eq!(sem.counters.get(2).load(SeqCst), 1);
        drop(g);
        assert!(sem.all_zero());
    }

    /// 8 readers against a checkpointing writer: the writer never sees a reader inside, nothing
    /// deadlocks, and every entry and phase is accounted for.
    #[test]
    fn stress_readers_and_checkpointer() {
        crate::sync::rank::exempt_this_thread();
        const READERS: usize = 8;
        const ITERS: usize = 20_000;
        let sem = Arc::new(PassSem::new());
        let inside = Arc::new(AtomicUsize::new(0));
        let entries = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let (sem, inside, done) = (sem.clone(), inside.clone(), done.clone());
            std::thread::spawn(move || {
                crate::sync::rank::exempt_this_thread();
                let mut phases = 0usize;
                // At least some phases even if the readers finish fast.
                while !done.load(SeqCst) || phases < 50 {
                    let _x = sem.exclusive();
                    // Stay a while and let readers run (yield): any that got in would show.
                    for _ in 0..10 {
                        assert_eq!(inside.load(SeqCst), 0, "reader inside during exclusive phase");
                        std::thread::yield_now();
                    }
                    phases += 1;
                }
                phases
            })
        };
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (sem, inside, entries) = (sem.clone(), inside.clone(), entries.clone());
                std::thread::spawn(move || {
                    crate::sync::rank::exempt_this_thread();
                    for i in 0..ITERS {
                        let g = if i % 7 == 0 {
                            // Also exercise explicit slots, including migration-like mismatches.
                            sem.shared_on(i)
                        } else {
                            sem.shared()
                        };
                        inside.fetch_add(1, SeqCst);
                        entries.fetch_add(1, Relaxed);
                        for _ in 0..20 {
                            std::hint::spin_loop();
                        }
                        inside.fetch_sub(1, SeqCst);
                        drop(g);
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        done.store(true, SeqCst);
        let phases = writer.join().unwrap();
        assert!(phases >= 50);
        assert_eq!(entries.load(SeqCst), READERS * ITERS);
        assert_eq!(inside.load(SeqCst), 0);
        assert!(sem.all_zero(), "counters left non-zero");
        assert!(!sem.exclusive.load(SeqCst));
    }

    #[test]
    fn writers_exclude_each_other() {
        crate::sync::rank::exempt_this_thread();
        let sem = Arc::new(PassSem::new());
        let inside = Arc::new(AtomicUsize::new(0));
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let (sem, inside) = (sem.clone(), inside.clone());
                std::thread::spawn(move || {
                    crate::sync::rank::exempt_this_thread();
                    for _ in 0..500 {
                        let _x = sem.exclusive();
                        assert_eq!(inside.fetch_add(1, SeqCst), 0);
                        inside.fetch_sub(1, SeqCst);
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
    }
}

/// Model check of the protocol with loom: run with
/// `RUSTFLAGS="--cfg loom" cargo test -p lanefs --lib sync::pass_sem::loom_model --release`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use loom::sync::Arc;
    use loom::thread;

    use crate::sync::loom_check::model;

    /// Two readers on different slots and one writer: mutual exclusion and no lost wake-up
    /// (loom reports a deadlock if any thread sleeps forever).
    #[test]
    fn two_readers_one_writer() {
        crate::sync::rank::exempt_this_thread();
        model(|| {
            let sem = Arc::new(PassSem::with_slots(2));
            let inside = Arc::new(AtomicUsize::new(0));
            let readers: Vec<_> = (0..2)
                .map(|i| {
                    let (sem, inside) = (sem.clone(), inside.clone());
                    thread::spawn(move || {
                        let g = sem.shared_on(i);
                        inside.fetch_add(1, SeqCst);
                        inside.fetch_sub(1, SeqCst);
                        drop(g);
                    })
                })
                .collect();
            {
                let _x = sem.exclusive();
                assert_eq!(inside.load(SeqCst), 0);
            }
            for r in readers {
                r.join().unwrap();
            }
            assert!(sem.all_zero());
        });
    }

    /// One reader against two back-to-back exclusive phases: the flag goes up and down twice and
    /// a reader that backed off during either phase still gets in exactly once.
    #[test]
    fn reader_and_two_phases() {
        crate::sync::rank::exempt_this_thread();
        model(|| {
            let sem = Arc::new(PassSem::with_slots(2));
            let inside = Arc::new(AtomicUsize::new(0));
            let r = {
                let (sem, inside) = (sem.clone(), inside.clone());
                thread::spawn(move || {
                    let g = sem.shared_on(1);
                    inside.fetch_add(1, SeqCst);
                    inside.fetch_sub(1, SeqCst);
                    drop(g);
                })
            };
            for _ in 0..2 {
                let _x = sem.exclusive();
                assert_eq!(inside.load(SeqCst), 0);
            }
            r.join().unwrap();
            assert!(sem.all_zero());
        });
    }
}
