//! Operation logs: per-core, per-mnode logs of directory operations (ScaleFS, SOSP'17).
//!
//! Every namespace change is applied to MEMFS at once and recorded here, stamped at its
//! linearization point; `flush` later merges the logs by timestamp.
//!
//! - [`clock`]: [`Timestamp`] (a synchronized TSC or CLOCK_MONOTONIC, ties broken by CPU id) and
//!   [`InFlight`], the registry of operations that have a timestamp but whose log record is not
//!   appended yet, which a merge waits on.
//! - [`dirlog`]: the per-core logs of one directory.

pub mod clock;
pub mod dirlog;

pub use clock::{InFlight, Timestamp};
