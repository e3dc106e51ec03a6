//! Synchronisation primitives that keep the common path free of shared cache lines.
//!
//! - `percpu`: which CPU a thread runs on, how many CPUs there can be, and an array with one
//!   cache-line-padded slot per CPU. Everything "per core" in lanefs (lanes, counters, in-flight
//!   registries) is built on it.
//! - `pass_sem`: the reader pass-through semaphore (Max, ATC'21) that every file-system
//!   operation enters in shared mode and a checkpoint takes exclusively.
//! - `rank`: the engine's lock hierarchy, ranked mutexes and reader-writer locks, and the
//!   checker that fails a test build on the first out-of-order acquisition.
//! - `seqlock`: a few words published together, read without writing a shared line (the
//!   attributes stat reports).
//! - `census`: per lock class, how many acquisitions had to wait (per-CPU counters).
//! - `ticket`: a one-shot outcome (was a flush written?) that later flushes wait for.
//! - `commit_queue`: cooperative commit, where the callers waiting for a batch of I/O submit
//!   it themselves, everyone's queued requests at once.
//! - `loom_check` (loom test builds only): the one builder every loom model runs under.

pub(crate) mod census;
pub(crate) mod commit_queue;
#[cfg(all(test, loom))]
pub(crate) mod loom_check;
pub(crate) mod pass_sem;
pub(crate) mod percpu;
pub(crate) mod rank;
pub(crate) mod seqlock;
pub(crate) mod ticket;

// Public: what the FUSE adapter and the bench use (the contention census, and ranked locks for
// the adapter's own state, so that the checker sees them); the rest is the engine's.
pub use census::Census;
pub(crate) use pass_sem::{ExclusiveGuard, PassSem};
pub use percpu::possible_cpus;
pub(crate) use percpu::{current_cpu, PerCpu, PerCpuCounter};
pub use rank::{Condvar, Mutex, Rank, RwLock};
