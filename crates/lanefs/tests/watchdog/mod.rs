//! A hang detector for the stress tests (issue 14: "the mount never hangs"), shared by
//! `crates/lanefs/tests/stress.rs` and, through `#[path]`, `crates/lanefs-cli/tests/fuse_stress.rs`
//! and `fuse_fio.rs`.
//!
//! Every thread of a test owns a [`Tracker`]: it names the operation it starts and counts it when
//! it returns. A watchdog thread samples the counters; when one active thread's counter has not
//! moved for the stall limit (10 s unless `LANEFS_STRESS_STALL_SECS` says otherwise), the test is
//! hung: a deadlock never ends on its own, so waiting longer only hides it. The watchdog then
//! prints, straight to file descriptor 2 (the test harness's capture would be lost with the
//! process), which thread is stuck in which operation, every thread's stack of this process and
//! of the other processes it was told about (the FUSE daemon) with `gdb -batch`, and, as a
//! fallback without gdb, each thread's state, `wchan` and kernel stack from /proc. Then it runs
//! the test's clean-up (kill the daemon by PID, detach the mount by path, remove temporary files)
//! and exits the process with status 101, as a failed test does. A panic would not do: the
//! threads that would have to unwind are the ones stuck.
//!
//! One wait is not a hang: the file system waiting for its own device. When the stall limit
//! passes while a thread of the FUSE daemon or of this process waits for an io_uring
//! completion (or a daemon thread sleeps uninterruptibly, in a synchronous read or write of its
//! image), the disk under the image is slow (a VM's disk behind a burst of other writes can
//! take seconds per write). The watchdog says so, with those threads, and waits up to the
//! device limit (120 s unless `LANEFS_STRESS_DEVICE_STALL_SECS` says otherwise) before it
//! fires. A completion that never comes is still caught, at that limit.

#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a thread may go without finishing an operation: `LANEFS_STRESS_STALL_SECS`, 10 s by
/// default (issue 14). No single operation of these tests comes near it on a working system.
pub fn stall_limit() -> Duration {
    let secs = std::env::var("LANEFS_STRESS_STALL_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    Duration::from_secs(secs)
}

/// How long a stall may last while the file system waits for its device (see the module
/// docs): `LANEFS_STRESS_DEVICE_STALL_SECS`, 120 s by default.
pub fn device_stall_limit() -> Duration {
    let secs =
        std::env::var("LANEFS_STRESS_DEVICE_STALL_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    Duration::from_secs(secs)
}

/// Threads waiting for device I/O: of `own` (this process) in io_uring's completion wait; of
/// `daemons` in it or in uninterruptible sleep. Threads of this process in uninterruptible sleep
/// do not count: a thread waiting for a FUSE reply sleeps that way too.
pub fn device_waits(own: u32, daemons: &[u32]) -> Vec<String> {
    let mut out = Vec::new();
    for (pid, daemon) in std::iter::once((own, false)).chain(daemons.iter().map(|&p| (p, true))) {
        let dir = format!("/proc/{pid}/task");
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.filter_map(|e| e.ok()) {
            let tid = e.file_name().to_string_lossy().to_string();
            let base = format!("{dir}/{tid}");
            let wchan = std::fs::read_to_string(format!("{base}/wchan")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("{base}/stat")).unwrap_or_default();
            let state = stat.rfind(')').and_then(|b| stat[b + 1..].split_whitespace().next()).unwrap_or("?");
            if wchan.trim() == "io_cqring_wait" || (daemon && state == "D") {
                out.push(format!("{pid}/{tid} ({state}, {})", wchan.trim()));
            }
        }
    }
    out
}

/// Writes a line to fd 2 directly: the harness captures `eprintln!`, and its buffer dies with
/// the process when the watchdog exits it.
pub fn say(msg: &str) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(msg.as_bytes());
    let _ = e.write_all(b"\n");
    let _ = e.flush();
}

struct Slot {
    name: String,
    ops: AtomicU64,
    /// Only active slots are watched: a thread that finished, or the main thread while it only
    /// waits for the others, makes no progress and is not hung.
    active: AtomicBool,
    /// The operation under way (for the report).
    doing: Mutex<&'static str>,
}

/// The per-thread counters.
#[derive(Default)]
pub struct Progress {
    slots: Mutex<Vec<Arc<Slot>>>,
}

/// Held by a worker thread: marks it idle when it ends, and sets the shared stop flag if it
/// panics, so that the other threads end early and the test reports the panic instead of
/// running to its deadline.
pub struct StopOnPanic(pub Arc<AtomicBool>, pub Tracker);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        self.1.idle();
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

/// One thread's counter.
#[derive(Clone)]
pub struct Tracker {
    slot: Arc<Slot>,
}

impl Progress {
    pub fn new() -> Arc<Progress> {
        Arc::new(Progress::default())
    }

    /// A new active counter named `name`.
    pub fn tracker(&self, name: impl Into<String>) -> Tracker {
        let slot = Arc::new(Slot {
            name: name.into(),
            ops: AtomicU64::new(0),
            active: AtomicBool::new(true),
            doing: Mutex::new("starting"),
        });
        self.slots.lock().unwrap().push(slot.clone());
        Tracker { slot }
    }

    /// Operations counted so far by every thread.
    pub fn total(&self) -> u64 {
        self.slots.lock().unwrap().iter().map(|s| s.ops.load(Ordering::Relaxed)).sum()
    }

    fn report(&self) -> String {
        let mut out = String::new();
        for s in self.slots.lock().unwrap().iter() {
            out.push_str(&format!(
                "  {:<14} {:>9} ops  {}  last: {}\n",
                s.name,
                s.ops.load(Ordering::Relaxed),
                if s.active.load(Ordering::Relaxed) { "active" } else { "idle  " },
                s.doing.lock().map(|d| *d).unwrap_or("?"),
            ));
        }
        out
    }
}

impl Tracker {
    /// Names the operation about to start (and marks the thread active).
    pub fn begin(&self, op: &'static str) {
        if let Ok(mut d) = self.slot.doing.lock() {
            *d = op;
        }
        self.slot.active.store(true, Ordering::Release);
    }

    /// Counts a finished operation.
    pub fn done(&self) {
        self.slot.ops.fetch_add(1, Ordering::Release);
    }

    /// `begin(op)`, `f()`, `done()`.
    pub fn step<T>(&self, op: &'static str, f: impl FnOnce() -> T) -> T {
        self.begin(op);
        let r = f();
        self.done();
        r
    }

    /// The thread stops being watched (finished, or only waiting for others that are).
    pub fn idle(&self) {
        if let Ok(mut d) = self.slot.doing.lock() {
            *d = "idle";
        }
        self.slot.active.store(false, Ordering::Release);
    }

    pub fn count(&self) -> u64 {
        self.slot.ops.load(Ordering::Relaxed)
    }
}

/// What the watchdog does when it fires, besides dumping this process.
pub struct OnHang {
    /// Other processes whose stacks tell the story (name, PID): the FUSE daemon, fio.
    pub suspects: Arc<Mutex<Vec<(String, u32)>>>,
    /// Clean-up before the process exits: kill daemons by PID, detach mounts by path, remove
    /// temporary files.
    pub cleanup: Box<dyn FnOnce() + Send>,
}

impl OnHang {
    pub fn nothing() -> OnHang {
        OnHang { suspects: Arc::default(), cleanup: Box::new(|| {}) }
    }
}

/// The watchdog thread; stops when dropped.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Watchdog {
    pub fn start(test: &str, progress: Arc<Progress>, limit: Duration, on_hang: OnHang) -> Watchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let test = test.to_string();
        let handle = std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || watch(&test, &progress, limit, on_hang, &st))
            .expect("spawn the watchdog");
        Watchdog { stop, handle: Some(handle) }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Samples every 250 ms until told to stop (the test's end bounds the loop).
fn watch(test: &str, progress: &Progress, limit: Duration, on_hang: OnHang, stop: &AtomicBool) {
    // Per slot: the count last seen, whether it was active, and since when nothing changed.
    let mut seen: Vec<(u64, bool, Instant)> = Vec::new();
    let device_limit = device_stall_limit().max(limit);
    // When the watchdog last said the device was slow (once per stall limit, not every sample).
    let mut said_slow: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(250));
        let slots: Vec<Arc<Slot>> = progress.slots.lock().unwrap().clone();
        let now = Instant::now();
        let mut stuck = Vec::new();
        let mut longest = Duration::ZERO;
        for (i, s) in slots.iter().enumerate() {
            let ops = s.ops.load(Ordering::Acquire);
            let active = s.active.load(Ordering::Acquire);
            if i == seen.len() {
                seen.push((ops, active, now));
                continue;
            }
            let e = &mut seen[i];
            if ops != e.0 || active != e.1 {
                *e = (ops, active, now);
            } else if active && now - e.2 >= limit {
                stuck.push(format!("{} (in {})", s.name, s.doing.lock().map(|d| *d).unwrap_or("?")));
                longest = longest.max(now - e.2);
            }
        }
        if stuck.is_empty() {
            continue;
        }
        if longest < device_limit {
            let daemons: Vec<u32> =
                on_hang.suspects.lock().map(|v| v.iter().map(|(_, p)| *p).collect()).unwrap_or_default();
            let waits = device_waits(std::process::id(), &daemons);
            if !waits.is_empty() {
                if said_slow.is_none_or(|t| now - t >= limit) {
                    said_slow = Some(now);
                    say(&format!(
                        "==== WATCHDOG ({test}): no progress for {} s by {}, but threads wait for the \
                         device ({}): a slow disk, not a hang; waiting up to {} s",
                        longest.as_secs(),
                        stuck.join(", "),
                        waits.join(", "),
                        device_limit.as_secs()
                    ));
                }
                continue;
            }
        }
        fire(test, progress, longest, &stuck, on_hang);
    }
}

fn fire(test: &str, progress: &Progress, limit: Duration, stuck: &[String], on_hang: OnHang) -> ! {
    say(&format!(
        "\n==== WATCHDOG ({test}): no progress for {} s by {}: the test is hung. Counters:\n{}",
        limit.as_secs(),
        stuck.join(", "),
        progress.report()
    ));
    let me = std::process::id();
    let mut procs = vec![("this test".to_string(), me)];
    procs.extend(on_hang.suspects.lock().map(|v| v.clone()).unwrap_or_default());
    // The other processes first: the daemon's threads wait in user space, where gdb stops them.
    procs.rotate_left(1);
    for (name, pid) in &procs {
        let kernel = proc_stacks(*pid);
        say(&format!("==== stacks of {name} (pid {pid}), gdb:"));
        if *pid == me && kernel.contains("fuse") {
            // A thread waiting for a FUSE reply cannot be stopped by ptrace until the daemon
            // answers: gdb would wait for it until its time limit, and leave this process
            // stopped. Its kernel stack below shows the wait; the counters show the operation.
            say("(not attached: threads of this test wait on FUSE requests; see their kernel stacks)");
        } else {
            say(&gdb_stacks(*pid));
        }
        say(&format!("==== threads of {name} (pid {pid}) from /proc (state, wchan, kernel stack):"));
        say(&kernel);
    }
    say("==== WATCHDOG: cleaning up and failing the test");
    (on_hang.cleanup)();
    say(&format!("==== WATCHDOG ({test}): FAILED: hung (no progress for {} s)", limit.as_secs()));
    std::process::exit(101);
}

/// `gdb -p PID -batch -ex "thread apply all bt"`. Its output goes to a file, not a pipe: when
/// PID is this process, gdb stops every thread of it, the watchdog's too, so nobody would read
/// a pipe and gdb would block on it for ever. For the same reason the two-minute bound is kept by
/// `timeout` from outside the process, not by us.
pub fn gdb_stacks(pid: u32) -> String {
    let out = std::env::temp_dir().join(format!("lanefs-watchdog-{}-gdb-{pid}.txt", std::process::id()));
    let Ok(file) = std::fs::File::create(&out) else { return format!("(cannot create {})", out.display()) };
    let status = Command::new("timeout")
        .args(["-s", "KILL", "120", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt"])
        .stdin(Stdio::null())
        .stdout(file.try_clone().map(Stdio::from).unwrap_or(Stdio::null()))
        .stderr(Stdio::from(file))
        .status();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    // A gdb killed by `timeout` while attaching leaves its SIGSTOP pending in the process it
    // attached to; SIGCONT discards it, so that the process is not stopped later.
    // (kill(1) by its PID: the lanefs crate's rustix has no process feature.)
    let _ = Command::new("kill").args(["-CONT", &pid.to_string()]).status();
    match status {
        Err(e) => format!("(gdb not run: {e})"),
        Ok(_) if text.contains("gdb: No such file") || text.contains("failed to run command") => {
            format!("(gdb not found: scripts/install-deps installs it) {}", text.trim())
        }
        Ok(st) => {
            // gdb's chatter about symbol loading is noise; keep the thread headers and frames.
            let kept: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("Thread ") || l.starts_with('#') || l.starts_with("    "))
                .collect();
            if kept.is_empty() {
                format!("(gdb, {st}, printed no stacks) {text}")
            } else {
                kept.join("\n")
            }
        }
    }
}

/// For each thread of `pid`: tid, name, state, wchan and the kernel stack (root may read it).
pub fn proc_stacks(pid: u32) -> String {
    let mut out = String::new();
    let dir = format!("/proc/{pid}/task");
    let Ok(rd) = std::fs::read_dir(&dir) else { return format!("({dir} unreadable)") };
    let mut tids: Vec<String> =
        rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into()).collect();
    tids.sort_by_key(|t| t.parse::<u64>().unwrap_or(0));
    for tid in tids {
        let base = format!("{dir}/{tid}");
        let stat = std::fs::read_to_string(format!("{base}/stat")).unwrap_or_default();
        // stat: "tid (comm) S ...": the name may hold spaces, so split at the last ')'.
        let (comm, rest) = match (stat.find('('), stat.rfind(')')) {
            (Some(a), Some(b)) if a < b => (&stat[a + 1..b], stat[b + 1..].trim()),
            _ => ("?", ""),
        };
        let state = rest.split_whitespace().next().unwrap_or("?");
        let wchan = std::fs::read_to_string(format!("{base}/wchan")).unwrap_or_default();
        out.push_str(&format!("  tid {tid} ({comm}) state {state} wchan {}\n", wchan.trim()));
        if let Ok(k) = std::fs::read_to_string(format!("{base}/stack")) {
            for l in k.lines().take(12) {
                out.push_str(&format!("      {l}\n"));
            }
        }
    }
    out
}
