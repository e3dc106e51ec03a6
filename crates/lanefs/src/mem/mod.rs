//! MEMFS: the in-memory file system that serves every read and namespace change.
//!
//! - [`range_lock`]: the file-level byte-range lock (Lee et al., SYSTOR'19), so that writers to
//!   disjoint ranges of one file proceed in parallel.
//! - [`page_lock`]: page-level entry past the range lock for reads and writes within one page,
//!   so that threads on different pages of one file share no cache line.
//! - [`cells`]: the mnode table sharded into file cells (Max, ATC'21), so that operations on
//!   different inodes touch different locks.
//! - [`dir`]: directories as concurrent hash maps with stable readdir cookies.
//! - [`pages`]: file pages in per-file sparse, sharded maps with copy-on-write snapshots.
//! - [`mnode`]: the in-memory inode; [`cowmap`]: its block mapping, copy-on-write in chunks.
//! - [`reserve`]: preallocated, unwritten blocks and the space they hold.
//! - `memfs`: [`Memfs`], the state all of it shares in a mount.
//! - [`ops`]: the operations themselves.
//! - [`perm`]: privileges a change drops, ACL inheritance and the mode kept in step with ACLs.
//! - [`xattr`]: an inode's extended attributes.
//! - [`atime`]: when reads update access times; [`iflags`]: inode flags (`chattr`).

pub mod atime;
pub mod cells;
pub mod cowmap;
pub mod dir;
pub mod iflags;
mod memfs;
pub mod mnode;
pub mod ops;
pub mod page_lock;
pub mod pages;
pub mod perm;
pub mod range_lock;
pub mod reserve;
pub mod xattr;

pub use cells::Cells;
pub(crate) use memfs::Memfs;
