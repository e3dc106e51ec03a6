//! The crash model of a region, the byte-addressable twin of lanefs-crashtest's `CrashDevice`.
//!
//! It stays in the engine while the rest of the harness is the `lanefs-crashtest` crate: the
//! recorder is called from the region's own store and persist paths (`access.rs`) and must see
//! each 8-byte store as it happens, which no wrapper outside the engine can; and the model
//! beside it is what the engine's own unit tests of the region's NAT and journal protocols
//! (`tests.rs`, `nat_tests.rs`, `journal_tests.rs`) enumerate crash images with.
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
//!
//! Every event also gets a sequence number: its index in the log, or, with
//! [`super::RegionOptions::clock`], a number from an [`EventClock`] shared with a
//! `CrashDevice`, so that region and device events merge into one timeline (`lanefs
//! crashtest --nvm`). The number is taken under the recorder's lock after the store or the
//! write-back happened and before the call returns; see lanefs-crashtest's `crash_device` for
//! why that orders every pair of events one of which returned before the other began.
//! [`RegionRecording`]
//! shares the recorder with whoever opened the region, so the log outlives the mount (the
//! unmount's own events included), and [`RegionTrace`] rebuilds crash states at any point of
//! the shared timeline.

use super::persist::LINE;
use crate::device::EventClock;
use crate::sync::rank::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

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
    Store {
        /// Byte offset of the word in the region.
        offset: usize,
        /// The word stored.
        value: u64,
    },
    /// Every line touching `[start, end)` was written back.
    Persist {
        /// First byte written back.
        start: usize,
        /// One past the last.
        end: usize,
    },
}

/// What the recorder knows.
#[derive(Debug)]
pub(super) struct Recorder {
    base: Arc<Vec<u8>>,
    /// Events with their sequence numbers (increasing).
    events: Vec<(u64, RegionEvent)>,
    /// Where sequence numbers come from (None: the index in `events`).
    clock: Option<EventClock>,
}

impl Recorder {
    pub fn new(base: Vec<u8>, clock: Option<EventClock>) -> Recorder {
        Recorder { base: Arc::new(base), events: Vec::new(), clock }
    }

    fn push(&mut self, e: RegionEvent) {
        let seq = match &self.clock {
            Some(c) => c.tick(),
            None => self.events.len() as u64,
        };
        // Numbers increase along the log (a shared clock ticks under this recorder's lock):
        // `RegionTrace::before` cuts the log by binary search on them.
        debug_assert!(self.events.last().is_none_or(|&(s, _)| s < seq), "event {seq} after a later one");
        self.events.push((seq, e));
    }

    pub fn stored(&mut self, offset: usize, value: u64) {
        debug_assert_eq!(offset % 8, 0);
        self.push(RegionEvent::Store { offset, value });
    }

    pub fn persisted(&mut self, start: usize, end: usize) {
        // `persist_ranges` refused reversed ranges before it wrote anything back.
        debug_assert!(start <= end, "persisted {start}..{end}");
        if start < end {
            self.push(RegionEvent::Persist { start, end });
        }
    }

    pub fn event_count(&self) -> usize {
        self.events.len()
    }

    /// The crash states after the first `upto` events (clamped to the log).
    pub fn snapshot_at(&self, upto: usize) -> PmemCrash {
        replay(&self.base, &self.events[..upto.min(self.events.len())])
    }
}

/// The crash states after `events` reached a region that held `base`.
fn replay(base: &[u8], events: &[(u64, RegionEvent)]) -> PmemCrash {
    let mut persisted = base.to_vec();
    let pending = pending_after(events, |o, v| persisted[o..o + 8].copy_from_slice(&v.to_le_bytes()));
    let (pending, seqs) = pending
        .into_iter()
        .map(|(offset, vs)| {
            let (values, seqs) = vs.into_iter().unzip();
            (PendingWord { offset, values }, seqs)
        })
        .unzip();
    PmemCrash { persisted, pending, seqs }
}

/// Pending words (offset -> (value, sequence number of its first store) in order, consecutive
/// repeats folded) after `events`; `persist(offset, value)` is called for each word a persist
/// makes durable, in event order.
fn pending_after(
    events: &[(u64, RegionEvent)],
    mut persist: impl FnMut(usize, u64),
) -> BTreeMap<usize, Vec<(u64, u64)>> {
    let mut pending = PendingWords::default();
    for &(seq, e) in events {
        pending.apply(seq, e, &mut persist);
    }
    pending.0
}

/// The words stored and not yet persisted, folded one event at a time: offset -> (value,
/// sequence number of its first store) in order, consecutive repeats folded.
#[derive(Debug, Clone, Default)]
pub struct PendingWords(pub BTreeMap<usize, Vec<(u64, u64)>>);

impl PendingWords {
    /// Takes event `e` (number `seq`); `persist(offset, value)` is called for each word it
    /// makes durable.
    pub fn apply(&mut self, seq: u64, e: RegionEvent, mut persist: impl FnMut(usize, u64)) {
        match e {
            RegionEvent::Store { offset, value } => {
                // Stores are of aligned words (`PmemRegion::store_u64`, `write_bytes`): a persist
                // of a line covers a pending word whole or not at all.
                debug_assert!(offset.is_multiple_of(8), "a store at {offset}");
                let v = self.0.entry(offset).or_default();
                if v.last().map(|x| x.0) != Some(value) {
                    v.push((value, seq));
                }
            }
            RegionEvent::Persist { start, end } => {
                debug_assert!(start < end, "an empty persist {start}..{end} recorded");
                let first = start & !(LINE - 1);
                let last = end.div_ceil(LINE) * LINE;
                let done: Vec<usize> = self.0.range(first..last).map(|(&o, _)| o).collect();
                for o in done {
                    let v = self.0.remove(&o).expect("listed above");
                    let latest = v.last().expect("a pending word has a value").0;
                    persist(o, latest);
                }
            }
        }
    }
}

/// The recorder of a region opened with `record`, shared with the region
/// ([`super::PmemRegion::recording`]): it stays readable after the region is closed.
#[derive(Debug, Clone)]
pub struct RegionRecording(pub(super) Arc<Mutex<Recorder>>);

impl RegionRecording {
    /// Stores and persists recorded so far.
    pub fn event_count(&self) -> usize {
        self.0.lock().event_count()
    }

    /// A copy of what was recorded so far.
    pub fn trace(&self) -> RegionTrace {
        let r = self.0.lock();
        RegionTrace { base: r.base.clone(), events: r.events.clone() }
    }
}

/// A recorded region: its content at open and every event since, with sequence numbers.
#[derive(Debug, Clone)]
pub struct RegionTrace {
    base: Arc<Vec<u8>>,
    events: Vec<(u64, RegionEvent)>,
}

impl RegionTrace {
    /// The content at open.
    pub fn base(&self) -> &Arc<Vec<u8>> {
        &self.base
    }

    /// Events and their sequence numbers, in order.
    pub fn events(&self) -> &[(u64, RegionEvent)] {
        &self.events
    }

    /// The trace as if no persist had happened (every store stays pending): a test-only fault
    /// for showing that a checker sees a region that loses what it was told to keep.
    #[doc(hidden)]
    pub fn without_persists(&self) -> RegionTrace {
        let events =
            self.events.iter().filter(|(_, e)| matches!(e, RegionEvent::Store { .. })).copied().collect();
        RegionTrace { base: self.base.clone(), events }
    }

    /// Events with a sequence number below `cut`.
    fn before(&self, cut: u64) -> &[(u64, RegionEvent)] {
        &self.events[..self.events.partition_point(|&(s, _)| s < cut)]
    }

    /// The crash states of a crash at `cut` on the timeline: every event numbered below it
    /// happened, no other did.
    pub fn model_before(&self, cut: u64) -> PmemCrash {
        replay(&self.base, self.before(cut))
    }

    /// The sequence number of the last persist below `cut`.
    pub fn last_persist_before(&self, cut: u64) -> Option<u64> {
        self.before(cut).iter().rev().find(|(_, e)| matches!(e, RegionEvent::Persist { .. })).map(|x| x.0)
    }
}

/// The crash states of a recorded region at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmemCrash {
    persisted: Vec<u8>,
    pending: Vec<PendingWord>,
    /// Per pending word, the sequence number of the (first) store of each of its values.
    seqs: Vec<Vec<u64>>,
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

    /// The sequence number of the store that gave pending word `i` its value `k`.
    pub fn value_seq(&self, i: usize, k: usize) -> Option<u64> {
        self.seqs.get(i).and_then(|s| s.get(k)).copied()
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
