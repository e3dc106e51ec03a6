//! Inode generation numbers: what tells a reused inode number from the inode that had it before.
//!
//! Job. A file handle (NFS export, `open_by_handle_at`, FUSE's `FUSE_EXPORT_SUPPORT`) names an
//! inode by (number, generation). Inode numbers are NAT node ids, which are handed out again
//! once freed, so every new inode gets a generation no earlier inode of the image had; a handle
//! to a removed file then finds a different generation (ESTALE), never the new file.
//!
//! Source. One 64-bit counter per image: the checkpoint records it, recovery starts past every
//! generation it replays, and an inode's generation is the counter's low 32 bits (what the
//! on-disk inode and the kernel's handles hold). 0 is never handed out: the root and inodes of
//! images made before the counter existed have generation 0.
//!
//! Invariants:
//! - Every value handed out is below [`Generations::persist_value`] read at any later time, so a
//!   checkpoint that records it (or recovery, which replays the creates) never goes back. An
//!   inode number is free again only after the checkpoint that records its inode gone, and that
//!   checkpoint's counter is past the inode's generation: a reused number always comes with a
//!   new generation.
//! - A value is handed out at most once per mount: each CPU slot owns a batch of
//!   [`BATCH`] values taken from the counter by one `fetch_add`, and claims one value of it at a
//!   time by compare-and-swap, so creates on different cores do not meet on one cache line.
//!
//! Not covered: an inode a crash loses (created after the last checkpoint and never journaled)
//! leaves no trace, so after recovery its number and generation may be handed out together
//! again; a handle to it, taken before the crash, would then open the new file. ext4, whose
//! counter starts at a random value at each mount, has the same window, only less likely.

use crate::sync::PerCpu;
use std::sync::atomic::{AtomicU64, Ordering};

/// Values a CPU slot takes from the counter at once (a power of two: batches are aligned).
pub const BATCH: u64 = 64;

/// The generation an inode created from counter value `v` gets (its low 32 bits).
pub fn of_counter(v: u64) -> u32 {
    v as u32
}

/// The counter value whose generation is `g`, for a value handed out near `base` (a recorded
/// counter): the one within 2^31 of it. Recovery lifts the generations the journals hold this
/// way; fewer than 2^31 inodes are created between two checkpoints.
pub fn lift(g: u32, base: u64) -> u64 {
    let low = base.saturating_sub(1 << 31);
    let cand = (low & !0xFFFF_FFFF) | g as u64;
    if cand < low {
        cand.saturating_add(1 << 32)
    } else {
        cand
    }
}

/// The image's generation counter and the per-CPU batches taken from it.
pub struct Generations {
    /// Start of the next batch; always a multiple of [`BATCH`].
    next: AtomicU64,
    /// Per CPU slot: the next value of its batch, or a multiple of [`BATCH`] when the batch is
    /// used up (0 before the first one).
    slots: PerCpu<AtomicU64>,
}

impl Generations {
    /// A counter whose first value is at least `floor` (and never 0).
    pub fn new(floor: u64) -> Generations {
        let start = floor.max(1).div_ceil(BATCH).saturating_mul(BATCH);
        Generations { next: AtomicU64::new(start), slots: PerCpu::new(|_| AtomicU64::new(0)) }
    }

    /// A generation no inode of the image has had: never 0.
    pub fn take(&self) -> u32 {
        // Bounded: a round fails only when another thread on the same slot took its value or
        // installed a batch meanwhile; a value whose low 32 bits are 0 is skipped (once every
        // 2^32 values).
        loop {
            let slot = self.slots.current();
            let v = slot.load(Ordering::Acquire);
            let got = if !v.is_multiple_of(BATCH) {
                slot.compare_exchange(v, v + 1, Ordering::AcqRel, Ordering::Acquire).ok()
            } else {
                let b = self.next.fetch_add(BATCH, Ordering::AcqRel);
                debug_assert!(b.is_multiple_of(BATCH), "batches are aligned");
                // If another thread installed a batch first, this one's remaining values are
                // simply never used.
                let _ = slot.compare_exchange(v, b + 1, Ordering::AcqRel, Ordering::Acquire);
                Some(b)
            };
            if let Some(v) = got.filter(|&v| of_counter(v) != 0) {
                return of_counter(v);
            }
        }
    }

    /// What a checkpoint records: above every value handed out so far.
    pub fn persist_value(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn values_are_unique_nonzero_and_below_what_is_persisted() {
        let g = Arc::new(Generations::new(0));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let g = g.clone();
                std::thread::spawn(move || (0..5000).map(|_| g.take()).collect::<Vec<u32>>())
            })
            .collect();
        let all: Vec<u32> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        let set: HashSet<u32> = all.iter().copied().collect();
        assert_eq!(set.len(), all.len(), "a generation was handed out twice");
        assert!(!set.contains(&0));
        let max = *all.iter().max().unwrap() as u64;
        assert!(max < g.persist_value());
        // A later mount that starts from the recorded value never repeats one.
        let again = Generations::new(g.persist_value());
        assert!((0..1000).map(|_| again.take()).all(|v| v as u64 > max));
    }

    #[test]
    fn lift_finds_the_counter_value_near_the_base() {
        assert_eq!(lift(5, 1), 5);
        assert_eq!(lift(5, 0), 5);
        assert_eq!(lift(7, (3 << 32) + 100), (3 << 32) + 7);
        // Handed out from a batch taken just before the checkpoint read the counter.
        assert_eq!(lift(u32::MAX - 3, 3 << 32), (3 << 32) - 4);
        // After the checkpoint, past a wrap of the low bits.
        assert_eq!(lift(2, (4 << 32) - 10), (4 << 32) + 2);
    }

    #[test]
    fn zero_is_skipped_when_the_low_bits_wrap() {
        let g = Generations::new(1 << 32);
        assert_eq!(g.take(), 1);
    }
}
