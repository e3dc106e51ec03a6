//! The on-disk format: an explicit little-endian byte layout for every structure.
//!
//! One file per structure. Every metadata block carries a magic and a crc32c; every `decode`
//! validates magic, checksum and bounds (against the image geometry where it applies) and
//! returns a typed [`crate::Error::Corrupt`] naming the structure and block, never panicking
//! and never allocating more than the block it was given implies.

pub mod checkpoint;
pub mod codec;
pub mod dentry;
pub mod journal;
pub mod layout;
pub mod nat;
pub mod node;
pub mod sit;
pub mod ssa;
pub mod superblock;
pub mod tree;
pub mod xattr;

pub use checkpoint::{Checkpoint, CopyMap, LaneCheckpoint, LogCursor};
pub use dentry::{Dentry, DentryBlock};
pub use journal::JournalBlock;
pub use layout::{Geometry, LogType, SegNo, BLOCKS_PER_SEG, BLOCK_SIZE, ROOT_INO};
pub use nat::{NatBlock, NatEntry};
pub use node::{Inode, Node, NodeBody, NodeFooter, Timespec};
pub use sit::{SitBlock, SitEntry};
pub use ssa::{SegmentSummary, SummaryEntry, SummaryKind};
pub use superblock::Superblock;
pub use xattr::XattrNode;

#[cfg(test)]
mod tests;
