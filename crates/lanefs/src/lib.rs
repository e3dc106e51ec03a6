//! lanefs: a log-structured file system for flash that scales with cores.
//!
//! A mounted file system is an [`Fs`]: POSIX-shaped calls on inode numbers ([`ROOT`] is the
//! root directory), returning [`Attr`], [`DirEntry`] and friends, with errors that carry an
//! errno ([`Error::to_errno`]). [`Fs::open_file`] gives a [`Handle`] for repeated I/O on one
//! file. The design, the durability contract and the lock hierarchy are in
//! `docs/ARCHITECTURE.md` in the repository.
//!
//! ```
//! use lanefs::{Fs, FsOptions, MemDevice, MkfsOptions, ROOT};
//! use std::sync::Arc;
//!
//! let dev = Arc::new(MemDevice::new(64 << 20));
//! Fs::format(&*dev, &MkfsOptions::default())?;
//! let fs = Fs::open(dev, FsOptions::default())?;
//! let f = fs.create(ROOT, b"log", 0o644, 0, 0)?;
//! fs.write_at(f.ino, 0, b"hello")?;
//! fs.fsync(f.ino, false)?; // durable: data, size and name
//! fs.unmount()?;
//! # Ok::<(), lanefs::Error>(())
//! ```
//!
//! # What is public
//!
//! - At the root: the library API ([`Fs`], [`Handle`], their options, attribute and flag
//!   types), the device trait and its common implementations, and the tools' entry points:
//!   [`format_device`] (mkfs), [`fsck()`], [`inspect()`] and [`inspect_region`].
//! - [`device`]: block devices (an image file or block device, memory) and the event clock the
//!   crash recorders share.
//! - [`format`](mod@format): the codec of every on-disk structure, which `lanefs inspect` and
//!   fsck show.
//! - [`sync`]: the contention census and the ranked locks, for the FUSE adapter's own state.
//! - [`rng`]: the one pseudo-random generator of the harnesses and the bench.
//!
//! Everything else is private. (A hidden `testing` module re-exports a few internals for the
//! integration tests and the crash harness, the `lanefs-crashtest` crate, only; it is not part
//! of the API.)
//!
//! # Module map
//!
//! The crate is layered bottom-up; a module calls only the layers below it
//! (`tests/layers.rs` checks it). From the bottom:
//!
//! - `device`: block I/O on an image file or block device (io_uring or vectored sync I/O);
//!   `pmem`: the persistent-memory region (`--nvm`).
//! - `format`: the codec of every on-disk structure; `error`: the one error type.
//! - `checkpoint` and `recovery`: reading and committing consistent points, and mount.
//! - DISKFS: `seg` (segments and lanes of logs), `nat` (node id -> block), `node` (an inode's
//!   node tree), `diskdir` (a directory's dentry blocks), `gc` (cleaning).
//! - `journal`: the redo log between checkpoints, one chain per lane.
//! - `disk`: a mount's DISKFS state (`Disk`: device, NAT, segments, lanes, journal chains).
//! - `flush`: fsync, writeback and taking checkpoints (the `Checkpointer`'s state in
//!   `flush::checkpoint`); `oplog`: per-core directory logs.
//! - `mem`: MEMFS (`Memfs`), where every read and change happens; with `perm`, `acl` and
//!   `generation` for the rules it applies; `sync`: its primitives and the lock hierarchy.
//! - `engine`: a mounted file system, the composition of the layers' parts (`Disk`, `Memfs`,
//!   `Checkpointer`), and the operations that join them.
//! - `fs`, `fsctl` and `fs_seek`: the library API. `mkfs`, `fsck`, `inspect`: the tools.
//!
//! The crash-consistency harness behind `lanefs crashtest` is a crate of its own,
//! `lanefs-crashtest`; the engine keeps only the hooks it records through (the region's
//! recorder, `pmem/crash.rs`, and the [`device::EventClock`] it shares).

#![deny(missing_docs)]
// The engine is where unsafe lives (io_uring submissions, O_DIRECT buffers, the mapped
// persistent-memory region, per-CPU slots): the workspace denies it, the engine allows it, and
// every block says why it is sound (`clippy::undocumented_unsafe_blocks` is denied).
#![allow(unsafe_code)]

mod acl;
mod checkpoint;
pub mod device;
mod disk;
mod diskdir;
mod engine;
mod error;
mod flush;
pub mod format;
mod fs;
mod fs_seek;
mod fsck;
mod fsctl;
mod gc;
mod generation;
mod inspect;
mod journal;
mod mem;
mod mkfs;
mod nat;
mod node;
mod oplog;
mod perm;
mod pmem;
mod recovery;
pub mod rng;
mod seg;
pub mod sync;
// Engine internals for the integration tests only (see its module doc); not API.
#[doc(hidden)]
pub mod testing;

// The README's Rust examples, compiled and run with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

pub use device::{create_image, BlockDevice, DeviceOptions, FileDevice, IoChoice, IoMode, MemDevice};
pub use error::{Error, RegionFault, Result, Structure};
pub use flush::checkpoint::ExclusiveWork;
pub use format::node::Timespec;
pub use fs::{
    AtimeMode, AtimePolicy, Attr, Caller, DirEntry, FallocMode, FileKind, Fs, FsOptions, Handle, Ino,
    InodeFlags, IoStats, Listing, MkfsOptions, New, Privileged, RecoveryReport, RenameFlags, SetAttr, StatFs,
    TrimRange, XattrFlags, ROOT,
};
pub use fs_seek::Seek;
pub use fsck::{
    check as fsck, check_with_progress as fsck_with_progress, FsckOptions, FsckReport, FsckStats, Problem,
};
pub use inspect::{inspect, inspect_region, BlockKinds, ImageInfo, RegionInfo, SegmentUsage};
pub use mkfs::{detect_existing, format_device};
pub use pmem::bench::persist_bench;
pub use pmem::nat::NvmNat;
pub use pmem::RegionOptions;
