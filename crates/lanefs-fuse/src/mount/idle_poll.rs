//! Idle CPUs kept quick to wake while the mount serves requests (`-o idle_poll=on`, the
//! default).
//!
//! Why: the kernel's FUSE wakes a caller whose request was answered with a plain wake-up from
//! the worker's CPU, where the worker is still running. The scheduler then moves the caller to
//! an idle CPU, and waking that CPU costs an idle exit: on a virtual machine a halted vCPU
//! must be scheduled again by the host. A caller making one request after another (one thread
//! creating files) migrates on every reply and pays that exit every time. Measured on a
//! 2-vCPU KVM guest (haltpoll, no halt polling) at e218926 with a loop of getxattr(2) on the
//! mount's root: 21.6 µs a round trip, 3.4 µs with the caller pinned to one CPU, 3.4 µs with
//! idle CPUs polling; a create loop 100 µs a file against 26 µs. A kernel file system has no
//! round trip to pay it on. (The FUSE-over-io_uring patches had the answer inside the kernel,
//! a wake-up on the current CPU, and left it out of what was merged.)
//!
//! What the daemon does: while requests arrive, it holds a PM QoS CPU latency request of
//! 0 µs (`/dev/cpu_dma_latency`, the interface tuned's latency profiles and cyclictest use),
//! with which idle CPUs poll instead of sleeping; it gives the request back once no request
//! came for [`QUIET`]. An idle mount thus costs the machine nothing, and a busy one costs
//! polling on CPUs that have nothing else to do. `-o idle_poll=off` leaves the CPUs' idle
//! states to the system. The device needs root; without it the mount serves as before and says
//! why once.
//!
//! The request path pays nothing for this: a thread looks at the request counters every
//! [`TICK`] (the per-worker counts of [`Inflight`], which the workers keep anyway).

use crate::inflight::{Inflight, Ticker};
use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// The PM QoS device: an open descriptor with a value written holds that bound for every CPU
/// until it is closed.
pub const QOS_DEVICE: &str = "/dev/cpu_dma_latency";

/// How often the counters are read.
pub const TICK: Duration = Duration::from_millis(10);

/// How long without a request before the CPUs are let sleep again.
pub const QUIET: Duration = Duration::from_millis(100);

/// Whether the CPUs should be kept polling, from the request total seen at each tick.
#[derive(Debug)]
struct Activity {
    last_total: u64,
    /// Ticks in a row that saw no request; saturates at the quiet bound.
    quiet_ticks: u32,
}

impl Activity {
    const QUIET_TICKS: u32 = (QUIET.as_millis() / TICK.as_millis()) as u32;

    /// Starts quiet: no hold until a request comes.
    fn new(total: u64) -> Activity {
        Activity { last_total: total, quiet_ticks: Self::QUIET_TICKS }
    }

    /// Takes one tick's total and says whether to hold the latency request now.
    fn hold(&mut self, total: u64) -> bool {
        if total != self.last_total {
            self.last_total = total;
            self.quiet_ticks = 0;
        } else {
            self.quiet_ticks = (self.quiet_ticks + 1).min(Self::QUIET_TICKS);
        }
        debug_assert!(self.quiet_ticks <= Self::QUIET_TICKS);
        self.quiet_ticks < Self::QUIET_TICKS
    }
}

// A quiet spell spans several ticks, or one late tick would let go of a busy mount.
const _: () = assert!(Activity::QUIET_TICKS >= 2);

/// A held CPU latency request of 0 µs: given back when dropped (the descriptor closes).
struct Held {
    /// Never read: the request lasts as long as the descriptor is open.
    _fd: File,
}

impl Held {
    fn take() -> std::io::Result<Held> {
        let mut f = std::fs::OpenOptions::new().write(true).open(QOS_DEVICE)?;
        // The device takes the bound as a native 32-bit integer (or as hex text).
        f.write_all(&0i32.to_ne_bytes())?;
        Ok(Held { _fd: f })
    }
}

/// The thread that holds and gives back the latency request; stopped and joined on drop,
/// which gives the request back.
pub struct IdlePoll {
    _thread: Ticker,
}

impl IdlePoll {
    /// Starts the thread. Whether the device can be used is tried first: an error says why
    /// not (and whether for want of permission), and then no thread is left running.
    pub fn spawn(inflight: Arc<Inflight>) -> Result<IdlePoll, (String, bool)> {
        let cannot = |e: std::io::Error| {
            let denied = e.kind() == std::io::ErrorKind::PermissionDenied;
            (format!("idle CPUs are left to sleep: {QOS_DEVICE}: {e}"), denied)
        };
        drop(Held::take().map_err(cannot)?);
        let mut activity = Activity::new(inflight.total());
        let mut held: Option<Held> = None;
        Ticker::spawn("lanefs-idlepoll", TICK, move || {
            if !activity.hold(inflight.total()) {
                held = None;
            } else if held.is_none() {
                // It opened at the start: a failure now (descriptors run out) only costs the
                // speed-up until the next tick.
                held = Held::take().ok();
            }
        })
        .map(|t| IdlePoll { _thread: t })
        .map_err(|e| (format!("idle CPUs are left to sleep: cannot start a thread: {e}"), false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_hold_until_a_quiet_spell_and_a_quiet_start_holds_nothing() {
        let mut a = Activity::new(5);
        for _ in 0..20 {
            assert!(!a.hold(5), "held with no request since the start");
        }
        assert!(a.hold(6), "a request did not take the hold");
        // Quiet ticks short of the bound keep it.
        for t in 1..Activity::QUIET_TICKS {
            assert!(a.hold(6), "let go after {t} quiet ticks, before {QUIET:?}");
        }
        assert!(!a.hold(6), "still held after {QUIET:?} without a request");
        assert!(!a.hold(6));
        // A request in the middle of a quiet spell starts it again.
        assert!(a.hold(7));
        for _ in 1..Activity::QUIET_TICKS - 1 {
            assert!(a.hold(7));
        }
        assert!(a.hold(8), "a request near the end of a quiet spell was not seen");
        assert_eq!(a.quiet_ticks, 0);
    }

    #[test]
    fn the_quiet_bound_is_whole_ticks() {
        assert_eq!(TICK * Activity::QUIET_TICKS, QUIET);
    }
}
