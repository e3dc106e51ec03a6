//! The contention census: for each lock class ([`Rank`]), how many acquisitions had to wait.
//!
//! A 2-core machine cannot show whether a design scales to 64 cores by its throughput alone;
//! it can show which locks two threads already meet on. Every ranked lock tries first and
//! calls [`contended`] only when the try fails (the range lock when a request queues, the
//! pass-through semaphore when a shared entry backs off), so the uncontended path costs
//! nothing more than before, and a contended one adds one relaxed add to a per-CPU slot that
//! no other core writes.
//!
//! The counters belong to the process, not to one file system: lock classes are static, and
//! a process mounting two images counts both. They only grow; a caller measures an interval
//! with two [`snapshot`]s and [`Census::since`]. A count is a lower bound on waits: a lock
//! freed between the try and the blocking call counts as contended without a wait, and is
//! rare enough not to matter.

use super::percpu::PerCpu;
use super::rank::Rank;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

type Slots = PerCpu<[AtomicU64; Rank::COUNT]>;

fn slots() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(|| PerCpu::new(|_| std::array::from_fn(|_| AtomicU64::new(0))))
}

/// Counts one acquisition of a lock of class `rank` that found it held.
#[inline]
pub fn contended(rank: Rank) {
    slots().current()[rank as usize].fetch_add(1, Ordering::Relaxed);
}

/// Takes a lock of class `rank` with `try_take` first and, only when that fails, counts the wait
/// and blocks in `take`: the uncontended cost stays the one compare-and-swap of a plain lock.
#[inline]
pub fn take_counted<G>(rank: Rank, try_take: impl FnOnce() -> Option<G>, take: impl FnOnce() -> G) -> G {
    try_take().unwrap_or_else(|| {
        contended(rank);
        take()
    })
}

/// Contended acquisitions per lock class, summed over the CPU slots.
#[derive(Clone, PartialEq, Eq)]
pub struct Census {
    counts: [u64; Rank::COUNT],
}

impl Default for Census {
    fn default() -> Self {
        Census { counts: [0; Rank::COUNT] }
    }
}

/// The counts now (not atomic across classes: adds that race with it may or may not show).
pub fn snapshot() -> Census {
    let mut counts = [0u64; Rank::COUNT];
    for slot in slots().iter() {
        for (c, s) in counts.iter_mut().zip(slot.iter()) {
            *c += s.load(Ordering::Relaxed);
        }
    }
    Census { counts }
}

impl Census {
    /// A census with the given counts (others zero): for reports and their tests.
    pub fn from_counts(counts: impl IntoIterator<Item = (Rank, u64)>) -> Census {
        let mut c = Census::default();
        for (r, n) in counts {
            c.counts[r as usize] += n;
        }
        c
    }

    /// Contended acquisitions of class `rank`.
    pub fn get(&self, rank: Rank) -> u64 {
        self.counts[rank as usize]
    }

    /// What was counted between `earlier` and `self`.
    pub fn since(&self, earlier: &Census) -> Census {
        Census { counts: std::array::from_fn(|i| self.counts[i].saturating_sub(earlier.counts[i])) }
    }

    /// Every class with a nonzero count, outermost first.
    pub fn nonzero(&self) -> impl Iterator<Item = (Rank, u64)> + '_ {
        Rank::ALL.iter().map(|&r| (r, self.get(r))).filter(|&(_, n)| n > 0)
    }

    /// Sum over every class.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl std::fmt::Debug for Census {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.nonzero().map(|(r, n)| (format!("{r:?}"), n))).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::rank::{Mutex, RwLock};
    use std::sync::{Arc, Barrier};

    /// One test, so that nothing else in this process counts its class: `DirHandles` is the
    /// FUSE adapter's, which no engine test runs.
    #[test]
    fn a_lock_that_waits_is_counted_and_a_free_one_is_not() {
        const R: Rank = Rank::DirHandles;
        let m = Arc::new(Mutex::new(R, 0u64));
        let before = snapshot();
        for _ in 0..1000 {
            *m.lock() += 1;
        }
        assert_eq!(snapshot().since(&before).get(R), 0, "an uncontended lock counted");
        let held = m.lock();
        let go = Arc::new(Barrier::new(2));
        let (m2, go2) = (m.clone(), go.clone());
        let t = std::thread::spawn(move || {
            go2.wait();
            *m2.lock() += 1;
        });
        go.wait();
        // The other thread tries, fails and counts before it parks; wait for the count.
        while snapshot().since(&before).get(R) == 0 {
            std::thread::yield_now();
        }
        drop(held);
        t.join().unwrap();
        let d = snapshot().since(&before);
        assert_eq!(d.get(R), 1);
        assert_eq!(d.nonzero().find(|&(r, _)| r == R), Some((R, 1)));
        assert_eq!(*m.lock(), 1001);

        // A reader behind a writer.
        let l = Arc::new(RwLock::new(R, ()));
        let before = snapshot();
        drop(l.read());
        drop(l.write());
        assert_eq!(snapshot().since(&before).get(R), 0);
        let w = l.write();
        let l2 = l.clone();
        let t = std::thread::spawn(move || drop(l2.read()));
        while snapshot().since(&before).get(R) == 0 {
            std::thread::yield_now();
        }
        drop(w);
        t.join().unwrap();
        assert_eq!(snapshot().since(&before).get(R), 1);
    }
}
