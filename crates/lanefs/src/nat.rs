//! The in-memory NAT: node id -> (block address, owning inode), with pin-point dirty tracking
//! and the node id allocator.
//!
//! Job. Every node write ends in one [`NatTable::set`]; every checkpoint writes only the NAT
//! blocks that changed since the previous one ([`NatTable::take_dirty_blocks`]), never the
//! whole table (pin-point NAT update, SYSTOR'19). Node ids come from per-CPU caches refilled
//! 64 at a time by one global scanner, so creating files on different cores does not meet on a
//! shared counter or lock in the common case.
//!
//! Storage. One lazily created array of 510 atomic 8-byte words per NAT block: a block the
//! checkpoint never wrote holds only free entries and costs no memory until it is touched.
//! `get` and `set` on different nids share no lock at all (one atomic load or swap), and a
//! dirty NAT block is one bit in an atomic bitmap.
//!
//! Each word is in one of four states:
//!
//! ```text
//!   FREE (0) --scanner--> RESERVED --set(valid)--> valid entry --free_nid--> FREED
//!      ^                      |                                                 |
//!      |                      +----------------free_nid-------------------------+
//!      +-------- checkpoint_done (after the checkpoint that records it free) ---+
//! ```
//!
//! Invariants:
//! - Only a FREE word is ever handed out, and the scanner takes it by a compare-and-swap to
//!   RESERVED, so an id is handed out at most once until it is freed again.
//! - RESERVED and FREED are sentinels with block address 0: they read as free entries and are
//!   encoded as free entries, so they never reach the disk.
//! - A freed id becomes FREE only in the `checkpoint_done` that follows the checkpoint whose NAT
//!   recorded it free: until then the last durable checkpoint may still name the id.
//! - `valid_nodes` / `valid_inodes` always equal the number of valid words (and of valid words
//!   whose owner is the nid itself); they are updated from the value each swap replaced.

use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::layout::{Geometry, NAT_ENTRIES_PER_BLOCK};
use crate::format::{Checkpoint, NatBlock, NatEntry};
use crate::sync::rank::{Mutex, Rank};
use crossbeam::queue::SegQueue;
use crossbeam::utils::CachePadded;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Node ids a per-CPU cache takes from the global scanner at once.
pub const NID_BATCH: usize = 64;

const PER_BLOCK: usize = NAT_ENTRIES_PER_BLOCK as usize;

/// A free entry that may be handed out.
const FREE: u64 = 0;
/// Handed out by the allocator, not yet written (block address 0, owner `u32::MAX`: no valid
/// entry has address 0, and a free entry on disk has owner 0, so this never collides).
const RESERVED: u64 = (u32::MAX as u64) << 32;
/// Freed, waiting for a checkpoint before it may be handed out again.
const FREED: u64 = ((u32::MAX - 1) as u64) << 32;
// The four states are four distinct words, and both sentinels have block address 0: they read,
// and encode, as free entries (`is_valid_word`), whatever owner bits they carry.
const _: () = assert!(
    RESERVED as u32 == 0 && FREED as u32 == 0 && RESERVED != FREED && RESERVED != FREE && FREED != FREE,
    "NAT word sentinels"
);

type Words = Box<[AtomicU64; PER_BLOCK]>;

fn is_valid_word(w: u64) -> bool {
    w as u32 != 0
}

/// The entry a word stands for: sentinels read as free.
fn entry_of(w: u64) -> NatEntry {
    if is_valid_word(w) {
        NatEntry::from_word(w)
    } else {
        NatEntry::default()
    }
}

fn new_words() -> Words {
    Box::new(std::array::from_fn(|_| AtomicU64::new(FREE)))
}

/// The global free-id scanner; its mutex is taken once per [`NID_BATCH`] allocations.
struct Scanner {
    /// Next nid to examine, in `1..=max_nid`.
    cursor: u32,
    /// A full pass found no free id, and none has been released since: fail fast.
    exhausted: bool,
}

/// The node address table of a mounted image.
pub struct NatTable {
    g: Geometry,
    /// One word array per NAT block, created on first touch.
    blocks: Vec<OnceLock<Words>>,
    /// FREE words among the ids `1..=max_nid` of each NAT block, so that a refill skips full
    /// blocks: a scan costs at most one look per NAT block, not one per id. Exact, because
    /// every change to or from FREE is one atomic operation that knows the value it replaced.
    free_counts: Vec<AtomicU32>,
    /// One bit per NAT block changed since the last `take_dirty_blocks`.
    dirty: Vec<AtomicU64>,
    valid_nodes: AtomicU64,
    valid_inodes: AtomicU64,
    /// Per-CPU caches of RESERVED ids.
    caches: Vec<CachePadded<Mutex<Vec<u32>>>>,
    scanner: Mutex<Scanner>,
    /// Ids freed since the last `take_dirty_blocks` (lock-free: unlink is a common path).
    freed: SegQueue<u32>,
    /// Ids the checkpoint being written records as free; released by `checkpoint_done`.
    committing: Mutex<Vec<u32>>,
}

impl NatTable {
    /// Loads the NAT of checkpoint `cp`, with one free-id cache per available CPU.
    pub fn load(dev: &dyn BlockDevice, g: &Geometry, cp: &Checkpoint) -> Result<NatTable> {
        Self::load_with_slots(dev, g, cp, Self::default_slots())
    }

    /// One free-id cache per available CPU.
    pub fn default_slots() -> usize {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }

    /// Loads the NAT of checkpoint `cp` with `slots` per-CPU free-id caches.
    pub fn load_with_slots(
        dev: &dyn BlockDevice,
        g: &Geometry,
        cp: &Checkpoint,
        slots: usize,
    ) -> Result<NatTable> {
        let blocks = crate::checkpoint::read_nat(dev, g, cp)?;
        Ok(Self::from_blocks(g, blocks, slots, cp.next_nid))
    }

    /// A table holding `blocks` (each decoded and checked against `g`, as `read_nat` and the
    /// persistent-memory NAT give them; absent blocks are all free), with `slots` per-CPU
    /// free-id caches and the scanner at `next_nid`.
    pub fn from_blocks(
        g: &Geometry,
        blocks: std::collections::BTreeMap<u32, NatBlock>,
        slots: usize,
        next_nid: u32,
    ) -> NatTable {
        let table = NatTable::empty(g, slots, next_nid);
        let (mut nodes, mut inodes) = (0u64, 0u64);
        for (index, nb) in blocks {
            // The caller decoded the block against the geometry: index and entries are in range.
            assert!(index < g.nat_blocks && nb.entries.len() == PER_BLOCK);
            let words = new_words();
            for (slot, e) in nb.entries.iter().enumerate() {
                if !e.is_free() {
                    // Decode rejects a live entry for nid 0 or beyond max_nid.
                    let nid = index * NAT_ENTRIES_PER_BLOCK + slot as u32;
                    nodes += 1;
                    inodes += u64::from(e.ino == nid);
                    words[slot].store(e.to_word(), Ordering::Relaxed);
                    table.free_counts[index as usize].fetch_sub(1, Ordering::Relaxed);
                }
            }
            // A map yields each index once, so the slot is still empty.
            let fresh = table.blocks[index as usize].set(words).is_ok();
            debug_assert!(fresh, "NAT block {index} loaded twice");
        }
        // An inode is a node whose owner is itself; every live entry is one id of 1..=max_nid.
        debug_assert!(inodes <= nodes && nodes <= g.max_nid as u64, "{nodes} nodes, {inodes} inodes loaded");
        table.valid_nodes.store(nodes, Ordering::Relaxed);
        table.valid_inodes.store(inodes, Ordering::Relaxed);
        table
    }

    /// An all-free table (a fresh image before its root is set) with `slots` caches, whose
    /// scanner starts at `next_nid`.
    pub fn empty(g: &Geometry, slots: usize, next_nid: u32) -> NatTable {
        assert!(g.max_nid >= 1 && g.nat_blocks as u64 * PER_BLOCK as u64 > g.max_nid as u64);
        let slots = slots.clamp(1, 1024);
        let cursor = if (1..=g.max_nid).contains(&next_nid) { next_nid } else { 1 };
        let ids_in = |bi: u32| {
            let first = (bi * NAT_ENTRIES_PER_BLOCK).max(1);
            let last = (bi * NAT_ENTRIES_PER_BLOCK + NAT_ENTRIES_PER_BLOCK - 1).min(g.max_nid);
            (last + 1).saturating_sub(first)
        };
        // Every id of 1..=max_nid is counted free in exactly one block: `refill` finds them all.
        debug_assert_eq!(
            (0..g.nat_blocks).map(|bi| ids_in(bi) as u64).sum::<u64>(),
            g.max_nid as u64,
            "free ids of an empty NAT"
        );
        NatTable {
            g: *g,
            blocks: (0..g.nat_blocks).map(|_| OnceLock::new()).collect(),
            free_counts: (0..g.nat_blocks).map(|bi| AtomicU32::new(ids_in(bi))).collect(),
            dirty: (0..(g.nat_blocks as usize).div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            valid_nodes: AtomicU64::new(0),
            valid_inodes: AtomicU64::new(0),
            caches: (0..slots)
                .map(|_| CachePadded::new(Mutex::new(Rank::NatCache, Vec::with_capacity(NID_BATCH))))
                .collect(),
            scanner: Mutex::new(Rank::NatScanner, Scanner { cursor, exhausted: false }),
            freed: SegQueue::new(),
            committing: Mutex::new(Rank::NatCommitting, Vec::new()),
        }
    }

    /// The geometry the table was built for.
    pub fn geometry(&self) -> &Geometry {
        &self.g
    }

    /// Number of per-CPU caches; `alloc_nid(cpu)` uses cache `cpu % slots()`.
    pub fn slots(&self) -> usize {
        self.caches.len()
    }

    fn in_range(&self, nid: u32) -> bool {
        nid >= 1 && nid <= self.g.max_nid
    }

    /// The word of `nid`, if its block exists.
    fn word(&self, nid: u32) -> Option<&AtomicU64> {
        let (bi, slot) = NatBlock::locate(nid);
        self.blocks.get(bi as usize)?.get().map(|w| &w[slot])
    }

    /// The word of `nid`, creating its block (all free) on first touch.
    fn word_mut(&self, nid: u32) -> &AtomicU64 {
        debug_assert!(self.in_range(nid));
        let (bi, slot) = NatBlock::locate(nid);
        &self.blocks[bi as usize].get_or_init(new_words)[slot]
    }

    fn mark_dirty(&self, nid: u32) {
        // Only ids of the table change: a bit past the NAT would name a block no checkpoint has.
        debug_assert!(self.in_range(nid), "dirty mark for node id {nid}");
        let bi = (nid / NAT_ENTRIES_PER_BLOCK) as usize;
        self.dirty[bi / 64].fetch_or(1 << (bi % 64), Ordering::Release);
    }

    /// Adjusts the counters for `nid`'s word going from `old` to `new`.
    fn count(&self, nid: u32, old: u64, new: u64) {
        let inode = |w: u64| is_valid_word(w) && NatEntry::from_word(w).ino == nid;
        match (is_valid_word(old), is_valid_word(new)) {
            (false, true) => {
                self.valid_nodes.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                let before = self.valid_nodes.fetch_sub(1, Ordering::Relaxed);
                // The word replaced was valid, so it was counted: the count never wraps.
                debug_assert!(before > 0, "valid node count underflows at node {nid}");
            }
            _ => {}
        }
        match (inode(old), inode(new)) {
            (false, true) => {
                self.valid_inodes.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                let before = self.valid_inodes.fetch_sub(1, Ordering::Relaxed);
                debug_assert!(before > 0, "valid inode count underflows at inode {nid}");
            }
            _ => {}
        }
    }

    /// Where node `nid` lives; a free entry for a free, reserved or impossible id.
    pub fn get(&self, nid: u32) -> NatEntry {
        if !self.in_range(nid) {
            return NatEntry::default();
        }
        self.word(nid).map(|w| entry_of(w.load(Ordering::Acquire))).unwrap_or_default()
    }

    /// Whether `nid` is held by the allocator's caller (handed out, not yet written).
    pub fn is_reserved(&self, nid: u32) -> bool {
        self.in_range(nid) && self.word(nid).is_some_and(|w| w.load(Ordering::Acquire) == RESERVED)
    }

    /// Whether `nid` may be handed out by the allocator right now.
    pub fn is_allocatable(&self, nid: u32) -> bool {
        self.in_range(nid) && self.word(nid).is_none_or(|w| w.load(Ordering::Acquire) == FREE)
    }

    /// Records that node `nid` now lives at `e.block_addr`, owned by `e.ino`, and marks its NAT
    /// block dirty. A free `e` frees the entry but keeps the id out of circulation until
    /// [`NatTable::free_nid`] and the next checkpoint (a no-op on an id never handed out).
    pub fn set(&self, nid: u32, e: NatEntry) {
        assert!(self.in_range(nid), "node id {nid} out of 1..={}", self.g.max_nid);
        if e.is_free() {
            debug_assert_eq!(e.ino, 0, "free NAT entry with an owner");
            let w = self.word_mut(nid);
            // FREE stays FREE: there is nothing to hold back, and the scanner may be taking it.
            if let Ok(old) = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                (old != FREE && old != FREED).then_some(FREED)
            }) {
                self.count(nid, old, FREED);
                self.mark_dirty(nid);
            }
            return;
        }
        debug_assert!(self.g.in_main(e.block_addr as u64), "node {nid} at {} outside main", e.block_addr);
        debug_assert!(e.ino >= 1 && e.ino <= self.g.max_nid, "node {nid} owner {}", e.ino);
        let new = e.to_word();
        let old = self.word_mut(nid).swap(new, Ordering::AcqRel);
        if old == FREE {
            // Recovery may map an id nobody reserved.
            self.took_free(nid);
        }
        self.count(nid, old, new);
        // After the store: a checkpoint that clears this bit reads the new value (see
        // take_dirty_blocks).
        self.mark_dirty(nid);
    }

    /// Frees node id `nid`: its entry reads and encodes as free at once, and the id becomes
    /// allocatable after the next checkpoint (the one that writes the entry free) is durable
    /// and [`NatTable::checkpoint_done`] is called. Works on reserved (never written) ids too.
    pub fn free_nid(&self, nid: u32) -> Result<()> {
        if !self.in_range(nid) {
            return Err(Error::InvalidArgument(format!("node id {nid} out of 1..={}", self.g.max_nid)));
        }
        let w = self.word_mut(nid);
        match w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
            (old != FREE && old != FREED).then_some(FREED)
        }) {
            Ok(old) => {
                // A word is in one of four states: what is neither FREE nor FREED is held.
                debug_assert!(old == RESERVED || is_valid_word(old), "node id {nid}: word {old:#x}");
                if is_valid_word(old) {
                    self.count(nid, old, FREED);
                    self.mark_dirty(nid);
                }
            }
            Err(FREE) => return Err(Error::InvalidArgument(format!("node id {nid} is not allocated"))),
            // Already freed by `set`; queueing twice is harmless (release is a CAS).
            Err(_) => {}
        }
        // Queued after the word and the dirty mark: whichever checkpoint drains this entry
        // also sees the entry free in the NAT block it writes.
        self.freed.push(nid);
        Ok(())
    }

    /// Takes the specific free id `nid` (recovery replays a create that named it). Idempotent
    /// for an id already reserved.
    pub fn reserve(&self, nid: u32) -> Result<()> {
        if !self.in_range(nid) {
            return Err(Error::InvalidArgument(format!("node id {nid} out of 1..={}", self.g.max_nid)));
        }
        let w = self.word_mut(nid);
        match w.compare_exchange(FREE, RESERVED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                self.took_free(nid);
                Ok(())
            }
            Err(RESERVED) => Ok(()),
            Err(w) => {
                // A word is in one of four states: not FREE and not RESERVED is used or freed.
                debug_assert!(w == FREED || is_valid_word(w), "node id {nid}: word {w:#x}");
                Err(Error::InvalidArgument(format!("node id {nid} is in use")))
            }
        }
    }

    /// Hands out a free node id from cache `cpu % slots()`; the caller owns it until it frees
    /// it. `Error::NoSpace` when no id is free.
    pub fn alloc_nid(&self, cpu: usize) -> Result<u32> {
        let slot = cpu % self.caches.len();
        if let Some(nid) = self.caches[slot].lock().pop() {
            return Ok(self.handed_out(nid));
        }
        // Never hold two locks: the cache lock is dropped before the scanner's is taken.
        let mut batch = self.refill();
        if let Some(nid) = batch.pop() {
            let mut cache = self.caches[slot].lock();
            cache.extend(batch);
            drop(cache);
            return Ok(self.handed_out(nid));
        }
        // The scanner found nothing: other CPUs' caches may still hold reserved ids.
        for i in 1..self.caches.len() {
            if let Some(nid) = self.caches[(slot + i) % self.caches.len()].lock().pop() {
                return Ok(self.handed_out(nid));
            }
        }
        Err(Error::NoSpace)
    }

    /// A FREE word of `nid` stopped being FREE.
    fn took_free(&self, nid: u32) {
        let before = self.free_counts[(nid / NAT_ENTRIES_PER_BLOCK) as usize].fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "free count of NAT block {} underflows", nid / NAT_ENTRIES_PER_BLOCK);
    }

    fn handed_out(&self, nid: u32) -> u32 {
        debug_assert!(self.in_range(nid));
        debug_assert!(self.is_reserved(nid), "cached node id {nid} is not reserved");
        nid
    }

    /// Reserves up to [`NID_BATCH`] free ids, scanning from the cursor with wrap-around and
    /// skipping NAT blocks that hold no free id.
    fn refill(&self) -> Vec<u32> {
        let mut sc = self.scanner.lock();
        let mut out = Vec::with_capacity(NID_BATCH);
        if sc.exhausted {
            return out;
        }
        let max = self.g.max_nid;
        let mut nid = sc.cursor;
        // Bounded: each NAT block is looked at once, the one holding the cursor twice.
        'blocks: for _ in 0..=self.g.nat_blocks {
            let bi = nid / NAT_ENTRIES_PER_BLOCK;
            let block_last = (bi * NAT_ENTRIES_PER_BLOCK + NAT_ENTRIES_PER_BLOCK - 1).min(max);
            if self.free_counts[bi as usize].load(Ordering::Relaxed) > 0 {
                for n in nid..=block_last {
                    let w = self.word_mut(n);
                    if w.compare_exchange(FREE, RESERVED, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                        self.took_free(n);
                        out.push(n);
                        if out.len() == NID_BATCH {
                            nid = if n == max { 1 } else { n + 1 };
                            break 'blocks;
                        }
                    }
                }
            }
            nid = if block_last == max { 1 } else { block_last + 1 };
        }
        sc.cursor = nid;
        sc.exhausted = out.is_empty();
        // Caches pop from the end: hand ids out in ascending order.
        out.reverse();
        debug_assert!(out.len() <= NID_BATCH && (1..=max).contains(&sc.cursor));
        // Only ids of the table are handed out (a refill never scans past max_nid).
        debug_assert!(out.iter().all(|&n| self.in_range(n)), "refill past node id {max}");
        out
    }

    /// Where the next free-id search starts (the checkpoint's `next_nid`).
    pub fn next_nid_hint(&self) -> u32 {
        let c = self.scanner.lock().cursor;
        debug_assert!(self.in_range(c));
        c
    }

    /// The current contents of NAT block `index`, ready to encode (sentinels as free entries).
    pub fn nat_block(&self, index: u32) -> NatBlock {
        assert!(index < self.g.nat_blocks, "NAT block {index} out of {}", self.g.nat_blocks);
        let mut nb = NatBlock::empty(index);
        if let Some(words) = self.blocks[index as usize].get() {
            for (e, w) in nb.entries.iter_mut().zip(words.iter()) {
                *e = entry_of(w.load(Ordering::Acquire));
            }
        }
        nb
    }

    /// NAT blocks changed since the last call, in index order, and clears their marks. Call it
    /// in the checkpoint's exclusive phase: the ids freed so far are recorded free by this
    /// checkpoint and are released by the `checkpoint_done` that follows it.
    pub fn take_dirty_blocks(&self) -> Vec<NatBlock> {
        // Frees queued before this point stored their word and dirty bit first, so the bit
        // swap below picks up their blocks.
        let mut committing = self.committing.lock();
        // Bounded by the frees queued so far plus any that race in; every pop removes one.
        while let Some(nid) = self.freed.pop() {
            committing.push(nid);
        }
        drop(committing);
        let mut out = Vec::new();
        for (wi, word) in self.dirty.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let idx = (wi * 64) as u32 + b;
                out.push(self.nat_block(idx));
            }
        }
        debug_assert!(out.windows(2).all(|w| w[0].index < w[1].index));
        // A bit per NAT block, each taken once: at most every block of the table.
        debug_assert!(out.len() <= self.g.nat_blocks as usize, "{} dirty NAT blocks", out.len());
        out
    }

    /// Whether any NAT block is marked dirty.
    pub fn has_dirty(&self) -> bool {
        self.dirty.iter().any(|w| w.load(Ordering::Acquire) != 0)
    }

    /// Called once the checkpoint written after `take_dirty_blocks` is durable: the ids it
    /// recorded free become allocatable. Returns how many were released.
    pub fn checkpoint_done(&self) -> usize {
        let ids = std::mem::take(&mut *self.committing.lock());
        let mut released = 0;
        for nid in ids {
            // A CAS: an id queued twice, or set valid again by recovery, is left alone.
            let w = self.word_mut(nid);
            if w.compare_exchange(FREED, FREE, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                let before =
                    self.free_counts[(nid / NAT_ENTRIES_PER_BLOCK) as usize].fetch_add(1, Ordering::Relaxed);
                // The id was not FREE, so its block had room for one more: never past its ids.
                debug_assert!(before < NAT_ENTRIES_PER_BLOCK, "free count of NAT block of {nid} overflows");
                released += 1;
            }
        }
        if released > 0 {
            self.scanner.lock().exhausted = false;
        }
        released
    }

    /// Valid node entries (inodes, direct, indirect and xattr nodes).
    pub fn valid_nodes(&self) -> u64 {
        self.valid_nodes.load(Ordering::Relaxed)
    }

    /// Valid entries whose owner is the node itself: inodes.
    pub fn valid_inodes(&self) -> u64 {
        self.valid_inodes.load(Ordering::Relaxed)
    }

    /// Recounts every entry and compares with the counters (tests and fsck; not concurrent
    /// with writers).
    pub fn check_counters(&self) -> std::result::Result<(), String> {
        let (mut nodes, mut inodes) = (0u64, 0u64);
        for (bi, b) in self.blocks.iter().enumerate() {
            let Some(words) = b.get() else { continue };
            let mut free = 0u32;
            for (slot, w) in words.iter().enumerate() {
                let w = w.load(Ordering::Acquire);
                let nid = (bi * PER_BLOCK + slot) as u32;
                if is_valid_word(w) {
                    nodes += 1;
                    inodes += u64::from(NatEntry::from_word(w).ino == nid);
                }
                free += u32::from(w == FREE && self.in_range(nid));
            }
            let counted = self.free_counts[bi].load(Ordering::Relaxed);
            if free != counted {
                return Err(format!("NAT block {bi}: {free} free ids, counter says {counted}"));
            }
        }
        if (nodes, inodes) != (self.valid_nodes(), self.valid_inodes()) {
            return Err(format!(
                "counters say {} nodes / {} inodes, entries say {nodes} / {inodes}",
                self.valid_nodes(),
                self.valid_inodes()
            ));
        }
        Ok(())
    }
}
