//! Cooperative commit: callers that would wait for someone else's I/O submit it instead
//! (Son, SNU 2018).
//!
//! A caller reserves a slot ([`CommitQueue::reserve`]), pushes its request into it
//! ([`Slot::push`], which never waits) and waits for the request's outcome
//! ([`CommitQueue::wait`]). A waiter that finds its request queued and no batch being written
//! becomes the submitter: it takes every queued request, from every caller, and runs the
//! write function on them as one batch with the queue's lock released; the others sleep until
//! it has recorded the batch's outcome. A batch goes through two stages, write then flush, and
//! only the write stage is one batch at a time: once a batch is written, its submitter lets the
//! next batch's submitter write while it runs the flush function. So a caller that arrives
//! while a batch is flushing writes its blocks beside that flush (the flush function shares
//! flushes between batches: group commit), instead of waiting for the flush and then writing.
//! Batches are written in queue order, one after the other, each taken only once the one
//! before it is written (or has failed and undone what it must).
//!
//! Bound: at most `bound` requests are queued or reserved at once; `reserve` waits for room
//! (the next batch taken frees its slots). It is called before the caller takes any lock a
//! submitter might need (in the engine: before a lane's chain lock), so a full queue never
//! holds up the submitter that empties it. `push` never waits, so it may be called under such
//! a lock, which is what keeps requests in the order the caller's lock gave them.
//!
//! Under `cfg(loom)` in the crate's tests the same code runs on loom's primitives (the model
//! is at the end of this file); the lock's rank is then not recorded, as for the pass-through
//! semaphore.

use std::collections::{HashMap, VecDeque};
use std::sync::PoisonError;

#[cfg(all(loom, test))]
use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(all(loom, test)))]
use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(all(loom, test)))]
use super::rank::{Held as RankHeld, Rank};
#[cfg(all(loom, test))]
struct RankHeld;
#[cfg(all(loom, test))]
impl RankHeld {
    fn acquire(_: ()) -> Self {
        RankHeld
    }
}
#[cfg(all(loom, test))]
#[allow(non_upper_case_globals)]
mod rank_stub {
    pub struct Rank;
    impl Rank {
        pub const CommitQueue: () = ();
    }
}
#[cfg(all(loom, test))]
use rank_stub::Rank;

/// A queue of commit requests `R`, submitted in batches by their own callers; a failed
/// request's error is `E` (cloned to every caller of a failed batch).
pub struct CommitQueue<R, E> {
    state: Mutex<State<R, E>>,
    /// Signalled when a batch is taken (slots free), when a batch's write stage ends (a waiter
    /// may become the next submitter), and when outcomes are recorded.
    cv: Condvar,
    bound: usize,
}

struct State<R, E> {
    /// Requests waiting for a batch, in push order, with their ids.
    queued: VecDeque<(u64, R)>,
    /// Slots reserved or queued: at most `bound`.
    taken: usize,
    /// A batch is in its write stage (its submitter runs without the lock).
    writing: bool,
    next_id: u64,
    /// Outcomes not yet collected by their callers.
    outcomes: HashMap<u64, Result<(), E>>,
    /// Batches submitted so far.
    batches: u64,
}

/// A reserved place in the queue: [`Slot::push`] fills it, dropping it gives it back.
pub struct Slot<'a, R, E> {
    q: &'a CommitQueue<R, E>,
    used: bool,
}

/// A pushed request, to wait for with [`CommitQueue::wait`].
#[must_use = "a pushed request must be waited for"]
#[derive(Debug)]
pub struct Pending {
    id: u64,
}

impl<R, E: Clone> CommitQueue<R, E> {
    /// A queue holding at most `bound` (at least 1) requests at once.
    pub fn new(bound: usize) -> Self {
        CommitQueue {
            state: Mutex::new(State {
                queued: VecDeque::new(),
                taken: 0,
                writing: false,
                next_id: 0,
                outcomes: HashMap::new(),
                batches: 0,
            }),
            cv: Condvar::new(),
            bound: bound.max(1),
        }
    }

    fn lock(&self) -> (MutexGuard<'_, State<R, E>>, RankHeld) {
        let held = RankHeld::acquire(Rank::CommitQueue);
        (self.state.lock().unwrap_or_else(PoisonError::into_inner), held)
    }

    fn wait_on<'a>(&self, g: MutexGuard<'a, State<R, E>>) -> MutexGuard<'a, State<R, E>> {
        self.cv.wait(g).unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until the queue has room, and reserves it. The caller must hold no lock that a
    /// submitter takes (see the module documentation): the slot frees when a batch is taken.
    pub fn reserve(&self) -> Slot<'_, R, E> {
        let (mut st, _held) = self.lock();
        // Bounded: every queued request's caller waits for it, and one of them takes the
        // queue whole as soon as the batch in flight (finite I/O) is done.
        while st.taken >= self.bound {
            st = self.wait_on(st);
        }
        st.taken += 1;
        debug_assert!(st.taken <= self.bound, "{} slots taken of {}", st.taken, self.bound);
        Slot { q: self, used: false }
    }

    /// Waits for `p`'s outcome. If `p` is still queued and no batch is being written when
    /// the caller looks, it takes every queued request (its own among them) and, without the
    /// lock, calls `write` on them; if that succeeds, it releases the write stage to the next
    /// batch and calls `flush` on them. The batch's outcome is the first error of the two, for
    /// every request in it. `write` may call [`CommitQueue::fail_queued`] (a failed batch may
    /// doom requests queued after it, and no batch is taken until `write` returns); neither
    /// may wait for a request of this queue.
    pub fn wait(
        &self,
        p: Pending,
        write: impl FnOnce(&[R]) -> Result<(), E>,
        flush: impl FnOnce(&[R]) -> Result<(), E>,
    ) -> Result<(), E> {
        let (mut st, mut held) = self.lock();
        let mut stages = Some((write, flush));
        // Bounded: a request is queued, in a batch in flight, or done; a batch's stages are
        // finite I/O, and once the write stage in progress ends a waiter of the queued ones
        // takes them.
        loop {
            if let Some(r) = st.outcomes.remove(&p.id) {
                return r;
            }
            // Not done: queued, or in a batch in flight. The queue is in id order (ids are
            // given as requests are pushed) and a batch takes it whole, so ours is queued
            // exactly when the queue starts at or before it. A caller submits at most once,
            // the batch that holds its own request.
            let ours_queued = st.queued.front().is_some_and(|(id, _)| *id <= p.id);
            let go = if ours_queued && !st.writing { stages.take() } else { None };
            let Some((write, flush)) = go else {
                st = self.wait_on(st);
                continue;
            };
            debug_assert!(st.queued.iter().any(|(id, _)| *id == p.id), "request {} lost", p.id);
            st.writing = true;
            st.batches += 1;
            let (ids, reqs): (Vec<u64>, Vec<R>) = st.queued.drain(..).unzip();
            st.taken -= ids.len();
            // Slots freed: callers waiting to reserve may queue for the next batch.
            self.cv.notify_all();
            // The submitter does the batch's I/O holding nothing of the queue: it may take
            // locks ranked above it (a lane's chain) and `fail_queued`.
            drop(st);
            drop(held);
            let written = write(&reqs);
            // The write stage ends before the flush: the next batch is written beside it. A
            // failed write ends it only once `write` has undone what later batches must not
            // build on.
            (st, held) = self.lock();
            st.writing = false;
            self.cv.notify_all();
            let outcome = match written {
                Ok(()) => {
                    drop(st);
                    drop(held);
                    let r = flush(&reqs);
                    (st, held) = self.lock();
                    r
                }
                Err(e) => Err(e),
            };
            drop(reqs);
            for id in ids {
                st.outcomes.insert(id, outcome.clone());
            }
            self.cv.notify_all();
        }
    }

    /// Fails every queued request `doomed` picks with `e` and takes it out of the queue;
    /// returns how many. For a submitter whose batch failed in a way that dooms requests
    /// queued after it.
    pub fn fail_queued(&self, doomed: impl Fn(&R) -> bool, e: &E) -> usize {
        let (mut st, _held) = self.lock();
        let before = st.queued.len();
        let mut failed = Vec::new();
        st.queued.retain(|(id, r)| {
            let keep = !doomed(r);
            if !keep {
                failed.push(*id);
            }
            keep
        });
        debug_assert_eq!(before, st.queued.len() + failed.len());
        st.taken -= failed.len();
        for id in &failed {
            st.outcomes.insert(*id, Err(e.clone()));
        }
        if !failed.is_empty() {
            self.cv.notify_all();
        }
        failed.len()
    }

    /// Batches submitted since the queue was made.
    #[cfg(test)]
    pub fn batches(&self) -> u64 {
        self.lock().0.batches
    }
}

impl<R, E: Clone> Slot<'_, R, E> {
    /// Queues `req` in the reserved slot; never waits.
    pub fn push(mut self, req: R) -> Pending {
        let (mut st, _held) = self.q.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.queued.push_back((id, req));
        debug_assert!(st.queued.len() <= st.taken, "{} queued in {} slots", st.queued.len(), st.taken);
        self.used = true;
        Pending { id }
    }
}

impl<R, E> Drop for Slot<'_, R, E> {
    fn drop(&mut self) {
        if self.used {
            return;
        }
        let held = RankHeld::acquire(Rank::CommitQueue);
        let mut st = self.q.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.taken -= 1;
        self.q.cv.notify_all();
        drop(st);
        drop(held);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_lone_caller_submits_its_own_request() {
        let q: CommitQueue<u32, String> = CommitQueue::new(4);
        let p = q.reserve().push(7);
        let mut seen = Vec::new();
        let mut flushed = false;
        q.wait(
            p,
            |b| {
                seen = b.to_vec();
                Ok(())
            },
            |b| {
                assert_eq!(b, [7], "the flush stage sees the batch it follows");
                flushed = true;
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, vec![7]);
        assert!(flushed);
        assert_eq!(q.batches(), 1);
        // A slot given back unused frees its room.
        drop(q.reserve());
        assert_eq!(q.lock().0.taken, 0);
    }

    #[test]
    fn threads_share_batches_and_every_request_is_submitted_once() {
        let q: Arc<CommitQueue<(usize, usize), String>> = Arc::new(CommitQueue::new(3));
        let submitted = Arc::new(crate::sync::rank::Mutex::new(crate::sync::Rank::Device, Vec::new()));
        let (writing, flushing) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let beside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let (q, submitted) = (q.clone(), submitted.clone());
                let (writing, flushing, beside) = (writing.clone(), flushing.clone(), beside.clone());
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let p = q.reserve().push((t, i));
                        q.wait(
                            p,
                            |b| {
                                assert_eq!(
                                    writing.fetch_add(1, Ordering::SeqCst),
                                    0,
                                    "one write stage at a time"
                                );
                                assert!(b.len() <= 3, "a batch of {} past the bound", b.len());
                                if flushing.load(Ordering::SeqCst) > 0 {
                                    beside.fetch_add(1, Ordering::Relaxed);
                                }
                                submitted.lock().extend(b.iter().copied());
                                writing.fetch_sub(1, Ordering::SeqCst);
                                Ok(())
                            },
                            |_| {
                                flushing.fetch_add(1, Ordering::SeqCst);
                                std::thread::yield_now();
                                flushing.fetch_sub(1, Ordering::SeqCst);
                                Ok(())
                            },
                        )
                        .unwrap();
                        // Done only once written: the request is in the submitted list.
                        assert!(submitted.lock().contains(&(t, i)), "({t}, {i}) done unwritten");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut all = submitted.lock().clone();
        // Each thread's requests go in its push order (batches are written in queue order).
        for t in 0..6 {
            let mine: Vec<usize> = all.iter().filter(|r| r.0 == t).map(|r| r.1).collect();
            assert_eq!(mine, (0..200).collect::<Vec<_>>(), "thread {t}'s requests in order");
        }
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 1200, "every request submitted exactly once");
        let b = q.batches();
        assert!((400..=1200).contains(&b), "{b} batches for 1,200 requests, at most 3 each");
        assert!(q.lock().0.outcomes.is_empty(), "every outcome collected");
        eprintln!("{} of {b} batches written beside another's flush", beside.load(Ordering::Relaxed));
    }

    #[test]
    fn a_batch_is_written_while_the_one_before_it_flushes() {
        let q: Arc<CommitQueue<u32, String>> = Arc::new(CommitQueue::new(4));
        let (tx, rx) = std::sync::mpsc::channel();
        let p = q.reserve().push(0);
        q.wait(
            p,
            |_| Ok(()),
            |_| {
                // In our flush stage: a second caller's batch is taken, written and flushed
                // without waiting for ours to end.
                let (q2, tx) = (q.clone(), tx.clone());
                std::thread::spawn(move || {
                    let p = q2.reserve().push(1);
                    let r = q2.wait(p, |b| if b == [1] { Ok(()) } else { Err(format!("{b:?}")) }, |_| Ok(()));
                    tx.send(r).unwrap();
                });
                let r = rx.recv_timeout(std::time::Duration::from_secs(20));
                assert_eq!(r, Ok(Ok(())), "the next batch waited for this one's flush");
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(q.batches(), 2);
    }

    #[test]
    fn a_failed_batch_fails_each_of_its_callers_and_the_doomed_queued_ones() {
        let q: CommitQueue<u32, String> = CommitQueue::new(8);
        let p0 = q.reserve().push(0);
        let p1 = q.reserve().push(1);
        let never = |_: &[u32]| -> Result<(), String> { unreachable!("not submitted by this caller") };
        let r = q.wait(
            p0,
            |b| {
                assert_eq!(b, [0, 1]);
                // Pushed while the batch is being written, then doomed by its failure.
                let later = q.reserve().push(2);
                let spared = q.reserve().push(3);
                assert_eq!(q.fail_queued(|r| *r == 2, &"doomed".to_string()), 1);
                assert_eq!((later.id, spared.id), (2, 3));
                Err("bad".to_string())
            },
            |_| unreachable!("a batch that failed to write is not flushed"),
        );
        assert_eq!(r, Err("bad".to_string()));
        assert_eq!(q.wait(p1, never, never), Err("bad".to_string()));
        assert_eq!(q.wait(Pending { id: 2 }, never, never), Err("doomed".to_string()));
        let mut got = Vec::new();
        let flush_failed = q.wait(
            Pending { id: 3 },
            |b| {
                got = b.to_vec();
                Ok(())
            },
            |_| Err("flush".to_string()),
        );
        assert_eq!(got, vec![3], "the spared request went in the next batch");
        assert_eq!(flush_failed, Err("flush".to_string()), "a failed flush fails its batch");
        assert_eq!(q.lock().0.taken, 0);
    }
}

/// Model check with loom: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p
/// lanefs-loom --release`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use loom::sync::Arc;
    use loom::thread;

    use crate::sync::loom_check::model;

    /// Three callers, a bound of two: every request is submitted exactly once, one write
    /// stage at a time, each caller gets its outcome only once its batch is written and
    /// flushed, and nobody sleeps forever (loom reports that).
    #[test]
    fn three_callers_bound_two() {
        model(|| {
            let q: Arc<CommitQueue<usize, ()>> = Arc::new(CommitQueue::new(2));
            let seen = Arc::new(AtomicUsize::new(0));
            let flushed = Arc::new(AtomicUsize::new(0));
            let writing = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..3)
                .map(|i| {
                    let (q, seen, flushed, writing) =
                        (q.clone(), seen.clone(), flushed.clone(), writing.clone());
                    thread::spawn(move || {
                        let p = q.reserve().push(i);
                        q.wait(
                            p,
                            |b| {
                                assert_eq!(writing.fetch_add(1, SeqCst), 0, "two batches written at once");
                                assert!(!b.is_empty() && b.len() <= 2);
                                for r in b {
                                    let bit = 1 << r;
                                    assert_eq!(seen.fetch_or(bit, SeqCst) & bit, 0, "submitted twice");
                                }
                                writing.fetch_sub(1, SeqCst);
                                Ok(())
                            },
                            |b| {
                                for r in b {
                                    flushed.fetch_or(1 << r, SeqCst);
                                }
                                Ok(())
                            },
                        )
                        .unwrap();
                        // Done only once written and flushed.
                        assert_ne!(flushed.load(SeqCst) & (1 << i), 0);
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(seen.load(SeqCst), 0b111);
        });
    }

    /// A failed batch: each caller in it gets the error, and a caller queued meanwhile still
    /// completes.
    #[test]
    fn failure_reaches_the_batch() {
        model(|| {
            let q: Arc<CommitQueue<usize, u8>> = Arc::new(CommitQueue::new(4));
            let threads: Vec<_> = (0..2)
                .map(|i| {
                    let q = q.clone();
                    thread::spawn(move || {
                        let p = q.reserve().push(i);
                        let failed = Arc::new(AtomicUsize::new(0));
                        let f = failed.clone();
                        let r = q.wait(
                            p,
                            move |b| {
                                // Request 0 fails its whole batch.
                                if b.contains(&0) {
                                    f.store(1, SeqCst);
                                    return Err(9);
                                }
                                Ok(())
                            },
                            |_| Ok(()),
                        );
                        if i == 0 {
                            assert_eq!(r, Err(9));
                        }
                        if failed.load(SeqCst) == 1 {
                            assert_eq!(r, Err(9), "the submitter's own batch failed");
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        });
    }
}
