//! Requests in flight, a log of those that stay too long, and a count of every request served.
//!
//! An operator whose mount hangs should find the stuck request in the log, with its opcode and
//! inode, without attaching gdb. Every FUSE handler marks its worker's slot on entry
//! ([`Inflight::enter`]) and the guard it gets clears the slot when the handler returns. A
//! [`Watcher`] thread looks at the slots about once a second and logs each request older than
//! the threshold exactly once: its opcode, inode, the caller's pid (from the request header, so
//! free; the kernel sends the calling thread's id) and its age. The threshold is 30 s unless `-o stuck_request_secs=N` sets it (0: no
//! watcher).
//!
//! Where the log goes: stderr under `--foreground`; for the detached daemon, whose stdio is
//! /dev/null, syslog (ident `lanefs`, facility daemon, level warning), which journald keeps
//! (`journalctl -t lanefs`).
//!
//! The request path must not pay for this with a shared cache line: each worker thread claims
//! one slot on its first request, padded to its own pair of cache lines, and is its only
//! writer, so marking a request is a few plain stores and a clock read, with no lock and no
//! read-modify-write. The watcher reads a slot as a sequence lock: the sequence number is odd
//! while a request is in flight, and a read during which it changed is dropped (the request it
//! saw has ended). A request counts once: the watcher remembers, per slot, the sequence number
//! of the last request it reported.
//!
//! The same slot counts the requests its thread served, by opcode ([`Inflight::requests`];
//! published by [`crate::stats`]): one more plain load and store in a line the thread already
//! owns. Requests the adapter serves without marking them (FORGET, FLUSH, RELEASEDIR) are
//! counted with [`Inflight::count`].

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

macro_rules! ops {
    ($($op:ident = $name:literal),* $(,)?) => {
        /// The FUSE requests the adapter serves, named as the kernel's protocol names them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Op { $($op),* }

        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$op),*];
            /// How many there are: the length of a counter array indexed by `op as usize`.
            pub const COUNT: usize = Op::ALL.len();

            pub fn name(self) -> &'static str {
                match self { $(Op::$op => $name),* }
            }
        }
    };
}

ops! {
    Lookup = "LOOKUP", Getattr = "GETATTR", Setattr = "SETATTR",
    Readlink = "READLINK", Mknod = "MKNOD", Mkdir = "MKDIR", Unlink = "UNLINK", Rmdir = "RMDIR",
    Symlink = "SYMLINK", Rename = "RENAME", Link = "LINK", Open = "OPEN", Read = "READ",
    Write = "WRITE", Release = "RELEASE", Fsync = "FSYNC", Opendir = "OPENDIR",
    Readdir = "READDIR", Readdirplus = "READDIRPLUS", Fsyncdir = "FSYNCDIR", Statfs = "STATFS", Setxattr = "SETXATTR", Getxattr = "GETXATTR",
    Listxattr = "LISTXATTR", Removexattr = "REMOVEXATTR", Access = "ACCESS", Create = "CREATE",
    Fallocate = "FALLOCATE", Lseek = "LSEEK", CopyFileRange = "COPY_FILE_RANGE", Ioctl = "IOCTL",
    Statx = "STATX", Tmpfile = "TMPFILE",
    // Counted only (see `Inflight::count`): they cannot wait on anything.
    Forget = "FORGET", Flush = "FLUSH", Releasedir = "RELEASEDIR",
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One worker's request, and the requests it has served. Whole pairs of cache lines: the
/// adjacent-line prefetcher of x86 pulls lines in pairs, so a neighbour on the other half would
/// still be shared.
#[repr(align(128))]
struct Slot {
    /// Odd while a request is in flight; the fields below belong to it.
    seq: AtomicU64,
    op: AtomicU32,
    pid: AtomicU32,
    ino: AtomicU64,
    /// Nanoseconds since the tracker's epoch.
    start: AtomicU64,
    /// Requests served, by `Op`. The slot's thread is their only writer (a load and a store,
    /// no read-modify-write); readers sum them while they change, which is a count that was
    /// true at some moment for each opcode.
    counts: [AtomicU64; Op::COUNT],
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            seq: AtomicU64::new(0),
            op: AtomicU32::new(0),
            pid: AtomicU32::new(0),
            ino: AtomicU64::new(0),
            start: AtomicU64::new(0),
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Gives each tracker an identity that a thread's cached slot index is checked against.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A thread's slot: (tracker id, index); an index past the slots means "none left".
const NO_SLOT: usize = usize::MAX;

thread_local! {
    static MINE: Cell<(u64, usize)> = const { Cell::new((0, NO_SLOT)) };
}

/// The requests in flight on the worker threads of one mount.
pub struct Inflight {
    id: u64,
    epoch: Instant,
    slots: Box<[Slot]>,
    claimed: AtomicUsize,
    /// The counts of threads past the slots (shared by them, so added atomically).
    spill: [AtomicU64; Op::COUNT],
}

/// Marks a request in flight until dropped.
#[must_use = "the request counts as in flight only while the guard lives"]
pub struct Busy<'a>(Option<&'a Slot>);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.0 {
            s.seq.store(s.seq.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        }
    }
}

/// A request seen in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    pub worker: usize,
    pub op: Op,
    pub ino: u64,
    /// The calling process; 0 when the kernel itself sent it (writeback, readahead).
    pub pid: u32,
    pub age: Duration,
}

impl fmt::Display for Stuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {} on inode {} ", self.op, self.ino)?;
        if self.pid == 0 {
            f.write_str("from the kernel")?;
        } else {
            write!(f, "from pid {}", self.pid)?;
        }
        write!(f, " in flight for {} s on worker {}; the mount may be hung", self.age.as_secs(), self.worker)
    }
}

impl Inflight {
    /// A tracker for `workers` threads. A thread past that many is not tracked.
    pub fn new(workers: usize) -> Inflight {
        Inflight {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            epoch: Instant::now(),
            slots: (0..workers.max(1)).map(|_| Slot::default()).collect(),
            claimed: AtomicUsize::new(0),
            spill: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// This thread's slot, claimed on its first request. A thread serves one mount, so one
    /// cached index per thread is enough.
    fn my_slot(&self) -> Option<&Slot> {
        let (id, index) = MINE.get();
        let index = if id == self.id {
            index
        } else {
            let i = self.claimed.fetch_add(1, Ordering::Relaxed);
            let i = if i < self.slots.len() { i } else { NO_SLOT };
            MINE.set((self.id, i));
            i
        };
        self.slots.get(index)
    }

    /// Counts a request of `op` served by this thread (`enter` counts its own).
    pub fn count(&self, op: Op) {
        match self.my_slot() {
            Some(slot) => Self::bump(slot, op),
            None => {
                self.spill[op as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn bump(slot: &Slot, op: Op) {
        let c = &slot.counts[op as usize];
        c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Requests served so far, all opcodes together.
    pub fn total(&self) -> u64 {
        let slots = self.slots.iter().flat_map(|s| s.counts.iter());
        slots.chain(self.spill.iter()).map(|c| c.load(Ordering::Relaxed)).fold(0, u64::wrapping_add)
    }

    /// Requests served so far, by opcode, every opcode listed (in `Op::ALL` order).
    pub fn requests(&self) -> Vec<(Op, u64)> {
        Op::ALL
            .iter()
            .map(|&op| {
                let i = op as usize;
                let n = self.slots.iter().map(|s| s.counts[i].load(Ordering::Relaxed)).sum::<u64>();
                (op, n + self.spill[i].load(Ordering::Relaxed))
            })
            .collect()
    }

    /// Counts a request of this thread and marks it in flight until the guard drops.
    pub fn enter(&self, op: Op, ino: u64, pid: u32) -> Busy<'_> {
        let Some(slot) = self.my_slot() else {
            self.spill[op as usize].fetch_add(1, Ordering::Relaxed);
            return Busy(None);
        };
        Self::bump(slot, op);
        let seq = slot.seq.load(Ordering::Relaxed);
        if seq & 1 == 1 {
            // A handler inside a handler: the outer request is the one that can get stuck.
            return Busy(None);
        }
        // A watcher that reads one of the stores below must also see the end of the previous
        // request (seq even), or it would take the new fields for the old request's.
        fence(Ordering::Release);
        slot.op.store(op as u32, Ordering::Relaxed);
        slot.pid.store(pid, Ordering::Relaxed);
        slot.ino.store(ino, Ordering::Relaxed);
        slot.start.store(self.now(), Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(1), Ordering::Release);
        Busy(Some(slot))
    }

    /// The request in flight on slot `i`, with its sequence number; None if there is none, or
    /// it ended while being read.
    fn read(&self, i: usize) -> Option<(u64, Stuck)> {
        self.read_with(i, || {})
    }

    /// `read`, calling `between` after the fields are loaded and before the check that they
    /// belong to one request: a test makes the request end there.
    fn read_with(&self, i: usize, between: impl FnOnce()) -> Option<(u64, Stuck)> {
        let s = &self.slots[i];
        let seq = s.seq.load(Ordering::Acquire);
        if seq & 1 == 0 {
            return None;
        }
        let op = s.op.load(Ordering::Relaxed);
        let pid = s.pid.load(Ordering::Relaxed);
        let ino = s.ino.load(Ordering::Relaxed);
        let start = s.start.load(Ordering::Relaxed);
        between();
        fence(Ordering::Acquire);
        if s.seq.load(Ordering::Relaxed) != seq {
            return None;
        }
        let op = *Op::ALL.get(op as usize)?;
        let age = Duration::from_nanos(self.now().saturating_sub(start));
        Some((seq, Stuck { worker: i, op, ino, pid, age }))
    }

    /// Every request in flight now.
    pub fn in_flight(&self) -> Vec<Stuck> {
        (0..self.slots.len()).filter_map(|i| self.read(i).map(|(_, s)| s)).collect()
    }
}

/// Finds requests older than a threshold, each once.
pub struct Scanner {
    /// Per slot, the sequence number of the last request reported (0: none; in-flight numbers
    /// are odd).
    reported: Vec<u64>,
}

impl Scanner {
    pub fn new(inflight: &Inflight) -> Scanner {
        Scanner { reported: vec![0; inflight.slots.len()] }
    }

    /// The requests in flight for at least `threshold` that no earlier scan returned.
    pub fn scan(&mut self, inflight: &Inflight, threshold: Duration) -> Vec<Stuck> {
        let mut out = Vec::new();
        for i in 0..inflight.slots.len() {
            if let Some((seq, s)) = inflight.read(i) {
                if s.age >= threshold && self.reported[i] != seq {
                    self.reported[i] = seq;
                    out.push(s);
                }
            }
        }
        out
    }
}

/// A thread that calls its function once a tick; stopped and joined on drop (what the
/// function owns is dropped before the join returns).
pub struct Ticker {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    pub fn spawn(
        name: &str,
        tick: Duration,
        mut each: impl FnMut() + Send + 'static,
    ) -> std::io::Result<Ticker> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            // Ends when the sender is dropped (Disconnected); a timeout is a tick.
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                each();
            }
        })?;
        Ok(Ticker { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let joined = t.join();
            // Its functions only read counters, log, or open and close a file: a panic is a
            // bug, which a test build should show.
            debug_assert!(joined.is_ok(), "a lanefs ticker thread panicked");
        }
    }
}

/// The thread that logs stuck requests; stopped and joined on drop.
pub struct Watcher {
    _thread: Ticker,
}

impl Watcher {
    /// Looks every second (more often under a threshold of under 2 s) and calls `log` once for
    /// each request in flight for `threshold` or longer.
    pub fn spawn(
        inflight: Arc<Inflight>,
        threshold: Duration,
        log: Box<dyn Fn(&Stuck) + Send>,
    ) -> std::io::Result<Watcher> {
        let tick = (threshold / 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut scanner = Scanner::new(&inflight);
        Ticker::spawn("lanefs-stuck", tick, move || {
            for s in scanner.scan(&inflight, threshold) {
                log(&s);
            }
        })
        .map(|t| Watcher { _thread: t })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[test]
    fn threads_entering_and_leaving_leave_nothing_in_flight() {
        let t = Arc::new(Inflight::new(4));
        std::thread::scope(|s| {
            for w in 0..4u64 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..10_000u64 {
                        let _b = t.enter(Op::Write, w * 100_000 + i, w as u32);
                    }
                });
            }
        });
        assert!(t.in_flight().is_empty());
        assert!(Scanner::new(&t).scan(&t, Duration::ZERO).is_empty());
    }

    /// A thread that holds requests for a test: at each step it tells the test (`entered`) and
    /// waits for its word (`go`). A test that fails drops `go`, which ends the thread instead of
    /// leaving it waiting for ever.
    fn holder<'s>(
        s: &'s std::thread::Scope<'s, '_>,
        t: &'s Inflight,
        requests: Vec<(Op, u64, u32)>,
    ) -> (mpsc::Sender<()>, mpsc::Receiver<()>) {
        let (go, wait) = mpsc::channel::<()>();
        let (entered, seen) = mpsc::channel::<()>();
        s.spawn(move || {
            for (op, ino, pid) in requests {
                let _b = t.enter(op, ino, pid);
                if entered.send(()).is_err() || wait.recv().is_err() {
                    return;
                }
            }
        });
        (go, seen)
    }

    #[test]
    fn a_request_over_the_threshold_is_reported_once_and_a_cleared_one_never() {
        let t = Inflight::new(2);
        let mut scanner = Scanner::new(&t);
        let ms = Duration::from_millis;
        std::thread::scope(|s| {
            // A quick request first: it ends long before the threshold.
            holder(s, &t, vec![(Op::Getattr, 7, 1)]).1.recv().unwrap();
            let (go, entered) = holder(s, &t, vec![(Op::Fsync, 42, 4321), (Op::Read, 43, 4321)]);
            entered.recv().unwrap();
            assert!(scanner.scan(&t, ms(200)).is_empty(), "reported too early");
            std::thread::sleep(ms(250));
            let seen = scanner.scan(&t, ms(200));
            assert_eq!(seen.len(), 1, "{seen:?}");
            let st = &seen[0];
            assert_eq!((st.op, st.ino, st.pid), (Op::Fsync, 42, 4321));
            assert!(st.age >= ms(200), "{st:?}");
            let line = st.to_string();
            assert!(
                line.contains("FSYNC") && line.contains("inode 42") && line.contains("pid 4321"),
                "{line}"
            );
            for _ in 0..3 {
                assert!(scanner.scan(&t, ms(200)).is_empty(), "reported twice");
            }
            // Cleared, then another long one on the same worker: a new request, reported on its own.
            go.send(()).unwrap();
            entered.recv().unwrap();
            std::thread::sleep(ms(250));
            let seen = scanner.scan(&t, ms(200));
            assert_eq!(seen.iter().map(|s| (s.op, s.ino)).collect::<Vec<_>>(), vec![(Op::Read, 43)]);
            go.send(()).unwrap();
        });
        std::thread::sleep(ms(250));
        assert!(scanner.scan(&t, Duration::ZERO).is_empty(), "a cleared request was reported");
        assert!(t.in_flight().is_empty());
    }

    #[test]
    fn a_scan_never_mixes_two_requests() {
        // Each request's fields all carry the same number: a torn read would show two.
        let t = Arc::new(Inflight::new(1));
        let stop = std::sync::atomic::AtomicBool::new(false);
        /// Stops the writer however the reader ends, or a failed assertion would wait for it
        /// for ever.
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut i = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    // Back to back, so that the fields change under a reader as often as can be.
                    let _b = t.enter(Op::ALL[i as usize % Op::ALL.len()], i, i as u32);
                    i += 1;
                }
            });
            let _stop = Stop(&stop);
            let mut seen = 0;
            let start = Instant::now();
            while start.elapsed() < Duration::from_millis(300) || seen == 0 {
                assert!(start.elapsed() < Duration::from_secs(30), "never saw a request in flight");
                for st in t.in_flight() {
                    assert_eq!(st.ino as u32, st.pid, "{st:?}");
                    assert_eq!(Op::ALL[st.ino as usize % Op::ALL.len()], st.op, "{st:?}");
                    seen += 1;
                }
            }
        });
    }

    #[test]
    fn a_request_that_ends_while_it_is_read_is_dropped() {
        let t = Inflight::new(1);
        std::thread::scope(|s| {
            let (go, entered) = holder(s, &t, vec![(Op::Write, 1, 1), (Op::Read, 2, 2)]);
            entered.recv().unwrap();
            // The first request ends and the second begins between the loads and the check:
            // what was loaded may be half of each, and must not be reported.
            let r = t.read_with(0, || {
                go.send(()).unwrap();
                entered.recv().unwrap();
            });
            assert_eq!(r, None);
            let (_, now) = t.read(0).expect("the second request");
            assert_eq!((now.op, now.ino, now.pid), (Op::Read, 2, 2));
            go.send(()).unwrap();
        });
    }

    #[test]
    fn every_request_is_counted_by_opcode_also_past_the_slots() {
        let t = Inflight::new(2);
        std::thread::scope(|s| {
            for w in 0..4u64 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..1000u64 {
                        let _b = t.enter(if i % 4 == 0 { Op::Create } else { Op::Lookup }, w, 1);
                        // A handler inside a handler is not in flight on its own, but counts.
                        let _inner = t.enter(Op::Getattr, w, 1);
                        t.count(Op::Flush);
                    }
                });
            }
        });
        let n: HashMap<Op, u64> = t.requests().into_iter().collect();
        assert_eq!(n.len(), Op::COUNT, "every opcode is listed");
        assert_eq!(
            (n[&Op::Create], n[&Op::Lookup], n[&Op::Getattr], n[&Op::Flush]),
            (1000, 3000, 4000, 4000)
        );
        assert_eq!(n.values().sum::<u64>(), 12_000, "{n:?}");
    }

    #[test]
    fn threads_past_the_slots_are_not_tracked() {
        let t = Inflight::new(1);
        std::thread::scope(|s| {
            let (go, entered) = holder(s, &t, vec![(Op::Lookup, 1, 1)]);
            entered.recv().unwrap();
            let late = s.spawn(|| {
                let _b = t.enter(Op::Lookup, 2, 2);
                t.in_flight().iter().map(|s| s.ino).collect::<Vec<_>>()
            });
            assert_eq!(late.join().unwrap(), vec![1]);
            go.send(()).unwrap();
        });
    }

    #[test]
    fn the_watcher_logs_a_stuck_request_once() {
        let t = Arc::new(Inflight::new(2));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let w = Watcher::spawn(
            t.clone(),
            Duration::from_millis(100),
            Box::new(move |s| sink.lock().unwrap().push(s.to_string())),
        )
        .unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let _b = t.enter(Op::CopyFileRange, 99, 5);
                std::thread::sleep(Duration::from_millis(600));
            });
            s.spawn(|| {
                for i in 0..1000 {
                    let _b = t.enter(Op::Getattr, i, 6);
                }
            });
        });
        drop(w);
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with("request COPY_FILE_RANGE on inode 99 from pid 5"), "{lines:?}");
    }
}
