//! Segments: the validity table (SIT in memory), segment states, and the lanes of active logs.
//!
//! A main-area segment is in one of four states:
//!
//! ```text
//!   Free --(a lane takes it)--> Active(lane, log) --(full)--> Dirty
//!    ^                                                         |
//!    +--(next checkpoint)-- Prefree <--(last valid block gone)-+
//! ```
//!
//! A segment freed by invalidation becomes reusable only after the next checkpoint (prefree),
//! because until then the previous checkpoint may still reference its blocks.
//!
//! Concurrency: each segment's entry has its own small lock, so validity updates from different
//! threads on different segments never meet; each lane owns its six active logs and a cache of
//! free segments, refilled from the global free map in batches, so threads on different cores
//! do not append to the same log or contend on the free map per segment.

mod lanes;
mod table;

pub use lanes::{Lane, LaneSet};
pub use table::{SegState, SegmentTable};

/// Free segments a lane takes from the global map at once.
pub const FREE_BATCH: usize = 4;
