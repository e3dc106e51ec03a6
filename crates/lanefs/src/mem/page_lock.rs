//! Page-level entry past a file's range lock: single-page reads and writes that share no cache
//! line when they touch different pages.
//!
//! A [`RangeLock`](super::range_lock::RangeLock) keeps its requests in one list behind one mutex,
//! so every read and write of a file writes that mutex's line twice, and threads on disjoint
//! pages of one file meet there. [`PageLocks`] lets a request that lies within one page skip the
//! list: it takes a reader-writer word in a striped array of per-slot words (a page's slot is a
//! fold of its index, `slot_of`), each on its own cache line. Everything else (multi-page
//! requests, truncate, fallocate, punch, flag changes) still queues in the range lock, and first
//! *announces* itself in `slow`; page-level entry is open only while `slow` is zero, so a range
//! request waits only for the page holders that got in before its announcement, and only for
//! those of its own pages ([`drain`](PageLocks::drain)).
//!
//! Invariants:
//! - A page-level holder of page `p` in mode `m` excludes exactly what a range request over the
//!   whole page in mode `m` would: writers of a page exclude every other holder of its slot,
//!   readers share it; an announced range request, once drained, finds no conflicting page
//!   holder in its pages. (Coarser than the range lock: a holder owns its whole page, and pages
//!   that share a slot exclude each other too. Neither breaks a guarantee; both only wait.)
//! - `slow` counts announced range requests, plus one until page-level entry is enabled. While
//!   it is nonzero no page-level entry succeeds, so a drain ends: the holders it waits for only
//!   leave.
//! - A slot word is `WRITER` (one writer) or a count of readers (no writer), never both. A
//!   holder releases exactly the slot it took.
//! - The common path (page-level entry and exit, `slow` zero) writes only its own slot's line;
//!   `slow`, the slot pointer and the wait mutex sit on a line of their own (boxed, padded)
//!   that it only reads.
//! - No waiter is lost: a holder's exit that sees `slow` nonzero takes the wait mutex and
//!   notifies, and a drainer checks the slots under that mutex before it sleeps.
//! - Nothing here spins unboundedly: a page entrant that finds its slot busy retries a few times
//!   and then falls back to the range lock (which parks); a drainer re-checks a few times and
//!   then sleeps on the condition variable. 4 or 8 threads on 2 cores do not burn the core a
//!   holder needs.
//!
//! Memory ordering is the Dekker handshake of the pass-through semaphore (`sync::pass_sem`):
//!
//! ```text
//!   page entry / exit                        range request
//!   slot CAS (enter) / RMW (exit)  (SeqCst)  slow += 1                   (SeqCst)
//!   read slow                      (SeqCst)  read the slots of its pages (SeqCst)
//! ```
//!
//! Either the entrant sees the announcement (and backs out) or the request sees the entrant's
//! slot (and waits for it); likewise on exit, either the holder sees `slow` (and notifies under
//! the mutex) or the drainer sees the release. A release is a release-RMW and a drainer's read
//! an acquire, so what a holder wrote in its page is visible to the range request after it, and
//! a retired announcement is a release that a later entrant's read of `slow` acquires.
//!
//! Enabling is lazy, so that the 8 KiB of slots exist only for files used enough to matter
//! (the range lock enables after a few dozen requests): `slow` starts at one, and
//! [`enable`](PageLocks::enable) publishes the slots first and then takes that one away. An
//! entrant that reads `slow == 0` therefore sees the slots; a drainer that finds no slots
//! announced itself while `slow` still held the one (else its RMW would have read the
//! decrement, which is ordered after the publication), so no page holder can exist until it
//! retires.
//!
//! Under `cfg(loom)` in this crate's tests the same code runs on loom's primitives for the model
//! below (`loom_model`), with 4 slots; as in `sync::pass_sem`, loom models SeqCst accesses only
//! as acquire/release, so explicit SeqCst fences stand between the two accesses of each side.

#[cfg(all(loom, test))]
use loom::sync::{
    atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst},
    Condvar, Mutex, MutexGuard,
};
#[cfg(not(all(loom, test)))]
use std::sync::{
    atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst},
    Condvar, Mutex, MutexGuard,
};

use crossbeam::utils::CachePadded;
use std::sync::PoisonError;

// The wait uses std's Mutex/Condvar rather than the ranked parking_lot wrappers: loom mirrors
// std's API, so one code path is both run and model-checked. The mutex is a leaf, held only to
// check the slots or to notify, never while waiting for anything else; the range lock's
// `Rank::Range` record covers the whole primitive in the lock hierarchy.

/// Slots as a power of two. 64 slots on their own 128-byte lines: 8 KiB per enabled file. In the
/// model, 4 keep the state space small while pages still share and miss slots.
#[cfg(not(all(loom, test)))]
const SLOT_BITS: u32 = 6;
#[cfg(all(loom, test))]
const SLOT_BITS: u32 = 2;
const SLOTS: usize = 1 << SLOT_BITS;

/// A slot held by a writer; otherwise the word counts readers.
const WRITER: u32 = 1 << 31;

/// How often an entrant re-reads a busy slot before it gives up and takes the range lock. A
/// holder keeps its page for one page copy (well under a microsecond), so a short spin usually
/// saves the fallback; a holder that is descheduled costs the spinner only this much.
#[cfg(not(all(loom, test)))]
const ENTRY_SPINS: u32 = 32;
#[cfg(all(loom, test))]
const ENTRY_SPINS: u32 = 1;

/// How often a drainer re-checks before it sleeps (see `ENTRY_SPINS`).
#[cfg(not(all(loom, test)))]
const DRAIN_SPINS: u32 = 64;
#[cfg(all(loom, test))]
const DRAIN_SPINS: u32 = 1;

/// The slot of page `idx`: the XOR of its index's `SLOT_BITS`-bit chunks. As with the page map's
/// shards (`mem::pages::shard_of`), pages `b + x * 2^k` for `x` in `0..SLOTS` (`b` aligned
/// above them) land in distinct slots: the fold is linear, and it maps `x << k` to `x`'s bits
/// rotated, a bijection. So neighbouring pages, and threads whose regions start at multiples of
/// a power of two (FxMark's DWOM and DRBM: page 2048 x), never share a slot.
#[inline]
pub(crate) fn slot_of(idx: u64) -> usize {
    let mut x = idx;
    let mut s = 0u64;
    while x != 0 {
        s ^= x & (SLOTS as u64 - 1);
        x >>= SLOT_BITS;
    }
    s as usize
}

/// Whether a slot word lets a request in `exclusive` (or shared) mode proceed.
#[inline]
fn compatible(word: u32, exclusive: bool) -> bool {
    if exclusive {
        word == 0
    } else {
        word & WRITER == 0
    }
}

/// See the module documentation: restores SeqCst-access semantics under loom; a no-op otherwise.
#[inline(always)]
fn store_load_fence() {
    #[cfg(all(loom, test))]
    loom::sync::atomic::fence(SeqCst);
}

type Slots = Box<[CachePadded<AtomicU32>]>;

fn new_slots() -> Slots {
    (0..SLOTS).map(|_| CachePadded::new(AtomicU32::new(0))).collect()
}

/// The slots, allocated once. std's `OnceLock` in the engine; in the model a flag in front of
/// eagerly allocated slots, which has the same publish/observe semantics and is visible to loom.
#[cfg(not(all(loom, test)))]
struct LazySlots(std::sync::OnceLock<Slots>);
#[cfg(not(all(loom, test)))]
impl LazySlots {
    fn new() -> Self {
        LazySlots(std::sync::OnceLock::new())
    }
    #[inline]
    fn get(&self) -> Option<&Slots> {
        self.0.get()
    }
    /// True for the one call that published the slots.
    fn publish(&self) -> bool {
        self.0.get().is_none() && self.0.set(new_slots()).is_ok()
    }
}
#[cfg(all(loom, test))]
struct LazySlots {
    ready: AtomicBool,
    slots: Slots,
}
#[cfg(all(loom, test))]
impl LazySlots {
    fn new() -> Self {
        LazySlots { ready: AtomicBool::new(false), slots: new_slots() }
    }
    fn get(&self) -> Option<&Slots> {
        self.ready.load(SeqCst).then_some(&self.slots)
    }
    fn publish(&self) -> bool {
        !self.ready.swap(true, SeqCst)
    }
}

/// What the slow path shares, on one line that the common path only reads.
struct Shared {
    /// Announced range requests, plus one until [`PageLocks::enable`].
    slow: AtomicUsize,
    slots: LazySlots,
    wait: Mutex<()>,
    /// Drainers sleep here until a holder of one of their pages leaves.
    drained: Condvar,
}

/// Page-level reader-writer entry for one file, and the drain that lets a range request
/// exclude it (see the module documentation).
pub struct PageLocks {
    /// Boxed: padded to a line of its own wherever the file's other fields lie, without
    /// making every mnode as large and as aligned as a padded line (128 bytes).
    shared: Box<CachePadded<Shared>>,
}

/// Why [`PageLocks::try_enter`] did not let a request in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A range request is announced, or page-level entry is not enabled yet.
    Slow,
    /// Another page-level holder kept the slot through every retry: a wait (for the census).
    Busy,
}

/// A page-level hold: the slot taken and how. Given back to [`PageLocks::exit`].
#[derive(Debug)]
pub struct PageHold {
    slot: usize,
    exclusive: bool,
}

impl Default for PageLocks {
    fn default() -> Self {
        Self::new()
    }
}

impl PageLocks {
    /// Page-level entry disabled (no slots allocated) until [`enable`](Self::enable).
    pub fn new() -> Self {
        PageLocks {
            shared: Box::new(CachePadded::new(Shared {
                slow: AtomicUsize::new(1),
                slots: LazySlots::new(),
                wait: Mutex::new(()),
                drained: Condvar::new(),
            })),
        }
    }

    /// Allocates the slots and opens page-level entry (idempotent).
    pub fn enable(&self) {
        if self.shared.slots.publish() {
            // After the publication: whoever reads `slow` without the enabling one sees slots.
            self.shared.slow.fetch_sub(1, SeqCst);
        }
    }

    /// Whether page-level entry has been enabled.
    pub fn enabled(&self) -> bool {
        self.shared.slots.get().is_some()
    }

    /// Enters page `idx` (shared unless `exclusive`), unless a range request is announced or
    /// the slot stays busy through a few retries. Never blocks.
    #[inline]
    pub fn try_enter(&self, idx: u64, exclusive: bool) -> Result<PageHold, Refused> {
        let sh = &*self.shared;
        if sh.slow.load(SeqCst) != 0 {
            return Err(Refused::Slow);
        }
        let Some(slots) = sh.slots.get() else {
            // `slow` reached zero only after the slots were published (module documentation).
            debug_assert!(false, "page-level entry open without slots");
            return Err(Refused::Slow);
        };
        let slot = slot_of(idx);
        let word = &slots[slot];
        let mut spins = 0;
        loop {
            let cur = word.load(SeqCst);
            if compatible(cur, exclusive) {
                let new = if exclusive { WRITER } else { cur + 1 };
                debug_assert!(exclusive || new & WRITER == 0, "reader count overflow");
                if word.compare_exchange(cur, new, SeqCst, SeqCst).is_ok() {
                    break;
                }
            }
            spins += 1;
            if spins > ENTRY_SPINS {
                return Err(Refused::Busy);
            }
            std::hint::spin_loop();
            if sh.slow.load(SeqCst) != 0 {
                return Err(Refused::Slow);
            }
        }
        store_load_fence();
        let hold = PageHold { slot, exclusive };
        if sh.slow.load(SeqCst) != 0 {
            // A range request announced itself meanwhile and may have counted us: leave through
            // the normal exit, so that it is woken if it already sleeps.
            self.exit(hold);
            return Err(Refused::Slow);
        }
        Ok(hold)
    }

    /// Leaves the slot `hold` took; wakes drainers if a range request is announced.
    #[inline]
    pub fn exit(&self, hold: PageHold) {
        let sh = &*self.shared;
        let slots = sh.slots.get().expect("a hold implies slots");
        let word = &slots[hold.slot];
        let before = if hold.exclusive { word.fetch_sub(WRITER, SeqCst) } else { word.fetch_sub(1, SeqCst) };
        debug_assert!(
            if hold.exclusive { before == WRITER } else { before & WRITER == 0 && before > 0 },
            "slot {} released in the wrong state {before:#x}",
            hold.slot
        );
        store_load_fence();
        if sh.slow.load(SeqCst) != 0 {
            // Taking the mutex orders our release before the drainer's next check under it, so
            // the notification cannot fall between its check and its sleep.
            let _g = self.lock();
            sh.drained.notify_all();
        }
    }

    /// Announces a range request: from now until [`retire`](Self::retire) no page-level entry
    /// succeeds. Call before [`drain`](Self::drain).
    pub fn announce(&self) {
        self.shared.slow.fetch_add(1, SeqCst);
        store_load_fence();
    }

    /// Ends one announcement.
    pub fn retire(&self) {
        let before = self.shared.slow.fetch_sub(1, SeqCst);
        debug_assert!(before > 0, "retire without announce");
    }

    /// True when no page-level holder of pages `first..=last` conflicts with a request in
    /// `exclusive` (or shared) mode. Meaningful only while announced: then it stays true.
    pub fn is_drained(&self, first: u64, last: u64, exclusive: bool) -> bool {
        debug_assert!(first <= last);
        let Some(slots) = self.shared.slots.get() else { return true };
        if last - first >= SLOTS as u64 - 1 {
            return slots.iter().all(|w| compatible(w.load(SeqCst), exclusive));
        }
        (first..=last).all(|i| compatible(slots[slot_of(i)].load(SeqCst), exclusive))
    }

    /// Waits (announced) until no page-level holder of pages `first..=last` conflicts with a
    /// request in `exclusive` (or shared) mode. Returns whether it had to wait.
    pub fn drain(&self, first: u64, last: u64, exclusive: bool) -> bool {
        debug_assert!(self.shared.slow.load(SeqCst) > 0, "drain without announce");
        for _ in 0..DRAIN_SPINS {
            if self.is_drained(first, last, exclusive) {
                return false;
            }
            std::hint::spin_loop();
        }
        let mut g = self.lock();
        // Each wake-up follows a holder's exit; no holder can enter while we are announced, so
        // this ends after at most as many wake-ups as there were holders.
        while !self.is_drained(first, last, exclusive) {
            g = self.shared.drained.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        true
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        // Nothing under this mutex can panic; a poisoned one still guards nothing broken.
        self.shared.wait.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for PageLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageLocks")
            .field("slow", &self.shared.slow.load(SeqCst))
            .field("enabled", &self.enabled())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn regions_at_powers_of_two_use_distinct_slots() {
        for k in [0u32, 3, 11, 20, 40] {
            let base = 7u64 << (k + SLOT_BITS);
            let mut seen = [false; SLOTS];
            for x in 0..SLOTS as u64 {
                let s = slot_of(base + (x << k));
                assert!(!seen[s], "k={k}: slot {s} twice");
                seen[s] = true;
            }
        }
        // DWOM's 8 threads: page 2048 t.
        let mut slots: Vec<usize> = (0..8).map(|t| slot_of(2048 * t)).collect();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), 8);
    }

    #[test]
    fn disabled_until_enabled() {
        let p = PageLocks::new();
        assert_eq!(p.try_enter(3, true).unwrap_err(), Refused::Slow);
        assert!(!p.enabled());
        p.enable();
        p.enable();
        assert!(p.enabled());
        let h = p.try_enter(3, true).unwrap();
        p.exit(h);
    }

    #[test]
    fn page_modes() {
        let p = PageLocks::new();
        p.enable();
        let r1 = p.try_enter(5, false).unwrap();
        let r2 = p.try_enter(5, false).unwrap();
        assert_eq!(p.try_enter(5, true).unwrap_err(), Refused::Busy, "writer beside readers");
        let w = p.try_enter(6, true).unwrap();
        assert_eq!(p.try_enter(6, false).unwrap_err(), Refused::Busy, "reader beside a writer");
        assert_eq!(p.try_enter(6, true).unwrap_err(), Refused::Busy, "two writers");
        // A range request: no entry while announced; drained per mode and pages.
        p.announce();
        assert_eq!(p.try_enter(100, false).unwrap_err(), Refused::Slow);
        assert!(p.is_drained(5, 5, false), "readers do not conflict with a shared request");
        assert!(!p.is_drained(5, 5, true));
        assert!(!p.is_drained(6, 6, false));
        assert!(p.is_drained(7, 7, true));
        assert!(!p.is_drained(0, u64::MAX / 4096, true));
        p.exit(r1);
        p.exit(r2);
        assert!(p.is_drained(5, 5, true));
        p.exit(w);
        assert!(p.is_drained(0, u64::MAX / 4096, true));
        p.retire();
        p.exit(p.try_enter(6, true).unwrap());
    }

    /// A drainer sleeps until the holders of its pages leave, and only those.
    #[test]
    fn drain_waits_for_holders_of_its_pages() {
        let p = Arc::new(PageLocks::new());
        p.enable();
        let a = p.try_enter(1, true).unwrap();
        let b = p.try_enter(2, false).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (p, done) = (p.clone(), done.clone());
            std::thread::spawn(move || {
                p.announce();
                let waited = p.drain(0, 1, true);
                done.store(true, Ordering::SeqCst);
                p.retire();
                waited
            })
        };
        while p.shared.slow.load(SeqCst) == 0 {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!done.load(Ordering::SeqCst), "drained while page 1 is held");
        p.exit(b);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!done.load(Ordering::SeqCst), "page 2 let it through but page 1 is held");
        p.exit(a);
        assert!(t.join().unwrap(), "it waited");
        assert!(done.load(Ordering::SeqCst));
    }

    /// 8 threads: page holders and range requests (serialised among themselves by a mutex,
    /// standing in for the range lock's queue) never overlap in a conflicting way.
    #[test]
    fn stress_pages_against_ranges() {
        const THREADS: u64 = 8;
        const ITERS: u64 = 20_000;
        let p = Arc::new(PageLocks::new());
        let queue = Arc::new(std::sync::Mutex::new(()));
        // Per page: writers inside (high bit) and readers inside.
        let inside: Arc<Vec<AtomicUsize>> = Arc::new((0..16).map(|_| AtomicUsize::new(0)).collect());
        let start = Arc::new(std::sync::Barrier::new(THREADS as usize));
        let ts: Vec<_> = (0..THREADS)
            .map(|t| {
                let (p, queue, inside, start) = (p.clone(), queue.clone(), inside.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                    let mut fast = 0u64;
                    for i in 0..ITERS {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if i == 100 && t == 0 {
                            p.enable();
                        }
                        let page = x % 16;
                        let excl = x & 64 == 0;
                        let mark = if excl { 1usize << 20 } else { 1 };
                        let enter = |page: u64| {
                            let prev = inside[page as usize].fetch_add(mark, Ordering::SeqCst);
                            assert!(
                                prev == 0 || (!excl && prev < 1 << 20),
                                "conflict on page {page}: {prev:#x}"
                            );
                        };
                        let leave = |page: u64| {
                            inside[page as usize].fetch_sub(mark, Ordering::SeqCst);
                        };
                        if !x.is_multiple_of(5) {
                            if let Ok(h) = p.try_enter(page, excl) {
                                fast += 1;
                                enter(page);
                                // Stay a while at times, so that range requests announce while
                                // page holders are inside (the case the drain exists for).
                                if x.is_multiple_of(4) {
                                    std::thread::yield_now();
                                }
                                leave(page);
                                p.exit(h);
                                continue;
                            }
                        }
                        // Range request over one page or several.
                        let last = if x.is_multiple_of(3) { 15 } else { page };
                        p.announce();
                        let q = queue.lock().unwrap();
                        p.drain(page, last, excl);
                        for pg in page..=last {
                            enter(pg);
                        }
                        std::hint::spin_loop();
                        for pg in page..=last {
                            leave(pg);
                        }
                        drop(q);
                        p.retire();
                    }
                    fast
                })
            })
            .collect();
        let fast: u64 = ts.into_iter().map(|t| t.join().unwrap()).sum();
        // How many went page-level depends on the interleaving; that a quiet file's does not.
        eprintln!("page-level holds: {fast}");
        p.exit(p.try_enter(0, true).expect("page-level entry on a quiet file"));
        assert!(inside.iter().all(|c| c.load(Ordering::SeqCst) == 0));
        assert_eq!(p.shared.slow.load(SeqCst), 0);
    }
}

/// Model check with loom: run with
/// `RUSTFLAGS="--cfg loom" cargo test -p lanefs --lib page_lock --release`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use loom::sync::{Arc, Mutex};
    use loom::thread;

    /// What the threads of one model share: the primitive, a count of who is inside page 3's
    /// bytes, and a mutex standing in for the range lock's queue (range requests exclude each
    /// other there).
    struct World {
        p: PageLocks,
        inside: AtomicUsize,
        queue: Mutex<()>,
    }

    fn world(enabled: bool) -> Arc<World> {
        let w = World { p: PageLocks::new(), inside: AtomicUsize::new(0), queue: Mutex::new(()) };
        if enabled {
            w.p.enable();
        }
        Arc::new(w)
    }

    use crate::sync::loom_check::model;

    /// An exclusive range request as the range lock makes one: announce, queue, drain its
    /// pages, run, leave the queue, retire.
    fn range_request(w: &World, first: u64, last: u64) {
        w.p.announce();
        let q = w.queue.lock().unwrap();
        w.p.drain(first, last, true);
        assert_eq!(w.inside.fetch_add(1, SeqCst), 0, "range request beside a page writer");
        w.inside.fetch_sub(1, SeqCst);
        drop(q);
        w.p.retire();
    }

    /// A writer of page 3 as the engine makes one: page-level, or a range request over its page
    /// when refused.
    fn page_writer(w: &World) {
        match w.p.try_enter(3, true) {
            Ok(h) => {
                assert_eq!(w.inside.fetch_add(1, SeqCst), 0, "page writer beside another holder");
                w.inside.fetch_sub(1, SeqCst);
                w.p.exit(h);
            }
            Err(_) => range_request(w, 3, 3),
        }
    }

    /// A page writer against an exclusive range request over everything: never both inside,
    /// and no lost wake-up (loom reports a deadlock if the drainer sleeps forever).
    #[test]
    fn page_writer_and_range_request() {
        model(|| {
            let w = world(true);
            let t = {
                let w = w.clone();
                thread::spawn(move || page_writer(&w))
            };
            range_request(&w, 0, u64::MAX / 4096);
            t.join().unwrap();
            assert!(w.p.is_drained(0, u64::MAX / 4096, true));
        });
    }

    /// Enabling races with a page writer and a range request of its page: the writer either
    /// finds entry closed or the request sees it.
    #[test]
    fn enable_races_with_entry_and_drain() {
        model(|| {
            let w = world(false);
            let e = {
                let w = w.clone();
                thread::spawn(move || w.p.enable())
            };
            let t = {
                let w = w.clone();
                thread::spawn(move || page_writer(&w))
            };
            range_request(&w, 3, 3);
            e.join().unwrap();
            t.join().unwrap();
        });
    }

    /// Two writers of one page and a range request of a neighbouring range that includes it:
    /// pairwise exclusion, and every drainer is woken.
    #[test]
    fn two_page_writers_and_a_range() {
        model(|| {
            let w = world(true);
            let ts: Vec<_> = (0..2)
                .map(|_| {
                    let w = w.clone();
                    thread::spawn(move || page_writer(&w))
                })
                .collect();
            range_request(&w, 2, 4);
            for t in ts {
                t.join().unwrap();
            }
            assert_eq!(w.inside.load(SeqCst), 0);
            assert!(w.p.is_drained(0, 3, true));
        });
    }
}
