//! Regular files' ctime under the writeback cache, where the kernel keeps it.
//!
//! With FUSE_WRITEBACK_CACHE the kernel owns a regular file's mtime and ctime while it holds
//! the inode (`fuse_get_cache_mask`): it stamps them itself, ignores the daemon's in every
//! reply, and sends its own back with the SETATTRs of writeback, fsync and close. A change it
//! did not make, a flag set by ioctl (chattr), moves the engine's ctime past the kernel's. Two
//! things follow, each kept here per inode:
//!
//! - **ahead**: the kernel's next stamp for the file is older than the engine's and must not
//!   move it back (`LaneFuse::kernel_ctime`). Cleared by that stamp.
//! - **stale**: the kernel's copy shows the older ctime until it leaves the kernel's cache. The
//!   daemon drops the file's entry at the chattr, so the inode goes once nothing holds it. But
//!   a close hands the inode to an asynchronous RELEASE, which holds it until answered, and a
//!   lookup in between finds it still cached and pins it under a new entry with the old ctime.
//!   So the entry is dropped again after each RELEASE of a stale file: once the kernel has let
//!   go, the next lookup reads the inode afresh. Cleared when the kernel forgets the inode.
//!
//! Invariants: both sets hold regular files only, and `any` is true whenever either set may be
//! non-empty (false only when both were seen empty under the lock), so the request paths that
//! look here cost one load when no chattr is pending.

use super::LaneFuse;
use crate::proto::{INodeNo, Notifier};
use lanefs::sync::{Mutex, Rank};
use lanefs::{FileKind, Timespec};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long an ioctl's handler waits for the drop of the file's cached entry
/// (`LaneFuse::drop_cached_entry`) before it replies anyway.
const ENTRY_DROP_WAIT: Duration = Duration::from_millis(20);

impl LaneFuse {
    /// The ctime to keep when the kernel sends `sent`. Only its writeback cache sends one: the
    /// stamp it keeps for a regular file, flushed at writeback, fsync and close, and the one it
    /// shows. It stands, so that what stat showed before an unmount is what it shows after
    /// (fstests generic/392 and 468: a punched hole's ctime, which the kernel does not stamp,
    /// gives way to it). Except after a change the kernel did not see and must show
    /// (chattr; "ahead" in the module docs): there the kernel's older stamp would move the
    /// ctime back, and the engine's stands.
    pub(super) fn kernel_ctime(&self, ino: u64, sent: Timespec) -> Timespec {
        if !self.kernel_ctime.kernel_sent(ino) {
            return sent;
        }
        match self.fs.getattr(ino) {
            Ok(a) if a.ctime > sent => a.ctime,
            _ => sent,
        }
    }

    /// Drops the kernel's cached attributes of `ino` (not its pages: offset -1, so it takes
    /// no lock of the inode, which the kernel holds while it waits for a FUSE_IOCTL). A flag
    /// change by ioctl changes the ctime, and the kernel refreshes nothing after a FUSE_IOCTL.
    pub(super) fn attributes_changed(&self, ino: u64) {
        let Some(n) = self.notifier.get() else { return };
        let _ = n.inval_inode(INodeNo(ino), -1, 0);
        if self.writeback_cache_on && self.fs.getattr(ino).is_ok_and(|a| a.kind == FileKind::File) {
            self.kernel_ctime.moved_past_kernel(ino);
            self.drop_cached_entry(n, ino, Some(ENTRY_DROP_WAIT));
        }
    }

    /// After a RELEASE of `ino` is answered: if the kernel's copy may still show an older
    /// ctime (a lookup found it held by this release and pinned it again), its entry goes once
    /// more, so that the inode leaves the kernel's cache as soon as nothing holds it. Nothing
    /// waits for the drop: the kernel holds no lock for a RELEASE.
    pub(super) fn released(&self, ino: u64) {
        if !self.kernel_ctime.is_stale(ino) {
            return;
        }
        if let Some(n) = self.notifier.get() {
            self.drop_cached_entry(n, ino, None);
        }
    }

    /// With the writeback cache the kernel keeps a regular file's ctime itself and ignores the
    /// daemon's while it holds the inode (`fuse_get_cache_mask`), so a change it did not make
    /// (flags set by ioctl) would not show until the inode leaves its cache. Dropping the
    /// file's entry makes that happen: the kernel evicts a FUSE inode as soon as nothing holds
    /// it (`generic_delete_inode`), here when the caller closes the file and the kernel has
    /// answered its RELEASE (see `released`), and the next lookup reads it afresh.
    ///
    /// Dropping an entry takes the directory's lock, and the kernel holds the file's own lock
    /// while it waits for a FUSE_IOCTL: a rename or unlink of the file that holds the
    /// directory's lock and waits for the file's would deadlock with a drop sent before the
    /// reply. So a thread of its own sends it, and the handler waits for it at most `wait`:
    /// long enough to order it before the reply whenever the directory is not locked, bounded
    /// so that the reply always goes.
    fn drop_cached_entry(&self, n: &Notifier, ino: u64, wait: Option<Duration>) {
        let Ok(Some((parent, name))) = self.fs.name_of(ino) else { return };
        n.aside(wait, move |n| {
            let _ = n.inval_entry(INodeNo(parent), OsStr::from_bytes(&name));
        });
    }
}

/// The files whose ctime the kernel holds older than the engine's (see the module docs).
pub(super) struct KernelCtime {
    sets: Mutex<Sets>,
    any: AtomicBool,
}

#[derive(Default)]
struct Sets {
    ahead: HashSet<u64>,
    stale: HashSet<u64>,
}

impl Sets {
    fn is_empty(&self) -> bool {
        self.ahead.is_empty() && self.stale.is_empty()
    }
}

impl KernelCtime {
    pub(super) fn new() -> KernelCtime {
        KernelCtime { sets: Mutex::new(Rank::CtimeAhead, Sets::default()), any: AtomicBool::new(false) }
    }

    /// The engine moved `ino`'s ctime past the kernel's (a flag change by ioctl).
    pub(super) fn moved_past_kernel(&self, ino: u64) {
        let mut sets = self.sets.lock();
        sets.ahead.insert(ino);
        sets.stale.insert(ino);
        self.any.store(true, Ordering::Release);
    }

    /// The kernel sent its own ctime for `ino`: whether the engine's was ahead of it (then
    /// the engine's stands, and from now on the kernel's stamps are newer).
    pub(super) fn kernel_sent(&self, ino: u64) -> bool {
        self.take(|s| s.ahead.remove(&ino))
    }

    /// Whether the kernel's copy of `ino` may still show an older ctime.
    pub(super) fn is_stale(&self, ino: u64) -> bool {
        self.any.load(Ordering::Acquire) && self.sets.lock().stale.contains(&ino)
    }

    /// The kernel forgot `ino`: its next copy is read afresh.
    pub(super) fn forgotten(&self, ino: u64) {
        self.take(|s| s.stale.remove(&ino));
    }

    /// Runs `f` on the sets unless both are known empty; keeps `any` true while either holds
    /// something.
    fn take(&self, f: impl FnOnce(&mut Sets) -> bool) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let mut sets = self.sets.lock();
        let was = f(&mut sets);
        if sets.is_empty() {
            self.any.store(false, Ordering::Release);
        }
        debug_assert!(sets.is_empty() || self.any.load(Ordering::Relaxed), "the flag covers what is held");
        was
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_ctime_is_ahead_until_the_kernel_sends_and_stale_until_it_forgets() {
        let k = KernelCtime::new();
        assert!(!k.kernel_sent(7) && !k.is_stale(7));
        k.moved_past_kernel(7);
        assert!(k.is_stale(7) && !k.is_stale(8));
        assert!(k.kernel_sent(7), "the first stamp after the change is older");
        assert!(!k.kernel_sent(7), "later ones are the kernel's own");
        assert!(k.is_stale(7), "the kernel's copy still shows the older ctime");
        k.forgotten(8);
        assert!(k.is_stale(7));
        k.forgotten(7);
        assert!(!k.is_stale(7));
        assert!(!k.any.load(Ordering::Acquire), "both sets empty");
    }

    #[test]
    fn threads_marking_and_clearing_leave_the_flag_true_while_anything_is_held() {
        let k = std::sync::Arc::new(KernelCtime::new());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let k = k.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000u64 {
                        let ino = t * 10_000 + i;
                        k.moved_past_kernel(ino);
                        assert!(k.is_stale(ino));
                        assert!(k.kernel_sent(ino));
                        if i % 2 == 0 {
                            k.forgotten(ino);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let sets = k.sets.lock();
        assert!(sets.ahead.is_empty());
        assert_eq!(sets.stale.len(), 4 * 1_000, "the odd ones were never forgotten");
        assert!(k.any.load(Ordering::Acquire));
    }
}
