//! FUSE adapter for lanefs.
//!
//! [`adapter::LaneFuse`] translates FUSE requests into calls on `lanefs::Fs`; it decides
//! nothing itself. [`mount`] runs it: the exclusive lock on the image, the daemon, the worker
//! threads (one cloned /dev/fuse descriptor each), signals, and the final checkpoint.
//!
//! What the kernel is offered at INIT: FUSE_PARALLEL_DIROPS (lookups and readdirs of one
//! directory run in parallel; the engine's directories are concurrent hash maps), 1 MiB writes
//! (capped by /proc/sys/fs/fuse/max_pages_limit), readdirplus, cached symlinks, attribute and
//! entry TTLs of one second (lanefs is the only writer of its image). Opens with O_DIRECT are
//! answered with FOPEN_DIRECT_IO and FOPEN_PARALLEL_DIRECT_WRITES, so that writers of disjoint
//! ranges of one file meet only in the engine's range lock.
//!
//! The kernel's writeback cache is off unless `-o writeback_cache` asks for it: with it the
//! kernel owns the size and times of files with cached writes and sends them back later, which
//! the engine's attribute handling has not been checked against; fsync stays correct either way
//! (the kernel writes back dirty pages before it sends FSYNC).

pub mod adapter;
pub mod mount;

pub use adapter::LaneFuse;
pub use mount::{mount_command, umount_command, MountArgs};
