//! Synchronisation primitives that keep the common path free of shared cache lines.
//!
//! - [`percpu`]: which CPU a thread runs on, how many CPUs there can be, and an array with one
//!   cache-line-padded slot per CPU. Everything "per core" in lanefs (lanes, counters, in-flight
//!   registries) is built on it.
//! - [`pass_sem`]: the reader pass-through semaphore (Max, ATC'21) that every file-system
//!   operation enters in shared mode and a checkpoint takes exclusively.
//! - [`rank`]: the engine's lock hierarchy, ranked mutexes and reader-writer locks, and the
//!   checker that fails a test build on the first out-of-order acquisition.
//! - [`seqlock`]: a few words published together, read without writing a shared line (the
//!   attributes stat reports).
//! - [`census`]: per lock class, how many acquisitions had to wait (per-CPU counters).
//! - [`ticket`]: a one-shot outcome (was a flush written?) that later flushes wait for.

pub mod census;
pub mod pass_sem;
pub mod percpu;
pub mod rank;
pub mod seqlock;
pub mod ticket;

pub use census::Census;
pub use pass_sem::{ExclusiveGuard, PassSem, SharedGuard};
pub use percpu::{current_cpu, possible_cpus, PerCpu, PerCpuCounter};
pub use rank::{Condvar, Mutex, Rank, RwLock};
