//! `lanefs bench`: the measuring harness of lanefs.
//!
//! ARCHITECTURE.md ("Measuring") makes every performance claim a figure from this harness, measured
//! side by side with reference file systems in one run and reported as a ratio. The pieces:
//!
//! - [`target`]: the [`Target`] trait, a POSIX-shaped file interface (open, read_at, write_at,
//!   fsync, mkdir, readdir, rename, unlink, stat). `dir:PATH` measures any directory through the
//!   kernel; [`target::library`] (`lib:IMAGE`) is lanefs through its library API in process, and
//!   [`target::mount`] (`mount:IMAGE`) lanefs mounted through FUSE by the harness for the run.
//! - [`workload`]: FxMark's micro-benchmarks (DWOL ... MWRM) and the filebench personalities
//!   varmail, fileserver and oltp, written once against [`Target`].
//! - [`runner`]: one run (warm-up, timed phase, per-op latency into [`hist::Histogram`]s,
//!   cleanup of its own files).
//! - [`session`]: many runs interleaved across targets; the compare and ratio tables.
//! - [`compare`]: sets up and removes the references (ext4/xfs/btrfs on loop devices over
//!   /dev/shm, tmpfs, bindfs over tmpfs).
//! - [`fill`]: `--fill F`, filler files that take a target to a utilisation before the runs.
//! - [`report`], [`plot`]: JSON lines, markdown, PNG.
//! - [`device_bench`]: the device layer's batched writes against one pwrite per block
//!   (`lanefs devbench`).
//! - [`cli`]: the `lanefs bench` arguments and command.

// An application of the engine: its items are documented where they need it, not as an API
// (the workspace denies missing_docs for the engine's sake).
#![allow(missing_docs)]

pub mod cli;
pub mod compare;
pub mod device_bench;
pub mod fill;
pub mod hist;
pub mod plot;
pub mod progress;
pub mod report;
pub mod runner;
pub mod session;
pub mod target;
pub mod workload;

pub use cli::{run, BenchArgs};
pub use hist::Histogram;
pub use runner::{run_one, RunConfig, RunResult};
pub use target::{
    open_target, open_target_with, File, IoCounters, OpenOptions, Stat, Target, TargetOptions, TargetSpec,
};
pub use workload::Workload;
