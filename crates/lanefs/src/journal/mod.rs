//! The journal: durability between checkpoints as a logical redo log, one chain per lane.
//!
//! An fsync produces one [`Transaction`] of [`Record`]s ([`record`]); its lane's
//! [`ChainWriter`] splits it over journal blocks ([`chain`]) that the caller writes in one batch
//! with the data blocks it maps, then flushes. Recovery reads each lane's chain from the head its
//! checkpoint recorded ([`read_chain`]), keeps complete transactions only, merges all lanes'
//! records by [`Stamp`] ([`merge_by_stamp`]) and replays those newer than the checkpoint.
//!
//! This module decides nothing about what to log or how to replay; it guarantees that what it
//! reads back is exactly a prefix of what was appended, transaction by transaction, and that a
//! decode of anything on disk validates and never panics.

pub mod chain;
pub mod record;

pub use chain::{merge_by_stamp, read_chain, ChainMarks, ChainPos, ChainRead, ChainWriter};
pub use record::{InodeAttr, Record, Stamp, Transaction, Whiteout, MAX_SYMLINK_LEN, WHITEOUT_TYPE};

#[cfg(test)]
mod chain_tests;
#[cfg(test)]
mod record_tests;
