//! An mnode's attributes that change rarely ([`Meta`]), behind one short lock.
//!
//! Stat reads take no lock: every guard that changed the attributes republishes them, whole,
//! to a seqlock mirror when it drops, so a reader sees each change entire and in order. A flag
//! beside it says whether the inode has any xattr, kept true to the set by the same drop.

use crate::format::node::Timespec;
use crate::mem::xattr::XattrState;
use crate::sync::rank::{Mutex, MutexGuard, Rank};
use crate::sync::seqlock::SeqWords;
use std::sync::atomic::{AtomicBool, Ordering};

/// Attributes that change rarely, behind one short lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub crtime: Timespec,
    pub rdev: u64,
    pub generation: u32,
    pub xattrs: XattrState,
    /// A symlink's target.
    pub symlink: Vec<u8>,
}

/// The attributes stat(2) reports from [`Meta`], as a reader gets them without the mutex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatMeta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub generation: u32,
    pub crtime: Timespec,
    pub rdev: u64,
}

impl StatMeta {
    fn of(m: &Meta) -> StatMeta {
        StatMeta {
            mode: m.mode,
            uid: m.uid,
            gid: m.gid,
            nlink: m.nlink,
            generation: m.generation,
            crtime: m.crtime,
            rdev: m.rdev,
        }
    }

    fn encode(&self) -> [u64; 5] {
        let pair = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
        [
            pair(self.mode, self.uid),
            pair(self.gid, self.nlink),
            pair(self.generation, self.crtime.nsec),
            self.crtime.sec as u64,
            self.rdev,
        ]
    }

    fn decode(w: [u64; 5]) -> StatMeta {
        let (lo, hi) = (|x: u64| x as u32, |x: u64| (x >> 32) as u32);
        StatMeta {
            mode: lo(w[0]),
            uid: hi(w[0]),
            gid: lo(w[1]),
            nlink: hi(w[1]),
            generation: lo(w[2]),
            crtime: Timespec { sec: w[3] as i64, nsec: hi(w[2]) },
            rdev: w[4],
        }
    }
}

/// An inode's [`Meta`] behind its mutex, with the fields stat reports mirrored in a sequence
/// lock (`sync::seqlock`): [`MetaLock::stat`] reads them without writing a shared line, so
/// threads that stat or walk through one directory do not bounce its lock between cores.
///
/// Invariant: whenever the mutex is free, the mirror equals `StatMeta::of(&meta)` and
/// `has_xattrs` says whether `meta.xattrs.set` is non-empty. A guard that was dereferenced
/// mutably publishes both as it drops, still holding the mutex (so publications are serialised
/// and in the order of the changes).
pub struct MetaLock {
    inner: Mutex<Meta>,
    mirror: SeqWords<5>,
    /// Whether `meta.xattrs.set` holds any attribute, published like the mirror: a create
    /// asks it of the directory (a default ACL to inherit?) without taking the directory's
    /// mutex, which every create in a shared directory would otherwise bounce between cores.
    has_xattrs: AtomicBool,
}

/// A held [`MetaLock`].
pub struct MetaGuard<'a> {
    guard: MutexGuard<'a, Meta>,
    mirror: &'a SeqWords<5>,
    has_xattrs: &'a AtomicBool,
    changed: bool,
}

impl MetaLock {
    pub fn new(meta: Meta) -> MetaLock {
        let mirror = SeqWords::new(StatMeta::of(&meta).encode());
        let has_xattrs = AtomicBool::new(!meta.xattrs.set.is_empty());
        MetaLock { inner: Mutex::new(Rank::Meta, meta), mirror, has_xattrs }
    }

    /// Whether the inode has any extended attribute, as of the last change: lock-free and
    /// storing nothing. A change published before this read began is seen.
    #[inline]
    pub fn has_xattrs(&self) -> bool {
        self.has_xattrs.load(Ordering::Acquire)
    }

    pub fn lock(&self) -> MetaGuard<'_> {
        MetaGuard {
            guard: self.inner.lock(),
            mirror: &self.mirror,
            has_xattrs: &self.has_xattrs,
            changed: false,
        }
    }

    /// What stat reports, as of the last change: lock-free unless a change keeps overlapping
    /// the read, then under the mutex.
    #[inline]
    pub fn stat(&self) -> StatMeta {
        match self.mirror.read() {
            Some(w) => StatMeta::decode(w),
            None => StatMeta::of(&self.inner.lock()),
        }
    }
}

impl std::ops::Deref for MetaGuard<'_> {
    type Target = Meta;
    fn deref(&self) -> &Meta {
        &self.guard
    }
}

impl std::ops::DerefMut for MetaGuard<'_> {
    fn deref_mut(&mut self) -> &mut Meta {
        self.changed = true;
        &mut self.guard
    }
}

impl Drop for MetaGuard<'_> {
    fn drop(&mut self) {
        if self.changed {
            self.mirror.write(StatMeta::of(&self.guard).encode());
            let any = !self.guard.xattrs.set.is_empty();
            if self.has_xattrs.load(Ordering::Relaxed) != any {
                self.has_xattrs.store(any, Ordering::Release);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::mnode::{S_IFDIR, S_IFREG};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn has_xattrs_follows_every_change_of_the_set() {
        let meta = |x: bool| {
            let mut set = crate::mem::xattr::XattrSet::default();
            if x {
                set.set(b"user.a", b"1".to_vec());
            }
            Meta {
                mode: S_IFDIR | 0o755,
                uid: 0,
                gid: 0,
                nlink: 2,
                crtime: Timespec { sec: 0, nsec: 0 },
                rdev: 0,
                generation: 0,
                xattrs: XattrState { set: Arc::new(set), ..Default::default() },
                symlink: Vec::new(),
            }
        };
        assert!(MetaLock::new(meta(true)).has_xattrs());
        let l = MetaLock::new(meta(false));
        assert!(!l.has_xattrs());
        Arc::make_mut(&mut l.lock().xattrs.set).set(b"system.posix_acl_default", b"acl".to_vec());
        assert!(l.has_xattrs());
        // A change of something else keeps it.
        l.lock().nlink = 3;
        assert!(l.has_xattrs());
        Arc::make_mut(&mut l.lock().xattrs.set).remove(b"system.posix_acl_default");
        assert!(!l.has_xattrs());
    }

    fn meta(mode: u32, uid: u32) -> Meta {
        Meta {
            mode,
            uid,
            gid: uid,
            nlink: 1,
            crtime: Timespec { sec: 1, nsec: 2 },
            rdev: 0,
            generation: 7,
            xattrs: XattrState::default(),
            symlink: Vec::new(),
        }
    }

    /// Writers change mode, uid, gid and nlink together under the mutex (each to a value
    /// derived from one counter); stat readers on other threads, lock-free, must only ever see
    /// the four from one change, never going back, and the last change at the end.
    #[test]
    fn stat_readers_see_each_change_whole_and_in_order() {
        const WRITES: u32 = 20_000;
        let m = MetaLock::new(meta(S_IFREG, 0));
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..3)
                .map(|_| {
                    let (m, stop) = (&m, &stop);
                    s.spawn(move || {
                        let mut last = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let st = m.stat();
                            let k = st.uid;
                            assert_eq!(st.mode, S_IFREG | (k & 0o7777), "mode of another change");
                            assert_eq!((st.gid, st.nlink), (k, k + 1), "torn stat {st:?}");
                            assert_eq!((st.generation, st.crtime), (7, Timespec { sec: 1, nsec: 2 }));
                            assert!(k >= last, "went back from {last} to {k}");
                            last = k;
                        }
                    })
                })
                .collect();
            let writers: Vec<_> = (0..2)
                .map(|_| {
                    let m = &m;
                    s.spawn(move || {
                        for _ in 0..WRITES {
                            let mut g = m.lock();
                            let k = g.uid + 1;
                            g.mode = S_IFREG | (k & 0o7777);
                            g.uid = k;
                            g.gid = k;
                            g.nlink = k + 1;
                        }
                    })
                })
                .collect();
            writers.into_iter().for_each(|w| w.join().unwrap());
            stop.store(true, Ordering::Relaxed);
            readers.into_iter().for_each(|r| r.join().unwrap());
        });
        let st = m.stat();
        assert_eq!((st.uid, st.nlink), (2 * WRITES, 2 * WRITES + 1));
        assert_eq!(st, StatMeta::of(&m.lock()));
    }
}
