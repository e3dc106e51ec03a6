//! FUSE adapter for lanefs.
//!
//! [`adapter::LaneFuse`] translates FUSE requests into calls on `lanefs::Fs`; it decides
//! nothing itself. [`proto`] is the FUSE protocol (lanefs's own: decoding, replies, the mount,
//! and the two transports, FUSE over io_uring where the kernel offers it and /dev/fuse). [`mount`]
//! runs it: the exclusive lock on the image, the daemon, the worker threads, signals, and the
//! final checkpoint.
//!
//! What the kernel is offered at INIT: FUSE_PARALLEL_DIROPS (lookups and readdirs of one
//! directory run in parallel; the engine's directories are concurrent hash maps), 1 MiB writes
//! (capped by /proc/sys/fs/fuse/max_pages_limit), readdirplus, cached symlinks, attribute and
//! entry TTLs of an hour and negative entries as long (lanefs is the only writer of its image;
//! see `adapter::Ttl` for what keeps the kernel's caches right; `-o cache_timeout=S` and
//! `-o negative_timeout=S` change them). Opens with O_DIRECT are
//! answered with FOPEN_DIRECT_IO and FOPEN_PARALLEL_DIRECT_WRITES, so that writers of disjoint
//! ranges of one file meet only in the engine's range lock (under the writeback cache, where
//! the kernel agrees to DIRECT_IO_ALLOW_MMAP: its direct path then writes the cached range back
//! first).
//!
//! open(2) with O_TMPFILE comes as FUSE_TMPFILE (protocol 7.34 on; nothing at INIT turns it
//! on or off) and is answered as a create, for a file with no name (`Fs::tmpfile_open`);
//! linkat(2) names it with a LINK. The kernel refuses that link itself for O_EXCL.
//!
//! Every close skips the FLUSH round trip (FOPEN_NOFLUSH: writes reach the engine as they are
//! made). FUSE_HANDLE_KILLPRIV_V2 makes the server drop set-ID bits on a write, truncate,
//! fallocate or chown (the engine applies the kernel's rule for the request's process), and lets
//! the kernel mark inodes S_NOSEC: the GETXATTR("security.capability") it sent before every
//! buffered write now comes once per attribute refresh (2 for 2200 WRITEs of dd and appends,
//! counted with strace on the daemon). FUSE_POSIX_ACL
//! (on with `default_permissions`, the default) has the kernel enforce POSIX ACLs; the engine
//! inherits default ACLs (FUSE_DONT_MASK: the umask comes with the request) and keeps the mode
//! in step with them.
//!
//! The kernel's writeback cache is on unless `-o writeback_cache=off` (or `nowriteback_cache`)
//! turns it off. With it a buffered write is a copy into the kernel's page cache and no request
//! (DWOL 13-19x faster over io_uring, docs/benchmarks.md); dirty pages come as WRITEs of up to
//! `max_write` bytes at writeback, fsync and close
//! (the kernel then sends FLUSH on every close, which the adapter answers ENOSYS once so that it
//! stops; the close still waits for the file's dirty pages to be written back). fsync is correct
//! with it: the kernel writes the dirty pages back, then the times (SETATTR), then sends FSYNC.
//! What it changes, and how the adapter keeps each right:
//! - The kernel owns a regular file's size, mtime and ctime while it holds the inode and
//!   ignores the server's (fuse_get_cache_mask). It stamps the times at write(2), direct I/O
//!   included, and sends them in SETATTR at writeback, fsync and close, so every WRITE goes to
//!   `Fs::write_keep_times`, which leaves them alone: stamping the time a WRITE arrives would
//!   change them across a remount (the SIGKILL test saw it).
//! - A ctime the kernel flushes never takes back a later one the engine set on a change the
//!   kernel did not see (`LaneFuse::kernel_ctime`). After a flag change by ioctl (chattr) the
//!   adapter drops the file's cached entry, so the kernel reads the inode afresh once it has
//!   let go of the file (fstests generic/277). A close's RELEASE is asynchronous and holds
//!   the inode, so a stat in between can pin the kernel's copy again: the entry is dropped
//!   once more after each RELEASE of such a file (`adapter/ctime.rs`).
//! - A touch (utime with NULL) comes with its mtime as an explicit time, which append-only
//!   would refuse; the adapter tells it by the atime's FATTR_ATIME_NOW carrying the same
//!   reading of the clock (`LaneFuse::times_now`; generic/079).
//! - Written-back pages start at a page boundary, so an append to an append-only file arrives
//!   with the bytes before it; the engine takes them if they repeat what the file holds.
//! - Set-ID bits: with KILLPRIV_V2 the kernel writes through (uncached, with
//!   FUSE_WRITE_KILL_SUIDGID) any write that must drop them.
//! - ENOSPC and EIO come from fsync or close, not from write(2), as on NFS.
//! - The kernel sends LSEEK (SEEK_DATA, SEEK_HOLE) without writing its dirty pages back, so the
//!   engine could call a hole what the cache holds: the handler has the kernel write them back
//!   from the offset on first (`proto::Notifier::write_back`). It waits for WRITEs that need a
//!   free worker of its own queue; `proto::spares` keeps one (a spare worker started when the
//!   wait would take the last), so that no queue hangs. Where it cannot, LSEEK answers ENOSYS
//!   and the kernel treats every byte up to its size as data (correct, without holes).
//! - A rename or unlink of a regular file sends SETATTR (the ctime the kernel gave it), the
//!   first stat after a close a GETATTR (st_blocks).
//!
//! On 6.18 every pjdfstest case and every fstests case of the CI selection that passes with the
//! cache off passes with it on.
//!
//! ioctls (see `adapter::ioctl`): the shutdown (XFS_IOC_GOINGDOWN, which is also ext4's
//! EXT4_IOC_SHUTDOWN; its flags are read from the caller, see `caller`), FITRIM, and
//! FS_IOC_GETFSLABEL / FS_IOC_SETFSLABEL. The kernel sends ioctls on directories too
//! (FUSE_IOCTL_DIR, protocol 7.18 and later), so they work on the mount point.
//!
//! The kernel keeps no access times and sees no inode flags for a FUSE file system: the engine
//! updates atime on READ, READDIR and READLINK by the mount's atime options (`lanefs::AtimePolicy`),
//! and `chattr`/`lsattr` reach it as FUSE_IOCTL (FS_IOC_GETFLAGS/SETFLAGS, FSGETXATTR/FSSETXATTR,
//! sent by the kernel's `fileattr_get/set`), the engine enforcing immutable and append-only.
//!
//! [`inflight`] keeps the request each worker is serving, so that one stuck for longer than
//! `stuck_request_secs` is logged (stderr in the foreground, syslog for the daemon), and counts
//! every request by opcode; [`stats`] publishes the counts as the `lanefs.requests` xattr of
//! the mount's root (`lanefs inspect MNT` prints them).

// `unsafe` lives in `syslog`, `proto::dev` (the clone ioctl) and `proto::uring` (ring entries)
// only, each allowing it for itself, where each block says why it is sound.
#![deny(unsafe_code)]
// The adapter is an application of the engine: its items are documented where they need it,
// not as an API (the workspace denies missing_docs for the engine's sake).
#![allow(missing_docs)]

pub mod adapter;
mod caller;
pub mod inflight;
pub mod mount;
pub mod proto;
pub mod stats;
mod syslog;

pub use adapter::LaneFuse;
pub use mount::{mount_command, umount_command, MountArgs};
