//! MEMFS: the in-memory file system that serves every read and namespace change.
//!
//! This part holds the concurrency building blocks of that layer:
//!
//! - [`range_lock`]: the file-level byte-range lock (Lee et al., SYSTOR'19), so that writers to
//!   disjoint ranges of one file proceed in parallel.
//! - [`cells`]: the mnode table sharded into file cells (Max, ATC'21), so that operations on
//!   different inodes touch different locks.

pub mod cells;
pub mod range_lock;

pub use cells::Cells;
pub use range_lock::{LockMode, RangeGuard, RangeLock};
