//! In-memory directories: a concurrent hash map from name to entry, with stable readdir cookies.
//!
//! The map is split into shards chosen by a hash of the name; an operation on one name locks
//! only its shard, so creates of different names in one directory proceed in parallel.
//!
//! Lookups take no lock: names live in one concurrent map per directory (papaya, read under a
//! thread-local epoch pin), which writers change while they hold the name's shard lock. A
//! lookup therefore writes no shared cache line and never waits for a writer, of its own name
//! or any other; it sees each name's entry before or after a change, whole. The shard locks
//! keep what spans names consistent for writers and listings: cookies, the cookie order and
//! the touched sets. A rename changes its two names under both shard locks and inserts the
//! new name before it removes the old one, so a lookup of the new name and then the old one
//! (or the other way round) never finds neither.
//!
//! Every directory's name map reclaims through one process-wide epoch collector
//! ([`guard`]): a path walk pins once and reads every directory on its way under that one pin.
//! With a collector per map (papaya's default), each step paid for the pin itself, two cache
//! misses on the map's own per-thread slot, a third of a lookup's time over a large tree.
//! papaya 0.2.5 frees every pending retirement of a map's collector when the map is dropped,
//! which is only sound for a collector of its own; so a map on the shared collector is never
//! dropped: a directory map that goes away leaves its (emptied) name map in a pool, and the
//! next directory takes it from there. What the pool holds is bounded by the most directory
//! maps that ever existed at once.
//!
//! Each name's slot also remembers the mnode its inode has, once a walk has fetched it from
//! the mnode table ([`Slot::remember`]): the next walk goes from the directory's slot straight
//! to the child, without the table's three cache misses. It cannot go stale: the table holds
//! one mnode per inode for as long as the inode has a name (it lets go only of deleted inodes,
//! whose names are all gone, `Engine::checkpoint`), and a changed name gets a new slot. It
//! keeps the mnode alive until the slot is reclaimed, which is no longer than the table does.
//! Nothing here drops a map's slots synchronously (a dropped map is only emptied: retired
//! slots are reclaimed later, in batches), so a deep tree is not torn down by recursion.
//!
//! Names are hashed with foldhash, randomly keyed per map: they are chosen by whoever creates
//! files, and an unkeyed fast hash would let them pile into one bucket chain. SipHash was a
//! visible part of the lookup profile. Names of up to [`INLINE_NAME`] bytes are stored inline
//! in the entry, which saves the lookup a cache miss.
//!
//! Cookies: every entry gets `((shard + 1) << 40) | seq` when it is inserted, where `seq`
//! grows per shard and never repeats. readdir walks shards in order and each shard in cookie
//! order, so a listing resumed from a cookie neither repeats nor skips an entry that existed
//! for the whole listing, however many names are created or removed meanwhile (entries created
//! during the listing may or may not appear, as POSIX allows). Cookies 1 and 2 are left for
//! "." and "..".
//!
//! A renamed or replaced name gets a fresh cookie, past every existing one in its shard. A
//! listing that renames each entry it sees (away and back, as fstests' generic/736 does) would
//! therefore meet every entry again, without end. A listing that starts with a [`Horizon`]
//! (each shard's last cookie at that moment) returns only entries whose cookies lie within it:
//! every entry that exists throughout the listing exactly once, none created during it, and an
//! end bounded by what existed at its start.
//!
//! Touched names: every change of a name also records, in its shard and in the same critical
//! section, the name's new entry in the shard's touched set (names changed since the last
//! checkpoint snapshot). The checkpoint takes these sets instead of reading the directory's
//! operation log and looking each name up: with every operation drained, each touched name's
//! recorded entry is the entry it has at that moment. Entries loaded from disk are not touched.

use crate::sync::rank::{Rank, RwLock};
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

use crate::mem::mnode::MNode;

use crossbeam::queue::SegQueue;

/// Shards per directory. Each is one cache line ([`ShardCell`]), so a directory's map costs
/// 8 KiB whatever it holds; 64 shards left renames in one shared directory (two shards each)
/// at 0.012 contended acquisitions per operation at two threads (issue 16 asks for < 0.01).
const SHARDS: usize = 128;
/// Words of `DirMap::touched`, one bit per shard.
const TOUCHED_WORDS: usize = SHARDS / 64;
const _: () = assert!(SHARDS.is_multiple_of(64));
const SEQ_BITS: u32 = 40;

/// One name in a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u32,
    /// `DT_*` file type.
    pub file_type: u8,
    /// Position for readdir; unique within the directory for its lifetime.
    pub cookie: u64,
}

/// Longest name the directory index stores inline, without a heap allocation.
pub const INLINE_NAME: usize = 22;

/// A name as the lookup map's key: inline up to [`INLINE_NAME`] bytes, boxed beyond. Hashes
/// and compares as its bytes (`Borrow<[u8]>`), so a lookup by `&[u8]` allocates nothing.
#[derive(Clone)]
enum Name {
    Inline(u8, [u8; INLINE_NAME]),
    Heap(Box<[u8]>),
}

impl Name {
    fn new(b: &[u8]) -> Name {
        if b.len() <= INLINE_NAME {
            let mut a = [0u8; INLINE_NAME];
            a[..b.len()].copy_from_slice(b);
            Name::Inline(b.len() as u8, a)
        } else {
            Name::Heap(b.into())
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Name::Inline(n, a) => &a[..*n as usize],
            Name::Heap(b) => b,
        }
    }
}

impl Borrow<[u8]> for Name {
    fn borrow(&self) -> &[u8] {
        self.bytes()
    }
}

impl PartialEq for Name {
    fn eq(&self, o: &Name) -> bool {
        self.bytes() == o.bytes()
    }
}

impl Eq for Name {}

impl Hash for Name {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.bytes().hash(h)
    }
}

/// A name's entry in the lookup index, with the mnode it names once a walk has fetched it
/// (see the module documentation).
pub struct Slot {
    entry: DirEntry,
    child: OnceLock<Arc<MNode>>,
}

impl Slot {
    fn new(entry: DirEntry) -> Slot {
        Slot { entry, child: OnceLock::new() }
    }

    pub fn entry(&self) -> DirEntry {
        self.entry
    }

    /// The mnode of [`Slot::entry`]'s inode, if a walk has fetched it.
    #[inline]
    pub fn child(&self) -> Option<&Arc<MNode>> {
        self.child.get()
    }

    /// Remembers `m`, the mnode table's mnode for this entry's inode, for the walks after;
    /// returns the one remembered (another walk's, if it came first: the same mnode).
    pub fn remember(&self, m: Arc<MNode>) -> &Arc<MNode> {
        debug_assert_eq!(m.ino, self.entry.ino, "a slot remembers the mnode of its own inode");
        let r = self.child.get_or_init(|| m);
        debug_assert_eq!(r.ino, self.entry.ino);
        r
    }
}

/// The lock-free name index (see the module documentation).
type Names = papaya::HashMap<Name, Slot, foldhash::fast::RandomState>;

/// The epoch collector of every directory's name map (see the module documentation). Never
/// dropped.
///
/// Its batch is larger than seize's default of 32: each full batch costs one `membarrier` (an
/// interrupt on every CPU the process runs on), and every unlink or rename retires a name's
/// entry, so in one shared directory (MWUM, MWRM) the workers interrupted each other every 32
/// operations. A name's entry is small (the name, inline up to 22 bytes, and its slot), so 512
/// of them held back per thread is little memory; a slot may remember its dead mnode, but a
/// dead mnode gives back its cached pages when the cells let go of it (`Resident::removed`),
/// not when it is freed.
static COLLECTOR: LazyLock<Arc<seize::Collector>> =
    LazyLock::new(|| Arc::new(seize::Collector::new().batch_size(NAME_RETIRE_BATCH)));

/// Retired name entries a thread collects before reclaiming them (see [`COLLECTOR`]).
const NAME_RETIRE_BATCH: usize = 512;

/// Name maps of directory maps that went away, emptied, for the next ones: a map on the shared
/// collector must not be dropped (see the module documentation). Lock-free, so that a
/// directory map may be dropped anywhere, under any lock.
static POOL: SegQueue<Names> = SegQueue::new();

/// A pin of the directory maps' collector: while it lives, every [`DirEntry`] read under it
/// from any directory stays valid. Pins nest; keep it short (it holds back reclamation).
pub type Guard = seize::LocalGuard<'static>;

/// Pins the directory maps' collector (one thread-local store), for [`DirMap::lookup_in`].
#[inline]
pub fn guard() -> Guard {
    COLLECTOR.enter()
}

#[derive(Default)]
struct Shard {
    by_cookie: BTreeMap<u64, Box<[u8]>>,
    next_seq: u64,
    /// Names changed since the last [`DirMap::take_touched`], with their entry now; boxed on
    /// its first name, so that a shard fits one cache line.
    touched: Option<Box<Touched>>,
}

/// A shard behind its lock, with the number of names it holds beside it: changed under the
/// lock, on a line its writer holds anyway, and summed by [`DirMap::len`] without a lock. One
/// count for the whole directory would be a line every writer of the directory writes.
///
/// One cache line each: neighbouring shards' writers never share a line.
#[repr(align(64))]
struct ShardCell {
    lock: RwLock<Shard>,
    len: AtomicU64,
}

// The 8 KiB a directory's map costs (see [`SHARDS`]) counts on it.
const _: () = assert!(std::mem::size_of::<ShardCell>() == 64);

impl std::ops::Deref for ShardCell {
    type Target = RwLock<Shard>;
    fn deref(&self) -> &RwLock<Shard> {
        &self.lock
    }
}

/// One shard's touched names (see the module documentation), as [`DirMap::take_touched`]
/// hands them over.
///
/// Hashed with foldhash, randomly seeded, as the name index is (names are chosen by users, so
/// the seed must be unpredictable; SipHash cost every namespace change a visible share in one
/// shared directory).
pub type Touched = HashMap<Box<[u8]>, Option<(u32, u8)>, foldhash::fast::RandomState>;

/// Each shard's last cookie sequence number when a listing started (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Horizon(Box<[u64]>);

/// A directory's entries.
pub struct DirMap {
    /// Every name's entry. Changed only under the name's shard write lock; read anywhere.
    /// `None` only while the map is dropped (it goes back to [`POOL`]).
    names: Option<Names>,
    shards: Box<[ShardCell]>,
    /// Bit s % 64 of word s / 64 set: shard s's touched set may be non-empty. Set when a
    /// shard's set gains its first name (so once per shard between snapshots, not once per
    /// change: it is a line every writer of the directory shares), under the shard's lock; 0
    /// lets the snapshot skip the shards.
    touched: [AtomicU64; TOUCHED_WORDS],
}

impl Default for DirMap {
    fn default() -> Self {
        Self::new()
    }
}

fn shard_of(name: &[u8]) -> usize {
    crc32c::crc32c(name) as usize % SHARDS
}

impl DirMap {
    pub fn new() -> DirMap {
        let names = POOL.pop().unwrap_or_else(|| {
            papaya::HashMap::<Name, Slot>::builder()
                .hasher(foldhash::fast::RandomState::default())
                .shared_collector(COLLECTOR.clone())
                .build()
        });
        debug_assert!(names.is_empty(), "a pooled name map is empty");
        DirMap {
            names: Some(names),
            shards: (0..SHARDS)
                .map(|_| ShardCell {
                    lock: RwLock::new(Rank::DirShard, Shard::default()),
                    len: AtomicU64::new(0),
                })
                .collect(),
            touched: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The size a directory reports (st_size): a whole number of 4 KiB blocks derived from the
    /// entry count alone, so it reads the same before and after a checkpoint or remount.
    pub fn reported_size(&self) -> u64 {
        4096 * self.len().div_ceil(128).max(1)
    }

    /// Number of entries: the shards' counts summed, each as its last writer left it.
    pub fn len(&self) -> u64 {
        self.shards.iter().map(|c| c.len.load(Ordering::Relaxed)).sum()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the map is empty, counted with each shard's lock taken in turn, after the caller
    /// stored something that adders check under their shard's lock (rmdir's `dead` mark). An
    /// add whose critical section ended before its shard was reached is counted; one that
    /// starts after it sees the caller's store (the lock orders the two). The plain count could
    /// miss an add that checked before the store and counts after the read.
    pub fn is_empty_barrier(&self) -> bool {
        self.shards.iter().all(|c| {
            let _held = c.read();
            c.len.load(Ordering::Relaxed) == 0
        })
    }

    #[inline]
    fn names(&self) -> &Names {
        self.names.as_ref().expect("a directory map has its names until it is dropped")
    }

    /// The entry of `name`: lock-free, storing to no shared line.
    #[inline]
    pub fn lookup(&self, name: &[u8]) -> Option<DirEntry> {
        self.lookup_in(name, &guard())
    }

    /// [`DirMap::lookup`] under the caller's pin: a walk pins once for all its directories.
    #[inline]
    pub fn lookup_in(&self, name: &[u8], g: &Guard) -> Option<DirEntry> {
        self.slot(name, g).map(Slot::entry)
    }

    /// The slot of `name` under the caller's pin, valid while the pin lives: a walk takes the
    /// child's mnode from it without a trip through the mnode table.
    #[inline]
    pub fn slot<'g>(&self, name: &[u8], g: &'g Guard) -> Option<&'g Slot> {
        self.names().get(name, g)
    }

    /// Runs `f` with the shard of `name` write-locked and the current entry for it; `f` returns
    /// what the entry should become (None: absent). The whole change is atomic for that name;
    /// `f` must be short (it runs under the shard lock) and must not touch this directory.
    pub fn update<R>(&self, name: &[u8], f: impl FnOnce(Option<DirEntry>) -> (Option<(u32, u8)>, R)) -> R {
        let s = shard_of(name);
        let mut shard = self.shards[s].write();
        let old = self.lookup(name);
        let (new, r) = f(old);
        self.apply(&mut shard, s, name, new);
        r
    }

    /// Sets `name` in locked shard `s` to `new`, and records it touched if that changes it.
    fn apply(&self, shard: &mut Shard, s: usize, name: &[u8], new: Option<(u32, u8)>) {
        let old = self.lookup(name);
        if old.map(|o| (o.ino, o.file_type)) != new {
            let touched = shard.touched.get_or_insert_with(Box::default);
            if touched.is_empty() {
                self.touched[s / 64].fetch_or(1 << (s % 64), Ordering::Relaxed);
            }
            // A name changed again since the last checkpoint (MWRM's names come back every
            // round) keeps its key: no allocation for a new one only to drop it.
            match touched.get_mut(name) {
                Some(e) => *e = new,
                None => {
                    touched.insert(name.into(), new);
                }
            }
        }
        self.set(shard, s, name, old, new);
    }

    /// Sets `name`, whose entry is `old`, in locked shard `s` to `new`.
    fn set(&self, shard: &mut Shard, s: usize, name: &[u8], old: Option<DirEntry>, new: Option<(u32, u8)>) {
        match (old, new) {
            (None, None) => {}
            (Some(o), None) => {
                self.names().pin().remove(name);
                shard.by_cookie.remove(&o.cookie);
                self.shards[s].len.fetch_sub(1, Ordering::Relaxed);
            }
            (old, Some((ino, file_type))) => {
                // A replaced entry gets a fresh cookie, like a new name: a listing in progress
                // may show it again, which POSIX allows for changed entries.
                if let Some(o) = old {
                    shard.by_cookie.remove(&o.cookie);
                } else {
                    self.shards[s].len.fetch_add(1, Ordering::Relaxed);
                }
                shard.next_seq += 1;
                assert!(shard.next_seq < 1 << SEQ_BITS, "directory shard exhausted its cookies");
                let cookie = ((s as u64 + 1) << SEQ_BITS) | shard.next_seq;
                self.names().pin().insert(Name::new(name), Slot::new(DirEntry { ino, file_type, cookie }));
                shard.by_cookie.insert(cookie, name.into());
            }
        }
    }

    /// Inserts `name` if absent; returns the existing entry otherwise.
    pub fn insert(&self, name: &[u8], ino: u32, file_type: u8) -> Result<DirEntry, DirEntry> {
        self.update(name, |old| match old {
            Some(e) => (Some((e.ino, e.file_type)), Err(e)),
            None => (Some((ino, file_type)), Ok(())),
        })
        .map(|()| self.lookup(name).expect("just inserted"))
    }

    /// Removes `name`; returns its entry.
    pub fn remove(&self, name: &[u8]) -> Option<DirEntry> {
        self.update(name, |old| (None, old))
    }

    /// Inserts an entry read from the directory's blocks on disk: unlike [`DirMap::insert`],
    /// not a change, so the name is not touched.
    pub fn insert_loaded(&self, name: &[u8], ino: u32, file_type: u8) -> Result<DirEntry, DirEntry> {
        let s = shard_of(name);
        let mut shard = self.shards[s].write();
        if let Some(e) = self.lookup(name) {
            return Err(e);
        }
        self.set(&mut shard, s, name, None, Some((ino, file_type)));
        Ok(self.lookup(name).expect("inserted under the shard lock"))
    }

    /// Takes every shard's touched names (see the module documentation): one swap per shard,
    /// however many names changed, and none when none did. The checkpoint's snapshot calls it
    /// with every operation drained, so that each entry is the name's entry at that moment.
    pub fn take_touched(&self) -> Vec<Touched> {
        let marked: [u64; TOUCHED_WORDS] =
            std::array::from_fn(|w| self.touched[w].swap(0, Ordering::Relaxed));
        (0..SHARDS)
            .filter(|&s| marked[s / 64] & (1 << (s % 64)) != 0)
            .filter_map(|s| self.shards[s].write().touched.take())
            .map(|t| *t)
            .filter(|t| !t.is_empty())
            .collect()
    }

    /// Where every shard's cookies stand now: a listing that passes it to
    /// [`DirMap::list_after`] sees no entry created after this call.
    pub fn horizon(&self) -> Horizon {
        Horizon(self.shards.iter().map(|s| s.read().next_seq).collect())
    }

    /// Up to `max` entries with cookies after `after`, in cookie order; with a horizon, only
    /// entries whose cookies it covers.
    pub fn list_after(&self, after: u64, max: usize, horizon: Option<&Horizon>) -> Vec<(Vec<u8>, DirEntry)> {
        debug_assert!(horizon.is_none_or(|h| h.0.len() == SHARDS), "a horizon has one cookie per shard");
        let mut out = Vec::new();
        let first_shard = (after >> SEQ_BITS).saturating_sub(1) as usize;
        for s in first_shard..SHARDS {
            if out.len() >= max {
                break;
            }
            let shard = self.shards[s].read();
            let lo = if s == first_shard { after + 1 } else { 0 };
            let hi = horizon.map_or(u64::MAX, |h| ((s as u64 + 1) << SEQ_BITS) | h.0[s]);
            if lo > hi {
                continue;
            }
            for (_, name) in shard.by_cookie.range(lo..=hi) {
                if out.len() >= max {
                    break;
                }
                // Under the shard's read lock no writer changes a name of this shard.
                let e = self.lookup(name).expect("a listed cookie names an entry");
                out.push((name.to_vec(), e));
            }
        }
        out
    }

    /// Every entry (name, entry), unordered.
    #[cfg(test)]
    pub fn entries(&self) -> Vec<(Vec<u8>, DirEntry)> {
        self.names().pin().iter().map(|(k, v)| (k.bytes().to_vec(), v.entry)).collect()
    }
}

impl Drop for DirMap {
    fn drop(&mut self) {
        // Emptied and pooled, not dropped: see the module documentation.
        if let Some(names) = self.names.take() {
            names.pin().clear();
            POOL.push(names);
        }
    }
}

/// Changes two names atomically (rename): both shards are locked, in the global order of
/// (directory inode, shard), `f` sees both current entries and returns both new ones.
pub fn update_two<E>(
    a: (u32, &DirMap, &[u8]),
    b: (u32, &DirMap, &[u8]),
    f: impl FnOnce(Option<DirEntry>, Option<DirEntry>) -> Result<(Option<(u32, u8)>, Option<(u32, u8)>), E>,
) -> Result<(), E> {
    let (ai, am, an) = a;
    let (bi, bm, bn) = b;
    let (sa, sb) = (shard_of(an), shard_of(bn));
    debug_assert!(!(std::ptr::eq(am, bm) && an == bn), "update_two of one name");
    if std::ptr::eq(am, bm) && sa == sb {
        let mut g = am.shards[sa].write();
        let (ca, cb) = (am.lookup(an), am.lookup(bn));
        let (na, nb) = f(ca, cb)?;
        // The name that gains an entry first: a lookup never finds both names gone.
        if na.is_none() {
            am.apply(&mut g, sa, bn, nb);
            am.apply(&mut g, sa, an, na);
        } else {
            am.apply(&mut g, sa, an, na);
            am.apply(&mut g, sa, bn, nb);
        }
        return Ok(());
    }
    let a_first = (ai, sa) < (bi, sb);
    let (mut ga, mut gb) = if a_first {
        let ga = am.shards[sa].write();
        (ga, bm.shards[sb].write())
    } else {
        let gb = bm.shards[sb].write();
        (am.shards[sa].write(), gb)
    };
    let (ca, cb) = (am.lookup(an), bm.lookup(bn));
    let (na, nb) = f(ca, cb)?;
    // The name that gains an entry first, as above.
    if na.is_none() {
        bm.apply(&mut gb, sb, bn, nb);
        am.apply(&mut ga, sa, an, na);
    } else {
        am.apply(&mut ga, sa, an, na);
        bm.apply(&mut gb, sb, bn, nb);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
