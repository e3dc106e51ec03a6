//! Engine internals for the integration tests in `crates/lanefs/tests` and for the crash
//! harness (the `lanefs-crashtest` crate), and nothing else.
//!
//! Hidden from the documentation and not part of the API: no promise holds for anything here.
//! Those tests check layers the library API cannot reach on its own: they read checkpoint
//! packs and segment tables back from an image, build node trees and NAT tables by hand, and
//! drive the persistent-memory region's journal and crash model directly. Each module below
//! re-exports one internal module's public items, or the few of them named, so that the
//! engine's own modules stay private.
//!
//! What the crash harness takes from here, and why the library API is not enough:
//! - [`device::check_writes`]: its recording device rejects exactly the batches the engine's
//!   devices reject, before anything is logged;
//! - [`checkpoint`]: the corruption sweep reads the superblock, checkpoint pack and NAT of a
//!   reference image to find the block of each kind it damages;
//! - [`journal::Transaction`]: the sweep feeds mutated journal payloads to the decoder;
//! - [`pmem`]: the region's crash model (`PmemCrash`, `RegionTrace`, `RegionEvent`,
//!   `crash::PendingWords`) and its geometry (`HEADER_BYTES`, `LINE`, `MIN_REGION_SIZE`),
//!   from which `crashtest --nvm` builds a crash state's region image.

/// Checkpoint packs, superblocks, SIT and summary blocks read from and committed to an image.
pub mod checkpoint {
    pub use crate::checkpoint::*;
}
/// The node-id -> block table.
pub mod nat {
    pub use crate::nat::*;
}
/// An inode's node tree: read, written and dropped.
pub mod node {
    pub use crate::node::*;
}
/// Segments, the segment table and the lanes of logs.
pub mod seg {
    pub use crate::seg::*;
}
/// Batch validation, for block devices written outside the engine.
pub mod device {
    pub use crate::device::plan::check_writes;
}
/// Journal transactions, as a lane's chain and the region encode them.
pub mod journal {
    pub use crate::journal::Transaction;
}
/// The persistent-memory region: its journal, NAT and crash model.
pub mod pmem {
    pub use crate::pmem::*;
}
/// Inode generation numbers.
pub mod generation {
    pub use crate::generation::*;
}
/// POSIX ACLs in their xattr encoding.
pub mod acl {
    pub use crate::acl::*;
}
