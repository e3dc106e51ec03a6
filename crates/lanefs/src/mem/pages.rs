//! File pages in memory: a sparse, sharded map from page index to a 4 KiB buffer.
//!
//! Writers to different pages of one file lock different shards, so disjoint ranges written in
//! parallel rarely meet; byte-level exclusion between overlapping writers is the range lock's
//! job, not this map's. The shard of a page is the XOR of its index's nibbles (`shard_of`),
//! not the index modulo the shard count: threads that each write their own region of a shared
//! file start at multiples of a power of two (FxMark's DWOM: page 2048 x), which the modulo
//! put all in one shard. Each shard has its own cache line. Nothing relies on which shard a
//! page is in: every `take_*` sorts what it collects. Buffers are shared with
//! copy-on-write (`Arc::make_mut`): fsync and the checkpoint take a reference to a dirty page and
//! write it out while a writer that arrives meanwhile copies the page instead of waiting.
//!
//! A page is clean, *dirty* (changed since it was last made durable anywhere), or *logged*
//! (its contents are durable in the persistent-memory region's journal, where an fsync put them
//! inline, but not yet on the device: a checkpoint or writeback must still write it, an fsync
//! need not). Each shard lists its dirty pages and its logged pages, so that fsync costs what
//! is dirty, not what is cached (a file with a large cached working set and one dirty page is
//! the common fsync-heavy case). Invariants, under the shard's lock: `dirty` holds exactly the
//! indexes of the pages whose `dirty` flag is set, each once; `logged` holds every index whose
//! `logged` flag is set, and possibly stale or repeated ones (checked against the flag when
//! drained; bounded by the inline fsyncs since the last checkpoint); no page is both dirty and
//! logged. A dirty, logged or in-flight page is never evicted.

use crate::sync::rank::{Mutex, Rank};
use crossbeam::utils::CachePadded;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

pub const PAGE_SIZE: usize = 4096;
const SHARDS: usize = 16;
const _: () = assert!(SHARDS <= 32, "one bit per shard in PageMap::dirty_shards");
const _: () = assert!(SHARDS == 16, "shard_of folds nibbles");
const _: () = assert!(PAGE_SIZE == crate::device::BLOCK_SIZE, "a cached page is one block on disk");

/// The shard of page `idx`: the XOR of its 16 nibbles. Sixteen pages `b + x * 2^k` (`x` in
/// `0..16`, `b`'s bits disjoint from `x`'s: a base aligned to `2^(k+4)` plus an offset below
/// `2^k`) land in sixteen shards: the fold is linear over disjoint bits, and the fold of
/// `x << k` is the 4-bit `x` rotated by `k % 4`, a bijection. So do neighbouring pages of one
/// aligned block of 16, and the regions of threads that start at multiples of a power of two.
#[inline]
pub(crate) fn shard_of(idx: u64) -> usize {
    let x = idx ^ (idx >> 32);
    let x = x ^ (x >> 16);
    let x = x ^ (x >> 8);
    let x = x ^ (x >> 4);
    (x & (SHARDS as u64 - 1)) as usize
}

/// One page's bytes.
pub type PageBuf = Arc<[u8; PAGE_SIZE]>;

/// A cached page.
#[derive(Clone)]
pub struct Page {
    pub data: PageBuf,
    /// Changed since it was last made durable (on the device or in the region's journal).
    pub dirty: bool,
    /// Durable in the region's journal only: the device must still get it.
    pub logged: bool,
    /// Taken by fsync, writeback or a checkpoint whose new block address is not installed yet:
    /// the device does not hold this data where the mapping says, so it must stay cached.
    pub in_flight: bool,
}

impl Page {
    fn new(data: PageBuf, dirty: bool) -> Page {
        Page { data, dirty, logged: false, in_flight: false }
    }
}

/// Bytes cached and dirty across every file, for the cache limit.
#[derive(Default)]
pub struct CacheStats {
    pub cached_pages: AtomicI64,
    /// Pages the device must still get: dirty and logged ones.
    pub dirty_pages: AtomicI64,
    /// Blocks preallocated and not yet written, over every file (`mem::reserve`): space no
    /// other writer may take.
    pub reserved_blocks: AtomicU64,
}

/// One shard: its pages and the indexes of the dirty and logged ones (see the module
/// invariants).
#[derive(Default)]
struct Shard {
    /// Keyed by page index with foldhash: SipHash was 4% of a cached 4 KiB read's profile
    /// (DRBM at one thread); the per-process random seed still keeps indexes from colliding
    /// on purpose.
    pages: HashMap<u64, Page, foldhash::fast::RandomState>,
    dirty: Vec<u64>,
    logged: Vec<u64>,
}

impl Shard {
    #[cfg(test)]
    fn check(&self) {
        let mut listed = self.dirty.clone();
        listed.sort_unstable();
        let mut flagged: Vec<u64> = self.pages.iter().filter(|(_, p)| p.dirty).map(|(&i, _)| i).collect();
        flagged.sort_unstable();
        assert_eq!(listed, flagged, "dirty list and dirty flags disagree");
        for (i, p) in &self.pages {
            assert!(!(p.dirty && p.logged), "page {i} is dirty and logged");
            assert!(!p.logged || self.logged.contains(i), "logged page {i} is not listed");
        }
    }
}

/// The pages of one file.
pub struct PageMap {
    /// Padded: writers of neighbouring shards must not share a cache line. Made when the first
    /// page goes in: most files a create makes and an unlink removes never cache one, and then
    /// cost neither the sixteen padded locks (2 KiB) nor a pass over them when dropped.
    shards: OnceLock<Box<[CachePadded<Mutex<Shard>>]>>,
    /// Bit s set: shard s may list dirty pages. Set under the shard's lock after a page is
    /// listed, so a `take_*` that clears the mask first and then visits the marked shards
    /// sees every page listed before its call.
    dirty_shards: AtomicU32,
    /// Pages with the `dirty` flag.
    dirty: AtomicU64,
    /// Pages with the `logged` flag.
    logged: AtomicU64,
    stats: Arc<CacheStats>,
}

impl PageMap {
    pub fn new(stats: Arc<CacheStats>) -> PageMap {
        PageMap {
            shards: OnceLock::new(),
            dirty_shards: AtomicU32::new(0),
            dirty: AtomicU64::new(0),
            logged: AtomicU64::new(0),
            stats,
        }
    }

    /// The shard of page `idx`, made with all the others if none is yet: for adding pages.
    fn shard(&self, idx: u64) -> &Mutex<Shard> {
        let all = self.shards.get_or_init(|| {
            (0..SHARDS).map(|_| CachePadded::new(Mutex::new(Rank::PageShard, Shard::default()))).collect()
        });
        &all[shard_of(idx)]
    }

    /// The shard of page `idx` if the shards exist (a page may be cached): for looking.
    fn cached_shard(&self, idx: u64) -> Option<&Mutex<Shard>> {
        self.shards.get().map(|all| &*all[shard_of(idx)])
    }

    /// Every shard, none before the first page went in.
    fn all(&self) -> &[CachePadded<Mutex<Shard>>] {
        self.shards.get().map_or(&[], |all| all)
    }

    /// Makes `page` (at `idx`, in `shard`, whose lock the caller holds) dirty if it is not.
    fn mark_dirty(&self, shard: &mut Vec<u64>, idx: u64, page: &mut Page) {
        if page.dirty {
            return;
        }
        page.dirty = true;
        shard.push(idx);
        self.dirty.fetch_add(1, Ordering::Relaxed);
        if page.logged {
            // Still owed to the device, now also to the next fsync; the entry in the logged
            // list goes stale.
            page.logged = false;
            self.logged.fetch_sub(1, Ordering::Relaxed);
        } else {
            self.stats.dirty_pages.fetch_add(1, Ordering::Relaxed);
        }
        self.dirty_shards.fetch_or(1 << shard_of(idx), Ordering::AcqRel);
    }

    /// The cached page `idx`, if any.
    pub fn get(&self, idx: u64) -> Option<PageBuf> {
        self.cached_shard(idx)?.lock().pages.get(&idx).map(|p| p.data.clone())
    }

    /// Number of dirty pages of this file (logged ones not included).
    pub fn dirty_count(&self) -> u64 {
        self.dirty.load(Ordering::Relaxed)
    }

    /// Number of logged pages of this file.
    pub fn logged_count(&self) -> u64 {
        self.logged.load(Ordering::Relaxed)
    }

    /// Writes `bytes` at `off` within page `idx`; returns false, changing nothing, if the page
    /// is not cached, the write does not cover it whole and no `base` was given.
    ///
    /// `base` is the page's current contents from the device (zeros for a hole), used only if
    /// the page is still not cached. No I/O happens here, and no other lock is taken under the
    /// shard's: the caller reads the block first, with no lock held, and passes it in while
    /// holding the inode's `disk` lock, after checking that the mapping did not change since
    /// the read (the lock hierarchy ranks `disk` above the page shards; see `sync::rank`).
    pub fn write(&self, idx: u64, off: usize, bytes: &[u8], base: Option<&[u8; PAGE_SIZE]>) -> bool {
        self.write_inner(idx, off, bytes, base, true)
    }

    /// As [`PageMap::write`] with no base, but never installs a page, even for a write that
    /// covers it whole: for a file with reserved blocks, whose pages may start only under
    /// `disk` (`mem::reserve`).
    pub fn write_cached(&self, idx: u64, off: usize, bytes: &[u8]) -> bool {
        self.write_inner(idx, off, bytes, None, false)
    }

    fn write_inner(
        &self,
        idx: u64,
        off: usize,
        bytes: &[u8],
        base: Option<&[u8; PAGE_SIZE]>,
        may_install_whole: bool,
    ) -> bool {
        debug_assert!(off + bytes.len() <= PAGE_SIZE && !bytes.is_empty());
        let full = may_install_whole && off == 0 && bytes.len() == PAGE_SIZE;
        let mut guard = self.shard(idx).lock();
        let shard = &mut *guard;
        let page = match shard.pages.entry(idx) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let base = match (full, base) {
                    (true, _) => [0u8; PAGE_SIZE],
                    (false, Some(b)) => *b,
                    (false, None) => return false,
                };
                self.stats.cached_pages.fetch_add(1, Ordering::Relaxed);
                v.insert(Page::new(Arc::new(base), false))
            }
        };
        Arc::make_mut(&mut page.data)[off..off + bytes.len()].copy_from_slice(bytes);
        self.mark_dirty(&mut shard.dirty, idx, page);
        true
    }

    /// Caches a clean page read from the device (no effect if the page is cached already).
    pub fn insert_clean(&self, idx: u64, data: [u8; PAGE_SIZE]) -> PageBuf {
        let mut shard = self.shard(idx).lock();
        let p = shard.pages.entry(idx).or_insert_with(|| {
            self.stats.cached_pages.fetch_add(1, Ordering::Relaxed);
            Page::new(Arc::new(data), false)
        });
        p.data.clone()
    }

    /// Every dirty page (index order), each marked clean and in flight: what an fsync must make
    /// durable. A writer that changes one of them afterwards copies it and marks it dirty
    /// again; the caller owns the snapshot it got, and calls [`PageMap::settle`] (or
    /// [`PageMap::settle_logged`]) once the page is durable.
    pub fn take_unsynced(&self) -> Vec<(u64, PageBuf)> {
        self.take(false, usize::MAX)
    }

    /// Every dirty or logged page (index order), each marked clean and in flight: what the
    /// device must get (checkpoint, writeback). As [`PageMap::take_unsynced`] otherwise.
    pub fn take_dirty(&self) -> Vec<(u64, PageBuf)> {
        self.take(true, usize::MAX)
    }

    /// As [`PageMap::take_dirty`], but at most `max` pages (not necessarily the lowest
    /// indexes; the rest stay dirty or logged for a later call).
    pub fn take_dirty_upto(&self, max: usize) -> Vec<(u64, PageBuf)> {
        self.take(true, max)
    }

    fn take(&self, with_logged: bool, max: usize) -> Vec<(u64, PageBuf)> {
        let logged = with_logged && self.logged_count() > 0;
        // A write that set a page dirty counted it before it returned (under the shard lock),
        // so a zero here means nothing written before this call is dirty.
        if self.dirty_count() == 0 && !logged || max == 0 {
            return Vec::new();
        }
        let mask = if logged { u32::MAX } else { 0 } | self.dirty_shards.swap(0, Ordering::AcqRel);
        let mut out = Vec::new();
        let (mut n_dirty, mut n_logged) = (0u64, 0u64);
        for (i, s) in self.all().iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0) {
            let mut guard = s.lock();
            let s = &mut *guard;
            let n = s.dirty.len().min(max - out.len());
            for idx in s.dirty.drain(..n) {
                let p = s.pages.get_mut(&idx).expect("a listed page is cached");
                debug_assert!(p.dirty && !p.logged);
                p.dirty = false;
                p.in_flight = true;
                n_dirty += 1;
                out.push((idx, p.data.clone()));
            }
            if !s.dirty.is_empty() {
                // Left for a later call: the shard stays marked (under its lock, as a writer
                // marks it).
                self.dirty_shards.fetch_or(1 << i, Ordering::AcqRel);
            }
            if logged {
                // Bounded by the inline fsyncs since the last drain; stale entries are skipped.
                while out.len() < max {
                    let Some(idx) = s.logged.pop() else { break };
                    let Some(p) = s.pages.get_mut(&idx) else { continue };
                    if !p.logged {
                        continue;
                    }
                    p.logged = false;
                    p.in_flight = true;
                    n_logged += 1;
                    out.push((idx, p.data.clone()));
                }
            }
        }
        self.dirty.fetch_sub(n_dirty, Ordering::Relaxed);
        self.logged.fetch_sub(n_logged, Ordering::Relaxed);
        self.stats.dirty_pages.fetch_sub((n_dirty + n_logged) as i64, Ordering::Relaxed);
        out.sort_unstable_by_key(|p| p.0);
        out
    }

    /// Whether page `idx` is cached (a truncate or punch removes it).
    pub fn is_cached(&self, idx: u64) -> bool {
        self.cached_shard(idx).is_some_and(|s| s.lock().pages.contains_key(&idx))
    }

    /// Ends page `idx`'s flight; returns whether the page still exists (a truncate or punch
    /// removed it otherwise, and its new block must not be mapped).
    pub fn settle(&self, idx: u64) -> bool {
        let Some(shard) = self.cached_shard(idx) else { return false };
        match shard.lock().pages.get_mut(&idx) {
            Some(p) => {
                p.in_flight = false;
                true
            }
            None => false,
        }
    }

    /// Ends the flight of pages an fsync made durable in the region's journal (not on the
    /// device): each becomes logged unless a writer dirtied it meanwhile or it is gone.
    pub fn settle_logged(&self, pages: &[(u64, PageBuf)]) {
        for (idx, _) in pages {
            let mut guard = self.shard(*idx).lock();
            let s = &mut *guard;
            let Some(p) = s.pages.get_mut(idx) else { continue };
            p.in_flight = false;
            if !p.dirty && !p.logged {
                p.logged = true;
                s.logged.push(*idx);
                self.logged.fetch_add(1, Ordering::Relaxed);
                self.stats.dirty_pages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Puts back pages whose write failed so that a later fsync retries them; a page changed
    /// since is dirty already and keeps its newer contents, and a page gone since stays gone
    /// (an in-flight page is never evicted: a truncate or punch removed it, and putting it
    /// back would bring cut data back past the end of the file).
    pub fn restore_dirty(&self, pages: &[(u64, PageBuf)]) {
        for (idx, buf) in pages {
            let mut guard = self.shard(*idx).lock();
            let s = &mut *guard;
            match s.pages.get_mut(idx) {
                Some(p) if !p.dirty => {
                    p.in_flight = false;
                    p.data = buf.clone();
                    self.mark_dirty(&mut s.dirty, *idx, p);
                }
                Some(p) => p.in_flight = false,
                None => {}
            }
        }
    }

    /// Drops pages at or after `from` (truncate), dirty or not, and returns them. Freeing the
    /// buffers is most of a large truncate's cost (16,384 of them for 64 MiB): the caller drops
    /// what this returns once it no longer holds the pass-through semaphore, so a checkpoint's
    /// exclusive phase does not wait for it.
    pub fn truncate(&self, from: u64) -> Vec<Page> {
        let mut out = Vec::new();
        for s in self.all().iter() {
            let mut guard = s.lock();
            let s = &mut *guard;
            let start = out.len();
            if from == 0 {
                // The whole shard: moved out in one pass, the map keeping its table.
                out.extend(s.pages.drain().map(|(_, p)| p));
                s.dirty.clear();
                s.logged.clear();
            } else {
                // One pass over the map and each list, not one search per removed page. The
                // clone shares the buffer (the map's reference goes, the returned one frees it).
                s.pages.retain(|&i, p| {
                    let keep = i < from;
                    if !keep {
                        out.push(p.clone());
                    }
                    keep
                });
                s.dirty.retain(|&i| i < from);
                s.logged.retain(|&i| i < from);
            }
            // Counted down under the shard's lock, with the lists.
            for p in &out[start..] {
                self.forget(p);
            }
        }
        out
    }

    /// Drops page `idx`, dirty or not (a punched hole); returns whether it was cached.
    pub fn truncate_one(&self, idx: u64) -> bool {
        let Some(shard) = self.cached_shard(idx) else { return false };
        let mut guard = shard.lock();
        let s = &mut *guard;
        let Some(p) = s.pages.remove(&idx) else { return false };
        if p.dirty {
            let at = s.dirty.iter().position(|&i| i == idx).expect("a dirty page is listed");
            s.dirty.swap_remove(at);
        }
        // A logged entry goes stale and is skipped when drained.
        self.forget(&p);
        true
    }

    /// Dirty and logged pages for which `mapped` is false (not yet given a block).
    pub fn dirty_unmapped(&self, mapped: impl Fn(u64) -> bool) -> u64 {
        // stat(2) asks this of every file it reports (st_blocks). Most files have nothing
        // dirty: answer them from the counters without taking sixteen shard locks. A page
        // dirtied concurrently may or may not be counted, as under the locks.
        if self.dirty_count() == 0 && self.logged_count() == 0 {
            return 0;
        }
        self.all()
            .iter()
            .map(|s| {
                let s = s.lock();
                // Dirty and logged are exclusive, and the dirty list holds each index once: only
                // the logged list (stale or repeated entries) needs checking and deduplicating.
                let dirty = s.dirty.iter().filter(|&&i| !mapped(i)).count() as u64;
                if s.logged.is_empty() {
                    return dirty;
                }
                let mut logged: Vec<u64> =
                    s.logged.iter().copied().filter(|i| s.pages.get(i).is_some_and(|p| p.logged)).collect();
                logged.sort_unstable();
                logged.dedup();
                dirty + logged.into_iter().filter(|&i| !mapped(i)).count() as u64
            })
            .sum()
    }

    /// Drops clean pages to free memory; returns how many were dropped.
    pub fn evict_clean(&self, max: usize) -> usize {
        let mut n = 0;
        for s in self.all().iter() {
            let mut s = s.lock();
            let clean: Vec<u64> = s
                .pages
                .iter()
                .filter(|(_, p)| !p.dirty && !p.logged && !p.in_flight)
                .map(|(&i, _)| i)
                .take(max - n)
                .collect();
            for i in clean {
                let p = s.pages.remove(&i).expect("listed");
                self.forget(&p);
                n += 1;
            }
            if n >= max {
                break;
            }
        }
        n
    }

    fn forget(&self, p: &Page) {
        self.stats.cached_pages.fetch_sub(1, Ordering::Relaxed);
        if p.dirty {
            self.dirty.fetch_sub(1, Ordering::Relaxed);
        }
        if p.logged {
            self.logged.fetch_sub(1, Ordering::Relaxed);
        }
        if p.dirty || p.logged {
            self.stats.dirty_pages.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for PageMap {
    fn drop(&mut self) {
        for s in self.all().iter() {
            for p in s.lock().pages.values() {
                self.forget(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes with a zero base (a hole), as the engine does for a page with no block.
    fn w(m: &PageMap, idx: u64, off: usize, bytes: &[u8]) {
        assert!(m.write(idx, off, bytes, Some(&[0; PAGE_SIZE])));
    }

    #[test]
    fn a_map_makes_its_shards_only_for_its_first_page() {
        let stats = Arc::new(CacheStats::default());
        let m = PageMap::new(stats.clone());
        // Looking, taking, settling and truncating find nothing and make nothing.
        assert!(m.get(5).is_none());
        assert!(!m.is_cached(5));
        assert!(!m.settle(5));
        assert!(!m.truncate_one(5));
        assert!(m.take_dirty().is_empty());
        assert!(m.truncate(0).is_empty());
        assert_eq!(m.evict_clean(10), 0);
        assert_eq!(m.dirty_unmapped(|_| false), 0);
        assert!(m.shards.get().is_none(), "no page, no shards");
        w(&m, 5, 0, b"x");
        assert!(m.shards.get().is_some());
        assert_eq!(m.get(5).expect("cached")[0], b'x');
        assert_eq!(m.take_dirty().len(), 1);
    }

    #[test]
    fn copy_on_write_keeps_snapshots_stable() {
        let stats = Arc::new(CacheStats::default());
        let m = PageMap::new(stats.clone());
        w(&m, 3, 10, b"hello");
        let snap = m.take_dirty();
        assert_eq!(snap.len(), 1);
        assert_eq!(m.dirty_count(), 0);
        w(&m, 3, 10, b"HELLO");
        assert_eq!(&snap[0].1[10..15], b"hello", "snapshot must not see the later write");
        assert_eq!(&m.get(3).unwrap()[10..15], b"HELLO");
        assert_eq!(m.dirty_count(), 1);
        assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 1);
        m.truncate(0);
        assert_eq!(stats.cached_pages.load(Ordering::Relaxed), 0);
        assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn partial_write_needs_a_base_and_full_write_does_not() {
        let m = PageMap::new(Arc::default());
        assert!(m.write(0, 0, &[1u8; PAGE_SIZE], None), "a full page needs no base");
        assert!(!m.write(1, 5, b"x", None), "a partial page that is not cached needs its base");
        assert!(m.get(1).is_none(), "a refused write changes nothing");
        assert_eq!(m.dirty_count(), 1);
        assert!(m.write(1, 5, b"x", Some(&[7u8; PAGE_SIZE])));
        let p = m.get(1).unwrap();
        assert_eq!((p[4], p[5], p[6]), (7, b'x', 7));
        // Cached now: a later partial write needs no base, and a base given is ignored.
        assert!(m.write(1, 6, b"y", None));
        assert!(m.write(1, 7, b"z", Some(&[9u8; PAGE_SIZE])));
        let p = m.get(1).unwrap();
        assert_eq!(&p[4..9], &[7, b'x', b'y', b'z', 7]);
    }

    impl PageMap {
        fn check(&self) {
            let mask = self.dirty_shards.load(Ordering::Acquire);
            for (i, s) in self.all().iter().enumerate() {
                let s = s.lock();
                s.check();
                assert!(
                    s.dirty.is_empty() || mask & (1 << i) != 0,
                    "shard {i} lists dirty pages but is not marked"
                );
            }
        }
    }

    #[test]
    fn dirty_list_tracks_writes_takes_truncates_and_restores() {
        let m = Arc::new(PageMap::new(Arc::default()));
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    let mut rng = crate::rng::Rng::new(t * 7919 + 1);
                    for _ in 0..3000 {
                        let x = rng.next_u64();
                        let idx = (x >> 33) % 200;
                        match (x >> 20) % 11 {
                            10 => {
                                // An fsync that logged its pages inline in the region.
                                let taken = m.take_unsynced();
                                m.settle_logged(&taken);
                            }
                            0 => {
                                let taken = m.take_dirty();
                                assert!(taken.windows(2).all(|w| w[0].0 < w[1].0), "index order, each once");
                                if x & (1 << 40) == 0 {
                                    m.restore_dirty(&taken);
                                } else {
                                    taken.iter().for_each(|(i, _)| {
                                        m.settle(*i);
                                    });
                                }
                            }
                            1 => drop(m.truncate(idx)),
                            2 => {
                                m.truncate_one(idx);
                            }
                            3 => w(&m, idx, 100, &[0u8; PAGE_SIZE - 100]),
                            4 => {
                                m.evict_clean(5);
                            }
                            _ => w(&m, idx, 0, &[t as u8; 8]),
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        m.check();
        let listed = m.dirty_count() + m.logged_count();
        assert_eq!(m.stats.dirty_pages.load(Ordering::Relaxed), listed as i64);
        let taken = m.take_dirty();
        assert_eq!(taken.len() as u64, listed, "the counters agree with the lists");
        assert_eq!((m.dirty_count(), m.logged_count()), (0, 0));
        assert_eq!(m.stats.dirty_pages.load(Ordering::Relaxed), 0);
        assert!(m.take_dirty().is_empty());
        m.check();
    }

    #[test]
    fn logged_pages_are_skipped_by_fsync_and_taken_by_the_checkpoint() {
        let stats = Arc::new(CacheStats::default());
        let m = PageMap::new(stats.clone());
        w(&m, 1, 0, b"a");
        w(&m, 2, 0, b"b");
        let taken = m.take_unsynced();
        assert_eq!(taken.len(), 2);
        w(&m, 2, 0, b"B");
        m.settle_logged(&taken);
        // Page 1 is logged; page 2 was written again meanwhile and stays dirty.
        assert_eq!((m.dirty_count(), m.logged_count()), (1, 1));
        assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 2);
        assert_eq!(m.evict_clean(10), 0, "a logged page is owed to the device");
        let again = m.take_unsynced();
        assert_eq!(again.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2], "fsync skips logged pages");
        m.settle_logged(&again);
        w(&m, 1, 0, b"A");
        assert_eq!((m.dirty_count(), m.logged_count()), (1, 1), "a logged page written again is dirty");
        // Page 1 is dirty and still has a stale entry in the logged list: counted once.
        assert_eq!(m.dirty_unmapped(|_| false), 2);
        assert_eq!(m.dirty_unmapped(|i| i == 2), 1);
        m.check();
        let all = m.take_dirty();
        assert_eq!(all.iter().map(|p| (p.0, p.1[0])).collect::<Vec<_>>(), vec![(1, b'A'), (2, b'B')]);
        assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 0);
        assert!(m.take_dirty().is_empty(), "stale logged entries are skipped");
    }

    #[test]
    fn truncate_hands_back_the_pages_it_drops_and_counts_them_out() {
        let stats = Arc::new(CacheStats::default());
        let m = PageMap::new(stats.clone());
        // Sixteen shards' worth of pages, dirty and clean, on both sides of the cut.
        for i in 0..64u64 {
            w(&m, i, 0, &[i as u8; 8]);
        }
        let taken = m.take_dirty();
        assert_eq!(taken.len(), 64);
        for i in (0..64u64).step_by(2) {
            m.settle(i);
        }
        m.restore_dirty(&taken.iter().filter(|(i, _)| i & 1 == 1).cloned().collect::<Vec<_>>());
        let before = stats.cached_pages.load(Ordering::Relaxed);
        let gone = m.truncate(40);
        assert_eq!(gone.len(), 24, "pages 40..64");
        assert_eq!(gone.iter().filter(|p| p.dirty).count(), 12, "the odd ones were dirty");
        let mut firsts: Vec<u8> = gone.iter().map(|p| p.data[0]).collect();
        firsts.sort_unstable();
        assert_eq!(firsts, (40..64).collect::<Vec<u8>>(), "each dropped page handed back once");
        assert_eq!(stats.cached_pages.load(Ordering::Relaxed), before - 24, "counted out at once");
        assert_eq!(m.dirty_count(), 20);
        assert!((0..40).all(|i| m.get(i).is_some()) && (40..64).all(|i| m.get(i).is_none()));
        m.check();
        let rest = m.truncate(0);
        assert_eq!(rest.len(), 40);
        assert_eq!((m.dirty_count(), stats.cached_pages.load(Ordering::Relaxed)), (0, before - 64));
        assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 0);
        m.check();
    }

    #[test]
    fn a_page_truncated_in_flight_is_not_restored() {
        let stats = Arc::new(CacheStats::default());
        let m = PageMap::new(stats.clone());
        w(&m, 0, 0, b"keep");
        w(&m, 5, 0, b"cut");
        let taken = m.take_unsynced();
        assert_eq!(taken.len(), 2);
        m.truncate(3);
        // The fsync that took them fails and gives them back.
        m.restore_dirty(&taken);
        assert!(m.get(5).is_none(), "a truncated page came back");
        assert_eq!(&m.get(0).unwrap()[..4], b"keep");
        assert_eq!(m.dirty_count(), 1);
        assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 1);
        assert_eq!(stats.cached_pages.load(Ordering::Relaxed), 1);
        m.check();
    }

    #[test]
    fn bounded_takes_leave_the_rest_dirty_or_logged() {
        let stats = Arc::new(CacheStats::default());
        let m = PageMap::new(stats.clone());
        // 40 pages over every shard: 0..20 logged, 20..40 dirty.
        for i in 0..40u64 {
            w(&m, i, 0, &[i as u8 + 1]);
        }
        let first = m.take_unsynced();
        let logged: Vec<_> = first.iter().filter(|p| p.0 < 20).cloned().collect();
        m.restore_dirty(&first.iter().filter(|p| p.0 >= 20).cloned().collect::<Vec<_>>());
        m.settle_logged(&logged);
        assert_eq!((m.dirty_count(), m.logged_count()), (20, 20));
        let mut seen = Vec::new();
        // Bounded: 40 pages, at least one per take.
        for round in 0..40 {
            let part = m.take_dirty_upto(7);
            if part.is_empty() {
                break;
            }
            assert!(part.len() <= 7, "round {round}: took {}", part.len());
            m.check();
            for (idx, buf) in &part {
                assert_eq!(buf[0], *idx as u8 + 1);
                assert!(m.settle(*idx));
            }
            seen.extend(part.into_iter().map(|p| p.0));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..40).collect::<Vec<_>>(), "every page taken exactly once");
        assert_eq!((m.dirty_count(), m.logged_count()), (0, 0));
        assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 0);
        // A page written after a bounded take left others behind is found by the next one.
        for i in 0..20u64 {
            w(&m, i, 0, b"x");
        }
        assert_eq!(m.take_dirty_upto(5).len(), 5);
        w(&m, 100, 0, b"y");
        assert_eq!(m.take_unsynced().len(), 16);
        m.check();
    }

    #[test]
    fn strided_and_neighbouring_pages_spread_over_every_shard() {
        // Threads writing their own 8 MiB (DWOM), 1 MiB or 4 KiB-apart regions of one file:
        // 16 of them use 16 shards.
        for stride in [1u64, 2, 256, 2048, 4096, 1 << 20, 1 << 33] {
            for base in [0u64, stride - 1, 48 * stride, 48 * stride + stride / 2] {
                let mut seen: Vec<usize> = (0..16).map(|x| shard_of(base + x * stride)).collect();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen.len(), 16, "stride {stride} from {base}: shards {seen:?}");
            }
        }
        assert!((0..1u64 << 16).all(|i| shard_of(i) < SHARDS));
        // The dirty mask follows the shard, not the index.
        let m = PageMap::new(Arc::default());
        for x in 0..16u64 {
            w(&m, x * 2048, 0, b"t");
        }
        assert_eq!(m.dirty_shards.load(Ordering::Acquire), 0xffff);
        assert_eq!(
            m.take_unsynced().iter().map(|p| p.0).collect::<Vec<_>>(),
            (0..16).map(|x| x * 2048).collect::<Vec<_>>()
        );
        m.check();
    }

    #[test]
    fn parallel_writers_of_disjoint_pages() {
        let m = Arc::new(PageMap::new(Arc::default()));
        let hs: Vec<_> = (0..8u64)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..500u64 {
                        let idx = i * 8 + t;
                        w(&m, idx, 0, &[t as u8 + 1; PAGE_SIZE]);
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(m.dirty_count(), 4000);
        for idx in 0..4000u64 {
            assert_eq!(m.get(idx).unwrap()[100], (idx % 8) as u8 + 1);
        }
        assert_eq!(m.evict_clean(10), 0, "dirty pages are never evicted");
        let taken = m.take_dirty();
        assert_eq!(m.evict_clean(10), 0, "pages in flight are never evicted");
        for (idx, _) in &taken {
            assert!(m.settle(*idx));
        }
        assert_eq!(m.evict_clean(10), 10);
        m.truncate(0);
        assert!(!m.settle(5), "a truncated page is gone");
    }
}
