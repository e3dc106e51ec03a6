//! The background checkpoint and cleaning thread of a writable mount: it checkpoints on a timer
//! and whenever asked (`CpRequests::kick_checkpoint`: a bound passed, a writer short of space), and
//! cleans while free segments are short and the file system is quiet, or whatever the load
//! once they near the cleaning reserve. It lives with the checkpointer it drives, as F2FS keeps
//! `gc_thread_func` in gc.c; `Fs` only starts and stops it (`Background`).
//!
//! Invariants: one thread per writable mount. It ends when asked (`Background::stop`), or once
//! the file system failed or was shut down. A panic in it stops the file system (every later
//! change fails with EIO, as after a failed checkpoint, so no writer waits for ever for a
//! checkpoint) and is returned by `Background::stop` as an error, never swallowed.

use crate::engine::Engine;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the background thread looks at free space while it is short.
const GC_TICK: Duration = Duration::from_millis(200);

/// How often it looks at free space otherwise.
const GC_IDLE_LOOK: Duration = Duration::from_secs(1);

/// User bytes per tick below which the file system counts as lightly loaded (20 MiB/s): the
/// background cleaner runs only then, so it does not compete with a busy writer, which cleans
/// in the foreground if it must.
const QUIET_BYTES_PER_TICK: u64 = 4 << 20;

/// The running background thread of a mount.
pub(crate) struct Background {
    engine: Arc<Engine>,
    thread: JoinHandle<()>,
}

impl Background {
    /// Starts the thread: a checkpoint every `interval` (none: only when asked).
    pub(crate) fn start(engine: Arc<Engine>, interval: Option<Duration>) -> Result<Background> {
        debug_assert!(!engine.opts.read_only, "a read-only mount writes nothing");
        let bg = engine.clone();
        let thread = std::thread::Builder::new()
            .name("lanefs-checkpoint".into())
            .spawn(move || {
                let e = bg.clone();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    background_checkpoints(bg, interval)
                }));
                if let Err(p) = r {
                    // Writers waiting for a checkpoint would wait for ever: stop the file
                    // system instead (every later change fails with EIO, as after a failed
                    // checkpoint), and let `stop` report the panic.
                    e.ckpt.stop_with_failure(format!(
                        "the background checkpoint thread panicked: {}",
                        panic_text(&*p)
                    ));
                    std::panic::resume_unwind(p);
                }
            })
            .map_err(Error::Io)?;
        Ok(Background { engine, thread })
    }

    /// Asks the thread to end and waits for it. A panic in it is an error (EIO): its state is
    /// unknown, so the caller takes no final checkpoint (what was fsynced is in the journal).
    pub(crate) fn stop(self) -> Result<()> {
        {
            // Under the lock the thread checks before it waits, so the wake-up cannot fall
            // between its check and its wait.
            let (m, cv) = &self.engine.ckpt.requests.kick;
            let mut kicked = m.lock();
            *kicked = true;
            self.engine.ckpt.stop.store(true, Ordering::Release);
            cv.notify_all();
        }
        match self.thread.join() {
            Ok(()) => Ok(()),
            Err(p) => Err(Error::errno(
                libc::EIO,
                format!("the background checkpoint thread panicked: {}", panic_text(&*p)),
            )),
        }
    }
}

/// The message a panic carried (empty if it was not a string).
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// The thread's loop: checkpoints on a timer and whenever a bound is passed; cleans in the
/// background while free segments are short and the file system is quiet, or whatever the
/// load once they near the cleaning reserve.
fn background_checkpoints(e: Arc<Engine>, interval: Option<Duration>) {
    let mut last_cp = Instant::now();
    let mut last_user = e.disk.io.user.sum();
    loop {
        let gc_wanted = e.disk.table.free_segments() < e.gc_threshold();
        let until_cp = interval.map(|d| d.saturating_sub(last_cp.elapsed()));
        // Free space changes without a kick (a sync from another thread, deletes): look again
        // at least every GC_IDLE_LOOK.
        let tick = if gc_wanted { GC_TICK } else { GC_IDLE_LOOK };
        let wait = until_cp.map_or(tick, |d| d.min(tick));
        let kicked = {
            let (m, cv) = &e.ckpt.requests.kick;
            let mut kicked = m.lock();
            if !*kicked && !e.ckpt.stop.load(Ordering::Acquire) {
                cv.wait_for(&mut kicked, wait);
            }
            std::mem::take(&mut *kicked)
        };
        if e.ckpt.stop.load(Ordering::Acquire)
            || e.ckpt.failed.load(Ordering::Acquire)
            || e.disk.halt.is_halted()
        {
            return;
        }
        let due = kicked || interval.is_some_and(|d| last_cp.elapsed() >= d);
        let user = e.disk.io.user.sum();
        let quiet = user.wrapping_sub(last_user) < QUIET_BYTES_PER_TICK;
        last_user = user;
        let r = if due {
            last_cp = Instant::now();
            e.checkpoint(false)
        } else if gc_wanted && (quiet || e.gc_urgent()) {
            match e.clean_background() {
                Ok(plan) if plan.victims > 0 => {
                    last_cp = Instant::now();
                    Ok(())
                }
                Ok(_) => Ok(()),
                Err(err) => Err(err),
            }
        } else {
            Ok(())
        };
        if let Err(err) = r {
            if e.ckpt.failed.load(Ordering::Acquire) {
                // Logged where the file system was stopped.
                return;
            }
            tracing::warn!("lanefs: background cleaning: {err}");
        }
    }
}
