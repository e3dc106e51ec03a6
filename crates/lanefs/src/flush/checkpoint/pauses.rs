//! What checkpoints cost the foreground: how long they held it out (`CpPauses`) and the work
//! their exclusive phases did, item by item (`ExclusiveWork`).
//!
//! Invariants: counters only grow (maxima and sums since mount), except the peak a benchmark
//! takes and resets; they are relaxed atomics, read for reports and tests, never for control.

use std::sync::atomic::{AtomicU64, Ordering};

/// Work exclusive phases did since mount, item by item: what tests bound (wall-clock time is
/// the bench's business). Dead inodes, directory records, touched names and mapping entries
/// are not items: they are handed over in whole lists, logs and shards (`swaps`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExclusiveWork {
    /// Exclusive phases (checkpoint snapshots).
    pub phases: u64,
    /// Dirty inodes looked at one by one (captured, or found dead by no one's burial).
    pub inodes: u64,
    /// Lists, log shards and touched-name shards swapped out whole.
    pub swaps: u64,
}

/// How long checkpoints held the foreground out, in microseconds: the exclusive phase (the
/// snapshot, under the pass-through semaphore held exclusively: every operation waits) and the
/// gate's exclusive hold around it (fsync and writeback wait; the write phase no longer holds
/// it). Each is timed from the request for the exclusive hold, so the wait for operations in
/// flight to drain counts, to its release, so the waiters' wake-ups after it do not.
#[derive(Debug, Default)]
pub struct CpPauses {
    exclusive_max: AtomicU64,
    /// The longest exclusive phase since [`CpPauses::take_exclusive_peak`] was last called.
    exclusive_peak: AtomicU64,
    write_max: AtomicU64,
    /// `ExclusiveWork` since mount.
    work_phases: AtomicU64,
    work_inodes: AtomicU64,
    work_swaps: AtomicU64,
}

impl CpPauses {
    pub(super) fn record_work(&self, w: ExclusiveWork) {
        self.work_phases.fetch_add(w.phases, Ordering::Relaxed);
        self.work_inodes.fetch_add(w.inodes, Ordering::Relaxed);
        self.work_swaps.fetch_add(w.swaps, Ordering::Relaxed);
    }

    /// What the exclusive phases did since mount.
    pub fn work(&self) -> ExclusiveWork {
        ExclusiveWork {
            phases: self.work_phases.load(Ordering::Relaxed),
            inodes: self.work_inodes.load(Ordering::Relaxed),
            swaps: self.work_swaps.load(Ordering::Relaxed),
        }
    }

    pub(super) fn exclusive(&self, d: std::time::Duration) {
        let us = micros(d);
        self.exclusive_max.fetch_max(us, Ordering::Relaxed);
        self.exclusive_peak.fetch_max(us, Ordering::Relaxed);
    }

    pub(super) fn write_phase(&self, d: std::time::Duration) {
        self.write_max.fetch_max(micros(d), Ordering::Relaxed);
    }

    /// The longest exclusive phase since mount.
    pub fn exclusive_max_us(&self) -> u64 {
        self.exclusive_max.load(Ordering::Relaxed)
    }

    /// The longest exclusive hold of the gate (fsync and writeback held out) since mount.
    pub fn write_max_us(&self) -> u64 {
        self.write_max.load(Ordering::Relaxed)
    }

    /// The longest exclusive phase since the previous call (or mount), and a fresh start: what a
    /// benchmark run reports for its own span.
    pub fn take_exclusive_peak(&self) -> u64 {
        self.exclusive_peak.swap(0, Ordering::Relaxed)
    }
}

/// `d` in whole microseconds, saturating.
fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
