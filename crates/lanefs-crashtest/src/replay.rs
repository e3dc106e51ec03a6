//! One workload at a time, verbosely: a workload replayed by id (or a corruption case by its
//! index), a script, and the regression checks that run either and return the violations.
//!
//! The same checks as a family run, on one thread: what a replay reports is what the run that
//! printed the id saw (multi-threaded workloads replay the same operations, not necessarily
//! the same interleaving).

use super::states::Prepared;
use super::workload::{record, Bases, Workload};
use lanefs::rng::derive;
use parking_lot::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use super::ids::{make_workload, parse_id};
use super::sweep::{run_corrupt, run_corrupt_region};
use super::{check_recording, density, workload, workload_report, Config, Event, Sink, Summary};

/// Runs one workload (by id, as printed in a violation) or one corruption case, verbosely.
/// `state`: only that crash state.
pub fn replay(cfg: &Config, id: &str, state: Option<usize>, sink: Sink) -> Summary {
    let start = Instant::now();
    let bases = Bases::default();
    let mut sum = Summary::default();
    if let Some(rest) = id.strip_prefix("corrupt-region:") {
        let Ok(k) = rest.parse::<usize>() else {
            sink(Event::Violation(&format!("VIOLATION {id}: expected corrupt-region:INDEX")));
            sum.violations = 1;
            return sum;
        };
        let fs = run_corrupt_region(cfg, &bases, sink, Some(k));
        sum.states = fs.states;
        sum.violations = fs.violations;
        sum.families.push(fs);
        sum.elapsed = start.elapsed();
        return sum;
    }
    if let Some(rest) = id.strip_prefix("corrupt:") {
        let Some((name, k)) = rest.split_once(':').and_then(|(n, k)| Some((n, k.parse::<usize>().ok()?)))
        else {
            sink(Event::Violation(&format!("VIOLATION {id}: expected corrupt:REFERENCE:INDEX")));
            sum.violations = 1;
            return sum;
        };
        let fs = run_corrupt(cfg, &bases, sink, Some((name, k)));
        sum.states = fs.states;
        sum.violations = fs.violations;
        sum.families.push(fs);
        sum.elapsed = start.elapsed();
        return sum;
    }
    let w = parse_id(id).and_then(|(f, key)| {
        make_workload(f, key, &bases, &cfg.avoid, cfg.nvm)?
            .ok_or_else(|| format!("{id}: no such workload"))
            .map(|w| (w, key))
    });
    match w {
        Ok((w, key)) => run_one(cfg, w, key, state, &bases, sink, &mut sum),
        Err(e) => {
            sink(Event::Violation(&format!("VIOLATION {id}: {e}")));
            sum.violations = 1;
        }
    }
    sum.elapsed = start.elapsed();
    sum
}

/// Runs a script (see [`ops`](super::ops)) as a workload, verbosely.
pub fn run_script(cfg: &Config, setup: workload::Setup, text: &str, sink: Sink) -> Summary {
    let start = Instant::now();
    let bases = Bases::default();
    let mut sum = Summary::default();
    match Workload::from_script(setup, text) {
        Ok(mut w) => {
            w.knobs.nvm |= cfg.nvm;
            run_one(cfg, w, cfg.seed, None, &bases, sink, &mut sum)
        }
        Err(e) => {
            sink(Event::Violation(&format!("VIOLATION script: {e}")));
            sum.violations = 1;
        }
    }
    sum.elapsed = start.elapsed();
    sum
}

fn run_one(
    cfg: &Config,
    w: Workload,
    key: u64,
    state: Option<usize>,
    bases: &Bases,
    sink: Sink,
    sum: &mut Summary,
) {
    let rec = match record(&w, bases) {
        Ok(r) => r,
        Err(e) => {
            sink(Event::Violation(&format!("VIOLATION {}: could not run: {e}", w.id)));
            sum.violations += 1;
            return;
        }
    };
    let findings = rec.findings.clone();
    let p = Prepared::new(rec, derive(key, 0x57A7E), density(cfg.quick));
    let timeline = match &p.rec.region {
        Some(run) => format!(
            "\n  timeline: {} events ({} device, {} region), device flushes at positions {:?}; \
             history positions are timeline points",
            run.end,
            run.dev_seqs.len(),
            run.trace.events().len(),
            p.flushes.iter().map(|&f| run.dev_seqs[f]).collect::<Vec<_>>()
        ),
        None => String::new(),
    };
    sink(Event::Note(&format!(
        "{}: {}\n  write log: {} entries, flushes at {:?}, crash at {}{timeline}\n  {} crash states\n  operations:\n{}  file versions:\n{}",
        w.id,
        w.describe(),
        p.rec.log.len(),
        p.flushes,
        p.rec.crash_at,
        p.states.len(),
        p.rec.hist.listing(),
        p.rec.hist.file_listing()
    )));
    let slot = Mutex::new(None);
    let done = AtomicU64::new(0);
    let (n, bad) = check_recording(&p, state, &slot, &done);
    sum.states += n;
    if !bad.is_empty() || !findings.is_empty() {
        sum.violations += (bad.len() + findings.len()) as u64;
        sink(Event::Violation(&workload_report(&p, &findings, &bad)));
    }
}

/// Checks one workload given as a script, at the given density; returns every violation as
/// text (empty: none). For regression tests.
pub fn check_script(setup: workload::Setup, text: &str, quick: bool) -> Vec<String> {
    let cfg = Config { quick, seed: 1, families: vec![], threads: 1, avoid: vec![], nvm: false };
    let out = Mutex::new(Vec::new());
    let sink = |e: Event<'_>| {
        if let Event::Violation(v) = e {
            out.lock().push(v.to_string());
        }
    };
    run_script(&cfg, setup, text, &sink);
    out.into_inner()
}

/// As [`check_script`] for a workload of several threads or with a fault.
pub fn check_workload(w: Workload, quick: bool) -> Vec<String> {
    let cfg = Config { quick, seed: 1, families: vec![], threads: 1, avoid: vec![], nvm: false };
    let out = Mutex::new(Vec::new());
    let sink = |e: Event<'_>| {
        if let Event::Violation(v) = e {
            out.lock().push(v.to_string());
        }
    };
    let mut sum = Summary::default();
    run_one(&cfg, w, 1, None, &Bases::default(), &sink, &mut sum);
    out.into_inner()
}
