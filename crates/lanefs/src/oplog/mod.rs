//! Operation logs: per-core, per-mnode logs of directory operations (ScaleFS, SOSP'17).
//!
//! Every namespace change is applied to MEMFS at once and recorded here, stamped at its
//! linearization point; `flush` later merges the logs by timestamp. This part holds the time base
//! for those stamps:
//!
//! - [`clock`]: [`Timestamp`] (a synchronized TSC or CLOCK_MONOTONIC, ties broken by CPU id) and
//!   [`InFlight`], the registry of operations that have a timestamp but whose log record is not
//!   appended yet, which a merge waits on.

pub mod clock;

pub use clock::{ClockSource, InFlight, InFlightOp, Timestamp};
