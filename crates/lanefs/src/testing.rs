//! Engine internals for the integration tests in `crates/lanefs/tests`, and nothing else.
//!
//! Hidden from the documentation and not part of the API: no promise holds for anything here.
//! Those tests check layers the library API cannot reach on its own: they read checkpoint
//! packs and segment tables back from an image, build node trees and NAT tables by hand, and
//! drive the persistent-memory region's journal and crash model directly. A test-support crate
//! (issue 15, step 2) is their later home; until then each module below re-exports one
//! internal module's public items, so that the engine's own modules stay private.

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
