//! Crash states of a recording: which to build, and the check of one.
//!
//! For every flush point (and for "before the first flush") the harness builds the image whose
//! durable part ends at that flush, plus images where some of the writes in flight after it
//! landed too — prefixes in order (a device that does not reorder), random subsets in random
//! order (a volatile cache that does), all but one, and, for small windows, every subset. Each
//! image is mounted (recovery runs), walked, checked against the oracle, unmounted, and checked
//! by fsck. A recording made with a persistent-memory region gets its states from
//! [`super::nvm`] instead: cuts of the merged timeline of device and region events.

use super::oracle::{check, walk};
use super::overlay::{BlockMap, Overlay};
use super::workload::{Recording, RegionRun};
use lanefs::device::BlockDevice;
use lanefs::rng::{derive, Rng};
use lanefs::testing::pmem::PmemCrash;
use lanefs::FsckOptions;
use lanefs::{Fs, FsOptions};
use parking_lot::Mutex;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// How many states to build per window of in-flight writes.
#[derive(Debug, Clone, Copy)]
pub struct Density {
    /// Ordered prefixes of the window.
    pub prefixes: usize,
    /// Random subsets in random order.
    pub subsets: usize,
    /// The window without one (random) write.
    pub drop_one: usize,
    /// Windows of at most this many writes get every subset (in log order).
    pub exhaustive_up_to: usize,
}

impl Density {
    /// The density of `--quick`.
    pub const QUICK: Density = Density { prefixes: 1, subsets: 2, drop_one: 1, exhaustive_up_to: 2 };
    /// The density of a full run.
    pub const FULL: Density = Density { prefixes: 3, subsets: 8, drop_one: 2, exhaustive_up_to: 4 };
}

/// One crash state: the durable prefix up to flush point `flush` (an index into the flush
/// points; None: no flush yet) and the in-flight writes `extra` (log indices, in the order they
/// land). With a region, also the cut of the timeline and the pending region words that landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSpec {
    /// The flush point the durable prefix ends at (None: before the first flush).
    pub flush: Option<usize>,
    /// In-flight writes that landed after it (log indices, in landing order).
    pub extra: Vec<usize>,
    /// Which kind of choice made the state (for messages).
    pub what: &'static str,
    /// With a region: the crash point on the merged timeline (events numbered below it
    /// happened); `flush` is then the last device flush below it and `extra` writes below it.
    pub cut: Option<u64>,
    /// With a region: the pending words that landed, as (index into the pending words at the
    /// cut, index of the value it kept).
    pub region: Vec<(usize, usize)>,
}

impl StateSpec {
    /// A state of a device-only recording.
    pub fn device(flush: Option<usize>, extra: Vec<usize>, what: &'static str) -> StateSpec {
        StateSpec { flush, extra, what, cut: None, region: Vec::new() }
    }

    /// The state in words, for a violation's report.
    pub fn describe(&self, flushes: &[usize], window: usize) -> String {
        let at = match self.flush {
            None => "before the first flush".to_string(),
            Some(k) => format!("after flush {}/{} (log index {})", k + 1, flushes.len(), flushes[k]),
        };
        let at = match self.cut {
            None => at,
            Some(c) => {
                let shown: Vec<String> =
                    self.region.iter().take(12).map(|(i, v)| format!("{i}:{v}")).collect();
                let more = if self.region.len() > 12 { ", ..." } else { "" };
                format!(
                    "crash at timeline point {c} ({}, region: {} pending words landed [{}{more}]); device {at}",
                    self.what,
                    self.region.len(),
                    shown.join(",")
                )
            }
        };
        if self.extra.is_empty() {
            at
        } else {
            let shown: Vec<String> = self.extra.iter().take(12).map(|i| i.to_string()).collect();
            let more = if self.extra.len() > 12 { ", ..." } else { "" };
            format!(
                "{at} + {} of {window} in-flight writes ({}: [{}{more}])",
                self.extra.len(),
                self.what,
                shown.join(",")
            )
        }
    }
}

/// The crash states of a log with flush points `flushes` and `len` entries.
pub fn plan(log: &super::overlay::WriteLog, seed: u64, d: Density) -> Vec<StateSpec> {
    let flushes = log.flush_points();
    let mut rng = Rng::new(derive(seed, 0x5747));
    let mut out = Vec::new();
    let points: Vec<Option<usize>> = std::iter::once(None).chain((0..flushes.len()).map(Some)).collect();
    for f in points {
        let win: Vec<usize> = log.window(f.map(|k| flushes[k])).collect();
        out.push(StateSpec::device(f, vec![], "exact"));
        if win.is_empty() {
            continue;
        }
        let n = win.len();
        let is_last = f.map_or(flushes.is_empty(), |k| k + 1 == flushes.len());
        let mut seen: Vec<Vec<usize>> = vec![vec![]];
        let mut push = |out: &mut Vec<StateSpec>, extra: Vec<usize>, what: &'static str| {
            // "All in order" equals the next flush point's exact state unless this is the last
            // window (the device as the run left it).
            if extra.is_empty() || (extra == win && !is_last) || seen.contains(&extra) {
                return;
            }
            seen.push(extra.clone());
            out.push(StateSpec::device(f, extra, what));
        };
        if n <= d.exhaustive_up_to {
            for mask in 1u32..(1 << n) {
                let extra: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).map(|i| win[i]).collect();
                push(&mut out, extra, "subset");
            }
        }
        if is_last {
            push(&mut out, win.clone(), "all");
        }
        for _ in 0..d.prefixes {
            let k = 1 + rng.index(n);
            push(&mut out, win[..k].to_vec(), "prefix");
        }
        for _ in 0..d.subsets {
            let mut extra: Vec<usize> = win.iter().copied().filter(|_| rng.chance(1, 2)).collect();
            rng.shuffle(&mut extra);
            push(&mut out, extra, "reordered subset");
        }
        for _ in 0..d.drop_one {
            if n > 1 {
                let skip = rng.index(n);
                let extra: Vec<usize> = (0..n).filter(|&i| i != skip).map(|i| win[i]).collect();
                push(&mut out, extra, "all but one");
            }
        }
    }
    out
}

/// Everything the states of one recording share.
pub struct Prepared {
    /// The recording the states are cut from.
    pub rec: Recording,
    /// Indices of its flushes in the write log.
    pub flushes: Vec<usize>,
    /// The durable blocks at each flush point.
    pub maps: Vec<Arc<BlockMap>>,
    /// The states to check.
    pub states: Vec<StateSpec>,
    /// The region's crash model at the last cut asked for (states come in cut order).
    model: Mutex<Option<(u64, Arc<PmemCrash>)>>,
}

impl Prepared {
    /// Prepares the states of `rec` at density `d`, choosing with `seed`.
    pub fn new(rec: Recording, seed: u64, d: Density) -> Prepared {
        let flushes = rec.log.flush_points();
        let maps = rec.log.durable_maps();
        let states = match &rec.region {
            Some(run) => {
                let first_op = rec.hist.log.iter().map(|o| o.ev_start as u64).min().unwrap_or(run.end);
                let skip_below = if derive(seed, 0x3047).is_multiple_of(8) { 0 } else { first_op };
                super::nvm::plan(&rec.log, run, seed, d, skip_below)
            }
            None => plan(&rec.log, seed, d),
        };
        Prepared { rec, flushes, maps, states, model: Mutex::new(None) }
    }

    /// Size of the in-flight window of a state (with a region: below its cut).
    pub fn window_len(&self, s: &StateSpec) -> usize {
        let win = self.rec.log.window(s.flush.map(|k| self.flushes[k]));
        match (&self.rec.region, s.cut) {
            (Some(run), Some(c)) => win.filter(|&i| run.dev_seqs.get(i).is_some_and(|&q| q < c)).count(),
            _ => win.len(),
        }
    }

    /// The region's crash model at cut `c`.
    fn model_at(&self, run: &RegionRun, c: u64) -> Arc<PmemCrash> {
        let mut m = self.model.lock();
        match &*m {
            Some((at, model)) if *at == c => model.clone(),
            _ => {
                let model = Arc::new(run.trace.model_before(c));
                *m = Some((c, model.clone()));
                model
            }
        }
    }

    /// Checks the `k`-th state (with a region, some states get extra mounts).
    pub fn check_indexed(&self, k: usize) -> Vec<String> {
        match self.states.get(k) {
            Some(s) => self.check_with(s, super::nvm::Extra::for_state(k)),
            None => vec![format!("no state {k} (there are {})", self.states.len())],
        }
    }

    /// Builds the device of state `s`.
    pub fn device(&self, s: &StateSpec) -> Overlay {
        let map = match s.flush {
            None => self.maps[0].clone(),
            Some(k) => self.maps[k + 1].clone(),
        };
        let dev = Overlay::with_durable(self.rec.base.clone(), map);
        dev.apply_log(&self.rec.log, &s.extra);
        dev
    }

    /// Checks state `s`; returns what is wrong.
    pub fn check(&self, s: &StateSpec) -> Vec<String> {
        self.check_with(s, super::nvm::Extra::None)
    }

    fn check_with(&self, s: &StateSpec, extra: super::nvm::Extra) -> Vec<String> {
        if let (Some(run), Some(c)) = (&self.rec.region, s.cut) {
            return self.check_nvm(run, c, s, extra);
        }
        let durable = s.flush.map_or(0, |k| self.flushes[k] + 1);
        let upper = s.extra.iter().max().map_or(durable, |&m| (m + 1).max(durable));
        self.check_device(Arc::new(self.device(s)), durable, upper)
    }

    /// Checks a state cut at `c` on the merged timeline of an nvm recording.
    fn check_nvm(&self, run: &RegionRun, c: u64, s: &StateSpec, extra: super::nvm::Extra) -> Vec<String> {
        let model = self.model_at(run, c);
        let seq = |i: usize| run.dev_seqs.get(i).copied().unwrap_or(u64::MAX);
        let mut bad = Vec::new();
        // One past the last event the image holds: the last flush, the last persist, the
        // writes and stores chosen.
        let mut upper = s.flush.map_or(0, |k| seq(self.flushes[k]) + 1);
        upper = upper.max(run.trace.last_persist_before(c).map_or(0, |p| p + 1));
        for &i in &s.extra {
            upper = upper.max(seq(i).saturating_add(1));
        }
        for &(i, v) in &s.region {
            match model.value_seq(i, v) {
                Some(q) => upper = upper.max(q + 1),
                None => bad.push(format!("harness: no pending word {i} value {v} at cut {c}")),
            }
        }
        if !bad.is_empty() {
            return bad;
        }
        let image = model.image_with(|i, _| s.region.iter().find(|x| x.0 == i).map(|x| x.1));
        let dev = Arc::new(self.device(s));
        // An fsync noted as returned at position e <= c returned before the crash.
        super::nvm::check_state(&self.rec.hist, dev, &image, c as usize, upper as usize, extra)
    }

    /// Checks an image that holds the log prefix `..durable` durably and nothing of the log
    /// from `upper` on.
    pub fn check_device(&self, dev: Arc<Overlay>, durable: usize, upper: usize) -> Vec<String> {
        check_image(dev, |fs| {
            let got = walk(fs);
            check(&self.rec.hist, &got, durable, upper)
        })
    }
}

/// The text of a panic payload.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-text payload".into()
    }
}

/// Mounts `dev`, runs `inspect` on the mounted file system, unmounts, and runs fsck. A failed
/// mount, a failed unmount, an unclean fsck and any panic are reported.
pub fn check_image(dev: Arc<Overlay>, inspect: impl FnOnce(&Fs) -> Vec<String>) -> Vec<String> {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let opts = FsOptions { checkpoint_interval: None, ..Default::default() };
        let fs = match Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts) {
            Ok(f) => f,
            Err(e) => return vec![format!("mount failed: {e}")],
        };
        // A panic below leaks the mount rather than unwinding through its Drop (a second panic
        // there would abort the whole run).
        let fs = std::mem::ManuallyDrop::new(fs);
        let mut v = inspect(&fs);
        if let Err(e) = std::mem::ManuallyDrop::into_inner(fs).unmount() {
            v.push(format!("unmount after recovery failed: {e}"));
        }
        match lanefs::fsck(&*dev, &FsckOptions::default()) {
            Ok(r) if r.is_clean() => {}
            Ok(r) => {
                let ps: Vec<String> =
                    r.problems.iter().take(6).map(|p| format!("{}: {}", p.structure, p.message)).collect();
                v.push(format!("fsck after recovery: {} problem(s): {}", r.problems.len(), ps.join("; ")));
            }
            Err(e) => v.push(format!("fsck after recovery could not run: {e}")),
        }
        v
    }));
    match r {
        Ok(v) => v,
        Err(p) => vec![format!("panic: {}", panic_text(&*p))],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{record, Bases, Setup, Workload};

    /// The harness must see what a broken file system would do: an acknowledged fsync whose
    /// writes the device dropped, or whose journal block is damaged, is a violation; the true
    /// state is not.
    #[test]
    fn the_oracle_sees_a_lost_fsync() {
        let bases = Bases::default();
        let w = Workload::from_script(Setup::Ace, "create /A/x; write /A/x 0 5000 1; fsync /A/x").unwrap();
        let p = Prepared::new(record(&w, &bases).unwrap(), 1, Density::QUICK);
        let f = p.flushes[0];
        let exact = StateSpec::device(Some(0), vec![], "exact");
        assert!(p.check(&exact).is_empty(), "{:?}", p.check(&exact));
        // The fsync's writes never landed, yet the fsync returned.
        let lost = Overlay::new(p.rec.base.clone());
        let v = p.check_device(Arc::new(lost), f + 1, f + 1);
        assert!(v.iter().any(|m| m.contains("/A/x") && m.contains("gone")), "{v:?}");
        // The fsync's data block holds other bytes: recovery must drop the transaction (the
        // data checksum does not match), so the file is gone again.
        let damaged = p.device(&exact);
        let (addr, _) = p.rec.log.events[..f].iter().flatten().next().expect("a write before the flush");
        damaged.put(*addr, &vec![0xAB; lanefs::device::BLOCK_SIZE]);
        let v = p.check_device(Arc::new(damaged), f + 1, f + 1);
        assert!(!v.is_empty(), "a damaged fsync went unnoticed");
    }
}
