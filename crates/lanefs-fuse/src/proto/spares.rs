//! Workers that wait for the kernel, and the spare workers that keep their queue served.
//!
//! A handler that asks the kernel to write a file's dirty pages back (FUSE_NOTIFY_INVAL_INODE
//! over a range, which launders them) waits inside that notification until the kernel's WRITEs
//! for those pages are answered. The kernel queues those WRITEs where the notifying thread
//! runs: on its CPU's ring queue (FUSE over io_uring; a ring worker is pinned to its queue's
//! CPU), or on /dev/fuse. If every worker of that queue were waiting so, nothing would answer
//! the WRITEs and the mount would hang.
//!
//! So a worker waits for the kernel only inside a [`KernelWait`], and the invariant is: on each
//! queue, fewer workers wait than there are workers. A wait that would take the last one first
//! starts a spare worker on the queue and lets it register (its ring entry submitted, or its
//! /dev/fuse descriptor open) before the wait begins. Every other handler returns in finite
//! time, and holds nothing a waiting one needs (the waiting handler calls the engine only after
//! its notification), so some worker of the queue always comes back for the WRITEs. Spares stay
//! for the session's life: never more than the most workers that ever waited at once.
//!
//! A ring entry registered while requests wait for one is not handed them: the kernel gives a
//! queued request only to an entry that commits a reply. So a wait that starts a ring spare
//! then makes one request itself (`Spares::set_kick`), which goes to the spare at once, and
//! whose reply's commit takes the next queued request.
//!
//! A thread that is not a worker of a known queue (a ring worker that could not be pinned to
//! its CPU, whose WRITEs might go to another queue) gets no `KernelWait`: its handler must
//! answer without waiting for the kernel.

use lanefs::sync::{Mutex, Rank};
use std::cell::Cell;
use std::sync::mpsc;

/// Where a worker takes requests from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// The ring queue of a CPU (FUSE over io_uring).
    Ring(usize),
    /// /dev/fuse.
    Dev,
}

thread_local! {
    /// The queue this thread serves, once it is a worker that counts.
    static SERVING: Cell<Option<Queue>> = const { Cell::new(None) };
}

/// Workers and waiting workers of one queue.
#[derive(Debug, Default, Clone, Copy)]
struct Count {
    workers: usize,
    waiting: usize,
}

/// A request to start one more worker on `queue`; `ready` says whether it did.
pub(super) struct SpawnRequest {
    pub queue: Queue,
    pub ready: mpsc::SyncSender<bool>,
}

/// What the session's serving loop hears: a spare to start, or a worker that ended.
pub(super) enum Event {
    Spawn(SpawnRequest),
    Ended,
}

/// Makes a request from the calling thread (on its CPU's ring queue) and waits for its answer.
pub type Kick = Box<dyn Fn() + Send + Sync>;

/// The session's workers per queue, and the way to start spares.
pub struct Spares {
    /// Index: ring queue `q` at `q`, /dev/fuse last.
    counts: Mutex<Vec<Count>>,
    spawn: Mutex<Option<mpsc::Sender<Event>>>,
    /// See `wait_for_kernel`: set by the mount, which knows where it is mounted.
    kick: std::sync::OnceLock<Kick>,
}

impl Spares {
    /// Counts for `rings` ring queues and /dev/fuse.
    pub(super) fn new(rings: usize) -> Spares {
        Spares {
            counts: Mutex::new(Rank::FuseWorkers, vec![Count::default(); rings + 1]),
            spawn: Mutex::new(Rank::FuseWorkers, None),
            kick: std::sync::OnceLock::new(),
        }
    }

    /// How a new ring entry is put to work (see `wait_for_kernel`); the first one set stays.
    pub fn set_kick(&self, kick: Kick) {
        let _ = self.kick.set(kick);
    }

    fn index(&self, q: Queue, len: usize) -> Option<usize> {
        match q {
            Queue::Ring(i) if i + 1 < len => Some(i),
            Queue::Ring(_) => None,
            Queue::Dev => Some(len - 1),
        }
    }

    /// Where spare workers are asked for (the session's serving loop), or None to stop.
    pub(super) fn set_spawner(&self, tx: Option<mpsc::Sender<Event>>) {
        *self.spawn.lock() = tx;
    }

    /// The calling thread now serves `q`: it counts as one of its workers until the guard goes.
    pub(super) fn serving(&self, q: Queue) -> Serving<'_> {
        {
            let mut c = self.counts.lock();
            let len = c.len();
            if let Some(i) = self.index(q, len) {
                c[i].workers += 1;
            }
        }
        SERVING.with(|s| s.set(Some(q)));
        Serving { spares: self, queue: q }
    }

    /// Leave to wait for the kernel (for WRITEs it sends on the calling worker's queue), with
    /// another worker of that queue left to answer them; None if this thread serves no known
    /// queue or the spare it needed could not be started.
    ///
    /// Why the count holds: call `slack` = workers + spares being started - waiting, at least 1
    /// once a worker serves. A wait that finds a worker to spare (waiting + 1 < workers) leaves
    /// slack at least 1 + spares being started; one that does not starts its own spare, which
    /// leaves slack as it was; a spare that starts, a failed start (its wait undone) and a wait
    /// that ends never lower it. So once the spares asked for serve, fewer wait than serve.
    pub fn wait_for_kernel(&self) -> Option<KernelWait<'_>> {
        let q = SERVING.with(|s| s.get())?;
        let (i, covered) = {
            let mut c = self.counts.lock();
            let len = c.len();
            let i = self.index(q, len)?;
            debug_assert!(c[i].workers > 0, "the calling worker counts");
            c[i].waiting += 1;
            (i, c[i].waiting < c[i].workers)
        };
        let wait = KernelWait { spares: self, index: i };
        if covered {
            return Some(wait);
        }
        // Not covered: the spare this wait starts answers for it. (Others that wait meanwhile
        // are covered by it, or start their own.)
        if !self.start_spare(q) {
            return None;
        }
        if let Queue::Ring(_) = q {
            // A ring entry registered while requests queue for want of one is not given them:
            // the kernel hands a queued request only to an entry that commits a reply. The
            // spare's first request, made here on this CPU, goes to it at once (an entry is
            // free), and its commit takes the next queued one. A /dev/fuse reader takes
            // whatever is queued.
            match self.kick.get() {
                Some(kick) => kick(),
                None => return None,
            }
        }
        Some(wait)
    }

    /// Asks the serving loop for one more worker on `q` and waits until it serves (or could
    /// not be started).
    fn start_spare(&self, queue: Queue) -> bool {
        let (ready, started) = mpsc::sync_channel(1);
        let sent = self
            .spawn
            .lock()
            .as_ref()
            .is_some_and(|tx| tx.send(Event::Spawn(SpawnRequest { queue, ready })).is_ok());
        sent && started.recv().unwrap_or(false)
    }

    #[cfg(test)]
    fn count(&self, q: Queue) -> (usize, usize) {
        let c = self.counts.lock();
        let i = self.index(q, c.len()).expect("a known queue");
        (c[i].workers, c[i].waiting)
    }
}

/// A worker counted on its queue (`Spares::serving`).
pub(super) struct Serving<'a> {
    spares: &'a Spares,
    queue: Queue,
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        SERVING.with(|s| s.set(None));
        let mut c = self.spares.counts.lock();
        let len = c.len();
        if let Some(i) = self.spares.index(self.queue, len) {
            c[i].workers -= 1;
        }
    }
}

/// A worker waiting for the kernel (`Spares::wait_for_kernel`).
pub struct KernelWait<'a> {
    spares: &'a Spares,
    index: usize,
}

impl Drop for KernelWait<'_> {
    fn drop(&mut self) {
        let mut c = self.spares.counts.lock();
        debug_assert!(c[self.index].waiting > 0);
        c[self.index].waiting -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    /// Many workers of one queue wait for the kernel at once: spares are started so that one
    /// worker more than those waiting always serves, and none more than needed.
    #[test]
    fn waits_always_leave_a_worker_that_serves() {
        const WAITERS: usize = 16;
        let spares = Arc::new(Spares::new(2));
        let kicks = Arc::new(AtomicUsize::new(0));
        let k = kicks.clone();
        spares.set_kick(Box::new(move || {
            k.fetch_add(1, Ordering::Relaxed);
        }));
        let (tx, rx) = mpsc::channel::<Event>();
        spares.set_spawner(Some(tx));
        let started = Arc::new(AtomicUsize::new(0));
        let all_waiting = Arc::new(Barrier::new(WAITERS + 1));
        let release = Arc::new(Barrier::new(WAITERS + 1));
        std::thread::scope(|s| {
            // The serving loop: each spare counts as a worker of its queue, and lives on.
            let loop_spares = spares.clone();
            let loop_started = started.clone();
            let spare_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let spare_stop2 = spare_stop.clone();
            let spawner = s.spawn(move || {
                let mut spares_alive = Vec::new();
                while let Ok(Event::Spawn(r)) = rx.recv() {
                    let sp = loop_spares.clone();
                    let st = spare_stop2.clone();
                    let (up_tx, up_rx) = mpsc::sync_channel(1);
                    spares_alive.push(std::thread::spawn(move || {
                        let _w = sp.serving(r.queue);
                        up_tx.send(()).unwrap();
                        while !st.load(Ordering::Acquire) {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                    }));
                    up_rx.recv().unwrap();
                    loop_started.fetch_add(1, Ordering::Relaxed);
                    r.ready.send(true).unwrap();
                }
                spares_alive
            });
            let waiters: Vec<_> = (0..WAITERS)
                .map(|_| {
                    let (spares, all_waiting, release) =
                        (spares.clone(), all_waiting.clone(), release.clone());
                    s.spawn(move || {
                        let _w = spares.serving(Queue::Ring(1));
                        let wait = spares.wait_for_kernel().expect("a spare");
                        all_waiting.wait();
                        release.wait();
                        drop(wait);
                    })
                })
                .collect();
            all_waiting.wait();
            let (workers, waiting) = spares.count(Queue::Ring(1));
            assert_eq!(waiting, WAITERS);
            assert!(workers > waiting, "a worker serves: {workers} workers, {waiting} waiting");
            release.wait();
            for w in waiters {
                w.join().unwrap();
            }
            spares.set_spawner(None);
            spare_stop.store(true, Ordering::Release);
            for t in spawner.join().unwrap() {
                t.join().unwrap();
            }
        });
        // Each waiter brought at most one spare (one waiter alone on a queue of one needs one).
        let n = started.load(Ordering::Relaxed);
        assert!((1..=WAITERS).contains(&n), "{n} spares for {WAITERS} waiters");
        assert_eq!(kicks.load(Ordering::Relaxed), n, "each ring spare is kicked once");
        assert_eq!(spares.count(Queue::Ring(1)), (0, 0), "every worker and wait is gone");
        assert_eq!(spares.count(Queue::Ring(0)), (0, 0), "another queue is untouched");
    }

    #[test]
    fn a_thread_that_serves_no_queue_never_waits() {
        let spares = Spares::new(1);
        assert!(spares.wait_for_kernel().is_none());
        // A queue the session does not have.
        let _w = spares.serving(Queue::Ring(5));
        assert!(spares.wait_for_kernel().is_none());
    }

    #[test]
    fn without_a_spawner_only_spare_workers_already_there_are_used() {
        let spares = Spares::new(0);
        let _w = spares.serving(Queue::Dev);
        assert!(spares.wait_for_kernel().is_none(), "alone on its queue, and no spare can start");
    }

    #[test]
    fn a_ring_spare_without_a_kick_is_no_cover() {
        let spares = Spares::new(1);
        let (tx, rx) = mpsc::channel::<Event>();
        spares.set_spawner(Some(tx));
        let _w = spares.serving(Queue::Ring(0));
        std::thread::scope(|s| {
            s.spawn(move || {
                if let Ok(Event::Spawn(r)) = rx.recv() {
                    r.ready.send(true).unwrap();
                }
            });
            assert!(spares.wait_for_kernel().is_none(), "registered, but nothing puts it to work");
        });
        assert_eq!(spares.count(Queue::Ring(0)), (1, 0), "the failed wait is undone");
    }
}
