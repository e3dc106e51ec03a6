//! The crash model of a region, the byte-addressable twin of `device::CrashDevice`.
//!
//! A region opened with [`super::RegionOptions::record`] keeps its content at open and a log
//! of every 8-byte word stored (with its new value) and every range persisted since. From the
//! log, [`PmemCrash`] rebuilds the state at any point: the content known to be persistent and,
//! for every word stored since the last persist of its cache line, the values it was given in
//! order. After a crash there, the region holds the persistent content plus, for any subset of
//! those words, one of the values stored since (a line can be written back by eviction at any
//! time, whole or — with 8-byte atomicity only — word by word; an aligned 8-byte store is never
//! torn). Tests write such images to a file and open them as regions.
//!
//! Recording copies the region once and takes a lock per store: it is for tests on small
//! regions, never for a mount.

use super::persist::LINE;
use std::collections::BTreeMap;

/// One word stored since its line was last persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingWord {
    /// Byte offset of the word in the region (a multiple of 8).
    pub offset: usize,
    /// The values it was given since, oldest first (consecutive repeats folded).
    pub values: Vec<u64>,
}

/// What reached the region, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionEvent {
    /// The word at `offset` now holds `value`.
    Store { offset: usize, value: u64 },
    /// Every line touching `[start, end)` was written back.
    Persist { start: usize, end: usize },
}

/// What the recorder knows.
#[derive(Debug)]
pub(super) struct Recorder {
    base: Vec<u8>,
    events: Vec<RegionEvent>,
}

impl Recorder {
    pub fn new(base: Vec<u8>) -> Recorder {
        Recorder { base, events: Vec::new() }
    }

    pub fn stored(&mut self, offset: usize, value: u64) {
        debug_assert_eq!(offset % 8, 0);
        self.events.push(RegionEvent::Store { offset, value });
    }

    pub fn persisted(&mut self, start: usize, end: usize) {
        if start < end {
            self.events.push(RegionEvent::Persist { start, end });
        }
    }

    pub fn event_count(&self) -> usize {
        self.events.len()
    }

    /// The crash states after the first `upto` events (clamped to the log).
    pub fn snapshot_at(&self, upto: usize) -> PmemCrash {
        let mut persisted = self.base.clone();
        let mut pending: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for e in &self.events[..upto.min(self.events.len())] {
            match *e {
                RegionEvent::Store { offset, value } => {
                    let v = pending.entry(offset).or_default();
                    if v.last() != Some(&value) {
                        v.push(value);
                    }
                }
                RegionEvent::Persist { start, end } => {
                    let first = start & !(LINE - 1);
                    let last = end.div_ceil(LINE) * LINE;
                    let done: Vec<usize> = pending.range(first..last).map(|(&o, _)| o).collect();
                    for o in done {
                        let v = pending.remove(&o).expect("listed above");
                        let latest = *v.last().expect("a pending word has a value");
                        persisted[o..o + 8].copy_from_slice(&latest.to_le_bytes());
                    }
                }
            }
        }
        PmemCrash {
            persisted,
            pending: pending.into_iter().map(|(offset, values)| PendingWord { offset, values }).collect(),
        }
    }
}

/// The crash states of a recorded region at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmemCrash {
    persisted: Vec<u8>,
    pending: Vec<PendingWord>,
}

impl PmemCrash {
    /// The region content every crash keeps at least.
    pub fn persisted(&self) -> &[u8] {
        &self.persisted
    }

    /// Words whose latest store is not yet known to be persistent, in offset order.
    pub fn pending(&self) -> &[PendingWord] {
        &self.pending
    }

    /// A crash image: for each pending word (by index into [`PmemCrash::pending`]) `choose`
    /// says which of its values landed (`Some(k)`: `values[k]`) or none (`None`: the persisted
    /// one). An index out of range counts as none.
    pub fn image_with(&self, mut choose: impl FnMut(usize, &PendingWord) -> Option<usize>) -> Vec<u8> {
        let mut img = self.persisted.clone();
        for (i, w) in self.pending.iter().enumerate() {
            if let Some(v) = choose(i, w).and_then(|k| w.values.get(k)) {
                img[w.offset..w.offset + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        img
    }

    /// A crash image in which exactly the pending words listed in `landed` (indices into
    /// [`PmemCrash::pending`]) reached persistence with their latest values.
    pub fn image_with_subset(&self, landed: &[usize]) -> Vec<u8> {
        self.image_with(|i, w| landed.contains(&i).then(|| w.values.len() - 1))
    }

    /// The image in which every pending word landed with its latest value: the content the
    /// region had at that moment.
    pub fn everything(&self) -> Vec<u8> {
        self.image_with(|_, w| Some(w.values.len() - 1))
    }
}
