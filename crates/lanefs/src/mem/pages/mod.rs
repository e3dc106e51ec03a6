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

/// One page's bytes (a block's: `device::BlockData`, cache-line aligned for the copies in and
/// out of the cache).
pub use crate::device::BlockData as PageData;

/// One cached page's bytes, shared copy-on-write.
pub type PageBuf = Arc<PageData>;

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
        // Only a write that may add a page makes the shards; one that only updates a cached
        // page finds none to update in a file with no shards yet.
        let lock = if full || base.is_some() {
            self.shard(idx)
        } else {
            match self.cached_shard(idx) {
                Some(s) => s,
                None => return false,
            }
        };
        let mut guard = lock.lock();
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
                v.insert(Page::new(Arc::new(PageData(base)), false))
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
            Page::new(Arc::new(PageData(data)), false)
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
mod tests;
