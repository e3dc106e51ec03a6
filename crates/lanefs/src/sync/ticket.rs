//! A one-shot outcome that later work waits for: whether one journal flush got its
//! transaction written.
//!
//! fsync takes a directory's unjournaled records under the directory's flush lock and writes
//! them after letting the lock go (`crate::flush`), so a later flush of the same directory can
//! collect, build and write its own transaction while the earlier one's write is still in
//! progress. What the later one must not do is count as durable before the earlier one's
//! blocks are written: its records may depend on the earlier one's (a create it names), and
//! its device flush covers only writes that completed before it. Each flush therefore leaves a
//! [`Ticket`] in the directories it collected from, and the next one waits for it before it
//! flushes the device (or commits to the region) and returns.
//!
//! Invariants:
//! - A ticket is resolved exactly once, to written or not; a [`TicketGuard`] dropped before it
//!   resolves its ticket resolves it as not written, so no waiter waits forever on a flush that
//!   returned early or panicked.
//! - [`Ticket::wait`] returns only once the ticket is resolved, and returns the outcome.
//! - Waiting takes only the ticket's own leaf lock: a waiter may hold anything ranked below it.
//!   A flush waits only for tickets registered before its own (under a lock both held), so the
//!   waits follow registration order and cannot form a cycle.

use super::rank::{Condvar, Mutex, Rank};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

const PENDING: u8 = 0;
const WRITTEN: u8 = 1;
const NOT_WRITTEN: u8 = 2;

/// Whether one flush's transaction was written; see the module documentation.
pub struct Ticket {
    /// `PENDING`, `WRITTEN` or `NOT_WRITTEN`; read without the lock on the fast path.
    state: AtomicU8,
    /// Held only to wait and to resolve, so a resolve cannot slip between a waiter's check and
    /// its sleep.
    lock: Mutex<()>,
    resolved: Condvar,
}

impl Ticket {
    /// A new, unresolved ticket, with the guard that resolves it.
    pub fn issue() -> (Arc<Ticket>, TicketGuard) {
        let t = Arc::new(Ticket {
            state: AtomicU8::new(PENDING),
            lock: Mutex::new(Rank::Ticket, ()),
            resolved: Condvar::new(),
        });
        (t.clone(), TicketGuard(Some(t)))
    }

    /// Waits until the ticket is resolved; returns whether the flush was written.
    pub fn wait(&self) -> bool {
        let s = self.state.load(Ordering::Acquire);
        if s != PENDING {
            return s == WRITTEN;
        }
        let mut g = self.lock.lock();
        // Bounded: the owner resolves the ticket once (its guard does if it does not), and
        // nothing it waits for meanwhile waits for this thread (registration order).
        loop {
            match self.state.load(Ordering::Acquire) {
                PENDING => self.resolved.wait(&mut g),
                s => return s == WRITTEN,
            }
        }
    }

    /// Resolved already (without waiting).
    pub fn is_resolved(&self) -> bool {
        self.state.load(Ordering::Acquire) != PENDING
    }

    fn resolve(&self, written: bool) {
        let _g = self.lock.lock();
        let prev = self.state.swap(if written { WRITTEN } else { NOT_WRITTEN }, Ordering::AcqRel);
        assert_eq!(prev, PENDING, "a ticket is resolved once");
        self.resolved.notify_all();
    }
}

/// The owner's side of a [`Ticket`]: resolves it once, and as not written if dropped first.
pub struct TicketGuard(Option<Arc<Ticket>>);

impl TicketGuard {
    /// Resolves the ticket: every waiter returns `written`.
    pub fn resolve(mut self, written: bool) {
        let t = self.0.take().expect("unresolved guard");
        t.resolve(written);
    }
}

impl Drop for TicketGuard {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.resolve(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn waiters_get_the_outcome_and_a_dropped_guard_means_not_written() {
        let (t, g) = Ticket::issue();
        assert!(!t.is_resolved());
        g.resolve(true);
        assert!(t.is_resolved() && t.wait());
        let (t, g) = Ticket::issue();
        drop(g);
        assert!(t.is_resolved() && !t.wait());
    }

    /// A chain of flushes, as directories make them: each waits for the one before it and is
    /// written only if it was. Many threads, each link resolved by a different thread, some
    /// dropped (not written): afterwards every ticket is resolved, and a ticket is written
    /// exactly when no link at or before it was dropped.
    #[test]
    fn a_chain_of_tickets_resolved_by_many_threads_keeps_its_order() {
        const N: usize = 64;
        for round in 0..20u64 {
            let issued: Vec<_> = (0..N).map(|_| Ticket::issue()).collect();
            let tickets: Vec<Arc<Ticket>> = issued.iter().map(|(t, _)| t.clone()).collect();
            let dropped = |i: usize| (i as u64 * 7 + round).is_multiple_of(23);
            let first_drop = (0..N).find(|&i| dropped(i)).unwrap_or(N);
            let waited = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for (i, (_, guard)) in issued.into_iter().enumerate() {
                    let before = (i > 0).then(|| tickets[i - 1].clone());
                    let waited = &waited;
                    s.spawn(move || {
                        let ok = before.is_none_or(|b| {
                            waited.fetch_add(1, Ordering::Relaxed);
                            b.wait()
                        });
                        if dropped(i) {
                            drop(guard);
                        } else {
                            guard.resolve(ok);
                        }
                    });
                }
            });
            assert_eq!(waited.load(Ordering::Relaxed), N - 1);
            for (i, t) in tickets.iter().enumerate() {
                assert!(t.is_resolved(), "ticket {i} of round {round}");
                assert_eq!(t.wait(), i < first_drop, "ticket {i} of round {round}");
            }
        }
    }
}
