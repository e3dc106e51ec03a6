//! Access times: when a read or a directory listing updates an inode's atime, and when that
//! update reaches the disk.
//!
//! The kernel keeps no atime for a FUSE file system (its inodes are S_NOATIME), so the engine
//! applies the mount's policy itself, as the VFS does for a kernel file system
//! (`atime_needs_update`): `relatime` (the default) updates when the atime is not after the
//! mtime or the ctime, or is a day old; `strictatime` on every access; `noatime` never;
//! `nodiratime` never for directories. An inode with the NOATIME flag is never updated, nor is
//! anything on a read-only or stopped file system.
//!
//! The common case costs no write to a shared cache line: the decision reads the inode's atime,
//! mtime and ctime (atomics) and the clock, and stores only when the atime changes, then marks
//! the inode dirty once. No lock is taken that a writer holds: the update is a store.
//!
//! Durability follows ext4: an atime update is an inode change like any other (the next
//! checkpoint writes it, and an fsync journals it), except that fdatasync does not force it.
//! With `lazytime` the update stays in memory: it reaches the disk with the inode's next other
//! change, an fsync, a `sync` or the unmount, or after [`LAZY_EXPIRY`]. A crash loses it, which
//! is what lazytime accepts.

use super::mnode::MNode;
use crate::engine::Engine;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// When reads update the access time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimeMode {
    /// `noatime`: never.
    Never,
    /// `relatime`: when the atime is not after the mtime or ctime, or is a day (`RELATIME_AGE`) old.
    #[default]
    Relative,
    /// `strictatime`: on every access.
    Always,
}

/// A mount's access-time options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtimePolicy {
    /// When a read updates the access time.
    pub mode: AtimeMode,
    /// Directory listings update directories' atime (false: `nodiratime`).
    pub dirs: bool,
    /// `lazytime`: updates stay in memory until something else writes the inode.
    pub lazy: bool,
}

impl Default for AtimePolicy {
    /// `relatime`, as the kernel mounts by default.
    fn default() -> Self {
        AtimePolicy { mode: AtimeMode::Relative, dirs: true, lazy: false }
    }
}

impl AtimePolicy {
    /// One byte, for an atomic (the policy can change on a remount).
    pub(crate) fn encode(self) -> u8 {
        let mode = match self.mode {
            AtimeMode::Never => 0,
            AtimeMode::Relative => 1,
            AtimeMode::Always => 2,
        };
        mode | (u8::from(self.dirs) << 2) | (u8::from(self.lazy) << 3)
    }

    pub(crate) fn decode(b: u8) -> AtimePolicy {
        let mode = match b & 3 {
            0 => AtimeMode::Never,
            2 => AtimeMode::Always,
            _ => AtimeMode::Relative,
        };
        AtimePolicy { mode, dirs: b & 4 != 0, lazy: b & 8 != 0 }
    }
}

/// relatime updates an atime at least this often (the kernel's rule: one day).
pub const RELATIME_AGE: i64 = 24 * 60 * 60 * 1_000_000_000;

/// lazytime writes an atime out after this long at the latest (seconds).
pub const LAZY_EXPIRY: u64 = 24 * 60 * 60;

/// Whether an access at `now` updates an atime of `atime`, all in nanoseconds.
pub fn due(mode: AtimeMode, atime: i64, mtime: i64, ctime: i64, now: i64) -> bool {
    if atime == now {
        return false;
    }
    match mode {
        AtimeMode::Never => false,
        AtimeMode::Always => true,
        AtimeMode::Relative => atime <= mtime || atime <= ctime || now.saturating_sub(atime) >= RELATIME_AGE,
    }
}

impl Engine {
    /// An access of `m` (a read or a listing): updates its atime if the policy says so. The
    /// caller holds the pass-through semaphore, so no checkpoint snapshot sees half of it.
    pub(crate) fn touch_atime(&self, m: &Arc<MNode>) {
        let p = self.mem.atime_policy();
        if p.mode == AtimeMode::Never || (!p.dirs && m.is_dir()) {
            return;
        }
        if m.flags.load(Ordering::Relaxed) & super::iflags::InodeFlags::NOATIME.0 != 0 {
            return;
        }
        let now = super::mnode::ts_to_ns(crate::engine::now());
        let atime = m.atime.load(Ordering::Relaxed);
        let (mtime, ctime) = (m.mtime.load(Ordering::Relaxed), m.ctime.load(Ordering::Relaxed));
        if !due(p.mode, atime, mtime, ctime, now) {
            return;
        }
        if self.opts.read_only || self.ckpt.failed.load(Ordering::Relaxed) {
            return;
        }
        m.atime.store(now, Ordering::Relaxed);
        let first = !m.atime_dirty.swap(true, Ordering::AcqRel);
        if !p.lazy {
            self.mem.mark_dirty(m);
        } else if first {
            self.queue_lazy(m);
        }
    }

    /// Remembers `m` for the checkpoint that writes lazy atimes out.
    fn queue_lazy(&self, m: &MNode) {
        if m.lazy_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let since = self.disk.elapsed_secs().max(1);
        let _ = self.mem.lazy_since.compare_exchange(0, since, Ordering::AcqRel, Ordering::Relaxed);
        self.mem.lazy.current().lock().push(m.ino);
    }

    /// For a checkpoint snapshot: the inodes whose lazy atimes it must write (all of them on
    /// `sync` and unmount, or once the oldest is [`LAZY_EXPIRY`] old), taken off the queue.
    pub(crate) fn take_lazy(&self, all: bool) -> Vec<u32> {
        let since = self.mem.lazy_since.load(Ordering::Acquire);
        let expired = since != 0 && self.disk.elapsed_secs().saturating_sub(since) >= LAZY_EXPIRY;
        if !(all || expired) || since == 0 {
            return Vec::new();
        }
        self.mem.lazy_since.store(0, Ordering::Release);
        let mut out = Vec::new();
        for q in self.mem.lazy.iter() {
            out.append(&mut q.lock());
        }
        for &ino in &out {
            if let Some(m) = self.mem.cells.get(ino as u64) {
                m.lazy_queued.store(false, Ordering::Release);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relatime_updates_after_a_change_or_a_day_and_never_twice_in_a_tick() {
        let s = 1_000_000_000i64;
        let r = AtimeMode::Relative;
        assert!(due(r, 10 * s, 10 * s, 5 * s, 20 * s), "atime not after mtime");
        assert!(due(r, 10 * s, 5 * s, 11 * s, 20 * s), "atime before ctime");
        assert!(!due(r, 10 * s, 5 * s, 5 * s, 20 * s), "read since the last change");
        assert!(due(r, 10 * s, 5 * s, 5 * s, 10 * s + RELATIME_AGE), "a day old");
        assert!(!due(AtimeMode::Always, 20 * s, 0, 0, 20 * s), "same tick");
        assert!(due(AtimeMode::Always, 19 * s, 0, 0, 20 * s));
        assert!(!due(AtimeMode::Never, 0, 10 * s, 10 * s, 20 * s));
    }

    #[test]
    fn policies_survive_their_byte() {
        for mode in [AtimeMode::Never, AtimeMode::Relative, AtimeMode::Always] {
            for dirs in [false, true] {
                for lazy in [false, true] {
                    let p = AtimePolicy { mode, dirs, lazy };
                    assert_eq!(AtimePolicy::decode(p.encode()), p);
                }
            }
        }
    }
}
