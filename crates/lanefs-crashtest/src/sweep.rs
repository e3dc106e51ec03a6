//! The corruption sweeps: damaged device images, and with `--nvm` damaged regions of a crash
//! state, each mounted, read back, unmounted and checked by fsck.
//!
//! Any outcome but a panic, a hang or an unbounded allocation is fine. Sequential, one damaged
//! image at a time, so that the memory check measures that image alone.

use super::workload::Bases;
use lanefs::rng::{derive, Rng};
use std::time::Instant;

use super::{corrupt, nvm, Config, Event, Family, FamilySummary, Sink};

/// The corruption sweep (sequential: one damaged image at a time, so that the memory check
/// measures that image alone). `only`: replay one case (reference name, index).
pub(super) fn run_corrupt(
    cfg: &Config,
    bases: &Bases,
    sink: Sink,
    only: Option<(&str, usize)>,
) -> FamilySummary {
    let start = Instant::now();
    let mut out = FamilySummary::empty(Family::Corrupt);
    let refs = match corrupt::references(bases) {
        Ok(r) => r,
        Err(e) => {
            out.violations += 1;
            sink(Event::Violation(&format!("VIOLATION corrupt: could not build the reference images: {e}")));
            return out;
        }
    };
    let cases = corrupt_cases(cfg, &refs);
    sink(Event::Family { family: Family::Corrupt, target: cases.len() as u64 });
    let mut per_ref = vec![0usize; refs.len()];
    let (mut refused, mut mounted, mut walk_failed) = (0u64, 0u64, 0u64);
    for (ri, d) in cases {
        let idx = per_ref[ri];
        per_ref[ri] += 1;
        if let Some((name, k)) = only {
            if refs[ri].name != name || idx != k {
                continue;
            }
        }
        let dev = corrupt::damaged(&refs[ri], &d);
        out.states += 1;
        let id = format!("corrupt:{}:{idx}", refs[ri].name);
        match corrupt::run_case(dev) {
            corrupt::CaseResult::Done(o) => {
                match &o.mount_error {
                    Some(_) => refused += 1,
                    None => mounted += 1,
                }
                if o.walk_errors > 0 {
                    walk_failed += 1;
                }
                if only.is_some() {
                    sink(Event::Note(&format!(
                        "{id}: {d} ({} image): mount {}; {} walk errors; fsck {}",
                        refs[ri].name,
                        o.mount_error.as_deref().map_or("succeeded".to_string(), |e| format!("refused: {e}")),
                        o.walk_errors,
                        o.fsck
                    )));
                }
                if !o.violations.is_empty() {
                    out.violations += 1;
                    sink(Event::Violation(&format!(
                        "VIOLATION {id}: {d} ({} image): {}\n  replay: lanefs crashtest --replay {id}",
                        refs[ri].name,
                        o.violations.join("; ")
                    )));
                }
            }
            corrupt::CaseResult::Hang => {
                out.violations += 1;
                sink(Event::Violation(&format!(
                    "VIOLATION {id}: {d} ({} image): mount, walk or fsck did not finish within {} s (sweep stopped)\n  replay: lanefs crashtest --replay {id}",
                    refs[ri].name,
                    corrupt::CASE_TIMEOUT.as_secs()
                )));
                break;
            }
        }
        if out.states.is_multiple_of(16) {
            sink(Event::Progress { states: out.states, violations: out.violations });
        }
    }
    if only.is_none() {
        out.violations += run_decoder_cases(cfg, sink);
        note_corrupt_counts(&refs, out.states, (mounted, walk_failed, refused), sink);
    }
    out.elapsed = start.elapsed();
    out
}

/// The damaged images of the sweep, as (reference index, damage): each reference's
/// systematic sweep, then its random damage.
fn corrupt_cases(cfg: &Config, refs: &[corrupt::Reference]) -> Vec<(usize, corrupt::Damage)> {
    let mut cases: Vec<(usize, corrupt::Damage)> = Vec::new();
    for (ri, r) in refs.iter().enumerate() {
        cases.extend(corrupt::sweep(r, cfg.quick, cfg.seed).into_iter().map(|d| (ri, d)));
        let mut rng = Rng::new(derive(cfg.seed, 0xC0 + ri as u64));
        let n = if cfg.quick { 100 } else { 20_000 };
        cases.extend(corrupt::random_damage(r, &mut rng, n).into_iter().map(|d| (ri, d)));
    }
    cases
}

/// Structure-aware decoder cases (the entry point of the cargo-fuzz target): mutated blocks,
/// checksums fixed, through their decoders. Returns the violations (panics) found.
fn run_decoder_cases(cfg: &Config, sink: Sink) -> u64 {
    let n = if cfg.quick { 20_000 } else { 1_000_000 };
    let found = corrupt::decoder_cases(derive(cfg.seed, 0xDEC0), n);
    for v in &found {
        sink(Event::Violation(&format!("VIOLATION corrupt-decoder: {v}")));
    }
    sink(Event::Note(&format!(
        "corrupt: {n} mutated blocks (checksums fixed) through their decoders: {} panics",
        found.len()
    )));
    found.len() as u64
}

/// The sweep's closing note: how the `states` damaged images fared (mounted, of those with
/// read errors, refused) and the blocks of each kind the references hold.
fn note_corrupt_counts(
    refs: &[corrupt::Reference],
    states: u64,
    (mounted, walk_failed, refused): (u64, u64, u64),
    sink: Sink,
) {
    let kinds: Vec<String> = corrupt::Target::ALL
        .iter()
        .map(|t| {
            let n: usize = refs.iter().map(|r| r.blocks.iter().filter(|(k, _)| k == t).count()).sum();
            format!("{} {n}", t.name())
        })
        .collect();
    sink(Event::Note(&format!(
        "corrupt: {states} damaged images: {mounted} mounted and were read back ({walk_failed} with read errors), {refused} refused at mount; blocks found by kind: {}",
        kinds.join(", ")
    )));
}

/// The region corruption sweep of `--nvm` (the device images' sweep is the same as without a
/// region): damaged regions of a crash state with journal records, mounted, read back,
/// unmounted and checked by fsck; any outcome but a panic or a hang is fine. `only`: replay
/// one case.
pub(super) fn run_corrupt_region(
    cfg: &Config,
    bases: &Bases,
    sink: Sink,
    only: Option<usize>,
) -> FamilySummary {
    let start = Instant::now();
    let mut out = FamilySummary::empty(Family::Corrupt);
    let r = match nvm::region_reference(bases) {
        Ok(r) => r,
        Err(e) => {
            out.violations += 1;
            sink(Event::Violation(&format!("VIOLATION corrupt-region: could not build the reference: {e}")));
            return out;
        }
    };
    let n = if cfg.quick { 300 } else { 10_000 };
    let cases = nvm::region_damages(&r, &mut Rng::new(derive(cfg.seed, 0xC0DE)), n);
    sink(Event::Family { family: Family::Corrupt, target: cases.len() as u64 });
    let (mut mounted, mut refused) = (0u64, 0u64);
    for (k, d) in cases.iter().enumerate() {
        if only.is_some_and(|o| o != k) {
            continue;
        }
        out.states += 1;
        let id = format!("corrupt-region:{k}");
        match nvm::run_region_case(&r, d) {
            Some((m, v)) => {
                if m {
                    mounted += 1;
                } else {
                    refused += 1;
                }
                if only.is_some() {
                    sink(Event::Note(&format!(
                        "{id}: {}: {}",
                        d.what,
                        if m { "mounted" } else { "refused" }
                    )));
                }
                if !v.is_empty() {
                    out.violations += 1;
                    sink(Event::Violation(&format!(
                        "VIOLATION {id}: {}: {}\n  replay: lanefs crashtest --nvm --replay {id}",
                        d.what,
                        v.join("; ")
                    )));
                }
            }
            None => {
                out.violations += 1;
                sink(Event::Violation(&format!(
                    "VIOLATION {id}: {}: mount, walk or fsck did not finish within {} s (sweep stopped)\n  replay: lanefs crashtest --nvm --replay {id}",
                    d.what,
                    corrupt::CASE_TIMEOUT.as_secs()
                )));
                break;
            }
        }
        if out.states.is_multiple_of(16) {
            sink(Event::Progress { states: out.states, violations: out.violations });
        }
    }
    sink(Event::Note(&format!(
        "corrupt (region): {} damaged regions ({} live words): {mounted} mounted and were read back, {refused} refused",
        out.states,
        r.stored.len()
    )));
    out.elapsed = start.elapsed();
    out
}
