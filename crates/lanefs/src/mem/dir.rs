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

const SHARDS: usize = 64;
// `DirMap::touched` has one bit per shard.
const _: () = assert!(SHARDS <= 64);
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
static COLLECTOR: LazyLock<Arc<seize::Collector>> = LazyLock::new(|| Arc::new(seize::Collector::new()));

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
    /// Names changed since the last [`DirMap::take_touched`], with their entry now.
    touched: HashMap<Box<[u8]>, Option<(u32, u8)>>,
}

/// A shard behind its lock, with the number of names it holds beside it: changed under the
/// lock, on a line its writer holds anyway, and summed by [`DirMap::len`] without a lock. One
/// count for the whole directory would be a line every writer of the directory writes.
struct ShardCell {
    lock: RwLock<Shard>,
    len: AtomicU64,
}

impl std::ops::Deref for ShardCell {
    type Target = RwLock<Shard>;
    fn deref(&self) -> &RwLock<Shard> {
        &self.lock
    }
}

/// One shard's touched names (see the module documentation), as [`DirMap::take_touched`]
/// hands them over.
pub type Touched = HashMap<Box<[u8]>, Option<(u32, u8)>>;

/// Each shard's last cookie sequence number when a listing started (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Horizon(Box<[u64]>);

/// A directory's entries.
pub struct DirMap {
    /// Every name's entry. Changed only under the name's shard write lock; read anywhere.
    /// `None` only while the map is dropped (it goes back to [`POOL`]).
    names: Option<Names>,
    shards: Box<[ShardCell]>,
    /// Bit s set: shard s's touched set may be non-empty. Set when a shard's set gains its
    /// first name (so once per shard between snapshots, not once per change: it is a line
    /// every writer of the directory shares), under the shard's lock; 0 lets the snapshot skip
    /// the shards.
    touched: AtomicU64,
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
            touched: AtomicU64::new(0),
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
            if shard.touched.is_empty() {
                self.touched.fetch_or(1 << s, Ordering::Relaxed);
            }
            shard.touched.insert(name.into(), new);
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
        let marked = self.touched.swap(0, Ordering::Relaxed);
        (0..SHARDS)
            .filter(|&s| marked & (1 << s) != 0)
            .map(|s| std::mem::take(&mut self.shards[s].write().touched))
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
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn insert_lookup_remove() {
        let d = DirMap::new();
        assert!(d.insert(b"a", 5, 8).is_ok());
        assert_eq!(d.insert(b"a", 6, 8).unwrap_err().ino, 5);
        assert_eq!(d.lookup(b"a").unwrap().ino, 5);
        assert_eq!(d.len(), 1);
        assert_eq!(d.remove(b"a").unwrap().ino, 5);
        assert!(d.lookup(b"a").is_none());
        assert!(d.is_empty());
    }

    /// Directory maps made and dropped on many threads at once share the pooled name maps:
    /// every new map starts empty, whatever map it was before, and sees only its own names,
    /// while other threads look names up in a map that lives throughout.
    #[test]
    fn pooled_name_maps_start_empty_on_every_thread() {
        let keep = Arc::new(DirMap::new());
        for i in 0..64u32 {
            keep.insert(format!("k{i}").as_bytes(), i + 1, 8).unwrap();
        }
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let keep = &keep;
                s.spawn(move || {
                    for round in 0..300u32 {
                        let d = DirMap::new();
                        assert!(d.is_empty() && d.entries().is_empty(), "a new map holds names");
                        assert!(d.lookup(b"x0").is_none(), "a new map finds another map's name");
                        for i in 0..(round % 40) {
                            d.insert(format!("x{i}").as_bytes(), t * 1000 + i + 1, 8).unwrap();
                        }
                        for i in 0..(round % 40) {
                            assert_eq!(d.lookup(format!("x{i}").as_bytes()).unwrap().ino, t * 1000 + i + 1);
                        }
                        let g = guard();
                        let i = round % 64;
                        assert_eq!(keep.lookup_in(format!("k{i}").as_bytes(), &g).unwrap().ino, i + 1);
                    }
                });
            }
        });
        assert_eq!(keep.len(), 64);
        assert_eq!(keep.entries().len(), 64);
    }

    #[test]
    fn listing_resumes_without_repeats_or_skips_under_churn() {
        let d = Arc::new(DirMap::new());
        for i in 0..2000u32 {
            d.insert(format!("stable-{i}").as_bytes(), i + 10, 8).unwrap();
        }
        let churn = {
            let d = d.clone();
            std::thread::spawn(move || {
                for round in 0..20 {
                    for i in 0..200u32 {
                        let n = format!("churn-{round}-{i}");
                        d.insert(n.as_bytes(), 1, 8).unwrap();
                        if i % 2 == 0 {
                            d.remove(n.as_bytes());
                        }
                    }
                }
            })
        };
        let mut seen = HashSet::new();
        let mut cookie = 2;
        loop {
            let page = d.list_after(cookie, 37, None);
            if page.is_empty() {
                break;
            }
            for (name, e) in &page {
                assert!(e.cookie > cookie, "cookies must increase");
                assert!(seen.insert(name.clone()), "{} listed twice", String::from_utf8_lossy(name));
            }
            cookie = page.last().unwrap().1.cookie;
        }
        churn.join().unwrap();
        for i in 0..2000u32 {
            assert!(seen.contains(format!("stable-{i}").as_bytes()), "stable-{i} skipped");
        }
    }

    #[test]
    fn a_listing_within_its_horizon_ends_while_it_renames_what_it_reads() {
        // fstests generic/736: rename each entry away and back as it is read.
        let d = DirMap::new();
        for i in 0..500u32 {
            d.insert(format!("{i}").as_bytes(), i + 10, 8).unwrap();
        }
        let rename_away_and_back = |name: &[u8]| {
            let e = d.remove(name).expect("listed entry exists");
            d.insert(b"TEMPFILE", e.ino, e.file_type).unwrap();
            let t = d.remove(b"TEMPFILE").unwrap();
            d.insert(name, t.ino, t.file_type).unwrap();
        };
        // Without a horizon the listing meets renamed entries again: far more than 500 reads.
        let (mut cookie, mut reads) = (2, 0);
        while reads <= 3 * 500 {
            let page = d.list_after(cookie, 16, None);
            let Some(last) = page.last() else { break };
            cookie = last.1.cookie;
            reads += page.len();
            page.iter().for_each(|(n, _)| rename_away_and_back(n));
        }
        assert!(reads > 3 * 500, "an unbounded listing should keep meeting renamed entries");
        // Within a horizon: every entry exactly once, then the end. A name created during the
        // listing is not returned.
        let h = d.horizon();
        d.insert(b"late", 1, 8).unwrap();
        let (mut cookie, mut seen) = (2, HashSet::new());
        for _ in 0..=500 {
            let page = d.list_after(cookie, 16, Some(&h));
            let Some(last) = page.last() else { break };
            cookie = last.1.cookie;
            for (n, _) in &page {
                assert!(seen.insert(n.clone()), "{} listed twice", String::from_utf8_lossy(n));
                rename_away_and_back(n);
            }
        }
        assert!(d.list_after(cookie, 16, Some(&h)).is_empty(), "the listing ends");
        assert_eq!(seen.len(), 500);
        assert!(!seen.contains(b"late".as_slice()), "a name created during the listing");
        // A fresh horizon sees the directory as it is now (rewinddir).
        assert_eq!(d.list_after(2, 1000, Some(&d.horizon())).len(), 501);
    }

    #[test]
    fn concurrent_creates_of_distinct_names_all_land() {
        let d = Arc::new(DirMap::new());
        let hs: Vec<_> = (0..8u32)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u32 {
                        d.insert(format!("t{t}-{i}").as_bytes(), t * 10_000 + i + 1, 8).unwrap();
                    }
                    // Same name from every thread: exactly one wins.
                    d.insert(b"contended", t + 1, 8).is_ok()
                })
            })
            .collect();
        let winners = hs.into_iter().map(|h| h.join().unwrap()).filter(|&w| w).count();
        assert_eq!(winners, 1);
        assert_eq!(d.len(), 8 * 2000 + 1);
        assert_eq!(d.entries().len(), 8 * 2000 + 1);
        let cookies: HashSet<u64> = d.entries().iter().map(|e| e.1.cookie).collect();
        assert_eq!(cookies.len(), 8 * 2000 + 1, "cookies are unique");
    }

    /// The per-shard counts and the touched bits under many writers: threads create, remove
    /// and rename their own names in one directory (every shard written by every thread) while
    /// another takes the touched sets over and over, as checkpoints do. Afterwards the summed
    /// count equals the entries, and the touched sets taken during the run and at its end hold,
    /// for every name that changed, its final entry: no change was lost to a cleared bit.
    #[test]
    fn shard_counts_and_touched_bits_hold_under_concurrent_changes() {
        const T: u32 = 6;
        const N: u32 = 1500;
        let d = Arc::new(DirMap::new());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let taker = {
            let (d, stop) = (d.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen: HashMap<Box<[u8]>, Option<(u32, u8)>> = HashMap::new();
                while !stop.load(Ordering::Acquire) {
                    for t in d.take_touched() {
                        seen.extend(t);
                    }
                }
                seen
            })
        };
        let hs: Vec<_> = (0..T)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for i in 0..N {
                        let ino = t * 100_000 + i + 1;
                        d.insert(format!("c{t}-{i}").as_bytes(), ino, 8).unwrap();
                        if i % 3 == 0 {
                            assert!(d.remove(format!("c{t}-{i}").as_bytes()).is_some());
                        } else if i % 3 == 1 {
                            let (from, to) = (format!("c{t}-{i}"), format!("r{t}-{i}"));
                            update_two((1, &*d, from.as_bytes()), (1, &*d, to.as_bytes()), |a, b| {
                                assert!(b.is_none());
                                Ok::<_, ()>((None, a.map(|e| (e.ino, e.file_type))))
                            })
                            .unwrap();
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        stop.store(true, Ordering::Release);
        let mut seen = taker.join().unwrap();
        for t in d.take_touched() {
            seen.extend(t);
        }
        assert_eq!(d.touched.load(Ordering::Relaxed), 0, "nothing touched after the last take");
        let entries = d.entries();
        assert_eq!(d.len(), entries.len() as u64);
        assert_eq!(entries.len() as u32, T * (N - N.div_ceil(3)));
        for (i, c) in d.shards.iter().enumerate() {
            let listed = c.read().by_cookie.len() as u64;
            assert_eq!(c.len.load(Ordering::Relaxed), listed, "shard {i} counts what it lists");
        }
        // Every name ever used, with the entry it ended with.
        for t in 0..T {
            for i in 0..N {
                let ino = t * 100_000 + i + 1;
                let (c, r) = (format!("c{t}-{i}"), format!("r{t}-{i}"));
                let want_c = (i % 3 == 2).then_some((ino, 8));
                let want_r = (i % 3 == 1).then_some((ino, 8));
                assert_eq!(seen.get(c.as_bytes()).copied(), Some(want_c), "{c}");
                assert_eq!(d.lookup(c.as_bytes()).map(|e| (e.ino, e.file_type)), want_c, "{c}");
                if want_r.is_some() {
                    assert_eq!(seen.get(r.as_bytes()).copied(), Some(want_r), "{r}");
                }
            }
        }
    }

    /// Renames old-i -> new-i (within one directory, and from one directory to another) while
    /// readers look each pair up, old name first: a reader that finds the old name gone must
    /// find the new one, since a rename inserts before it removes. Lookups also run against a
    /// churn of creates and removes and must only ever see the entry made for their name.
    #[test]
    fn lock_free_lookups_never_lose_a_renamed_name_and_see_whole_entries() {
        const N: u32 = 3000;
        let a = Arc::new(DirMap::new());
        let b = Arc::new(DirMap::new());
        for i in 0..N {
            a.insert(format!("old-{i}").as_bytes(), i + 1, 8).unwrap();
            // Long names take the boxed path of `Name`.
            a.insert(format!("old-long-name-past-the-inline-limit-{i}").as_bytes(), N + i + 1, 8).unwrap();
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..3)
                .map(|_| {
                    let (a, b, stop) = (&a, &b, &stop);
                    s.spawn(move || {
                        let mut checks = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            for i in (0..N).step_by(7) {
                                if a.lookup(format!("old-{i}").as_bytes()).is_none() {
                                    let e =
                                        a.lookup(format!("new-{i}").as_bytes()).expect("renamed name lost");
                                    assert_eq!(e.ino, i + 1);
                                    checks += 1;
                                }
                                let long = format!("old-long-name-past-the-inline-limit-{i}");
                                if a.lookup(long.as_bytes()).is_none() {
                                    let e =
                                        b.lookup(format!("moved-{i}").as_bytes()).expect("moved name lost");
                                    assert_eq!(e.ino, N + i + 1);
                                }
                                if let Some(e) = a.lookup(format!("churn-{i}").as_bytes()) {
                                    assert_eq!(e.ino, 7 * N + i, "an entry made for another name");
                                }
                            }
                        }
                        checks
                    })
                })
                .collect();
            let (a2, b2) = (&a, &b);
            let renamer = s.spawn(move || {
                for i in 0..N {
                    let (o, n) = (format!("old-{i}"), format!("new-{i}"));
                    update_two::<()>((1, a2, o.as_bytes()), (1, a2, n.as_bytes()), |x, y| {
                        assert!(y.is_none());
                        Ok((None, x.map(|e| (e.ino, e.file_type))))
                    })
                    .unwrap();
                    let (o, n) = (format!("old-long-name-past-the-inline-limit-{i}"), format!("moved-{i}"));
                    update_two::<()>((1, a2, o.as_bytes()), (2, b2, n.as_bytes()), |x, _| {
                        Ok((None, x.map(|e| (e.ino, e.file_type))))
                    })
                    .unwrap();
                }
            });
            let a3 = &a;
            let churn = s.spawn(move || {
                for round in 0..4 {
                    for i in 0..N {
                        let n = format!("churn-{i}");
                        if round % 2 == 0 {
                            a3.insert(n.as_bytes(), 7 * N + i, 8).unwrap();
                        } else {
                            a3.remove(n.as_bytes()).unwrap();
                        }
                    }
                }
            });
            renamer.join().unwrap();
            churn.join().unwrap();
            stop.store(true, Ordering::Relaxed);
            for r in readers {
                r.join().unwrap();
            }
        });
        assert_eq!(a.len(), u64::from(N));
        assert_eq!(b.len(), u64::from(N));
        assert_eq!(a.entries().len(), N as usize);
        // Listing agrees with the lookup index: every listed name looks up to its entry.
        let listed = a.list_after(2, usize::MAX, None);
        assert_eq!(listed.len(), N as usize);
        for (name, e) in listed {
            assert_eq!(a.lookup(&name), Some(e));
        }
    }
}
