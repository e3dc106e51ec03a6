//! `lanefs crashtest`: the crash-consistency search, a line per family and the summary last.

use lanefs_bench::progress::Progress;
use std::process::ExitCode;

/// `lanefs crashtest`: prints violations as they are found, a progress bar on a terminal, a
/// line per family, and the summary line last.
#[allow(clippy::too_many_arguments)]
pub fn crashtest(
    quick: bool,
    nvm: bool,
    seed: u64,
    workloads: &[String],
    threads: Option<usize>,
    replay: Option<&str>,
    state: Option<usize>,
    script: Option<&str>,
    setup: &str,
    avoid: &[String],
) -> ExitCode {
    use lanefs_crashtest::{self as crashtest, Event, Family};

    let mut families = Vec::new();
    for w in workloads.iter().flat_map(|w| w.split(',')).filter(|w| !w.is_empty()) {
        match Family::parse(w) {
            Some(f) => families.push(f),
            None => {
                let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
                eprintln!("lanefs crashtest: unknown workload family {w} (known: {})", names.join(", "));
                return ExitCode::from(2);
            }
        }
    }
    if families.is_empty() {
        families = Family::ALL.to_vec();
    }
    let Some(setup) = crashtest::workload::Setup::parse(setup) else {
        eprintln!("lanefs crashtest: unknown setup {setup} (known: ace, empty)");
        return ExitCode::from(2);
    };
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let avoid: Vec<String> =
        avoid.iter().flat_map(|a| a.split(',')).filter(|a| !a.is_empty()).map(String::from).collect();
    if let Some(bad) = avoid
        .iter()
        .find(|a| !crashtest::ops::Op::KINDS.contains(&a.as_str()) && a.as_str() != crashtest::BG_CHECKPOINT)
    {
        eprintln!(
            "lanefs crashtest: unknown operation kind {bad} (known: {})",
            crashtest::ops::Op::KINDS.join(", ")
        );
        return ExitCode::from(2);
    }
    let cfg = crashtest::Config { quick, seed, families, threads, avoid, nvm };
    let bar = Progress::new(0);
    let sink = |e: Event<'_>| match e {
        Event::Family { family, target } => bar.phase_at(family.name(), 0, target.min(10_000_000)),
        Event::Progress { states, .. } => bar.set(states),
        Event::Violation(text) | Event::Note(text) => bar.stdout(text),
    };
    let sum = match (replay, script) {
        (Some(id), _) => crashtest::replay(&cfg, id, state, &sink),
        (None, Some(text)) => crashtest::run_script(&cfg, setup, text, &sink),
        (None, None) => crashtest::run(&cfg, &sink),
    };
    bar.finish();
    for f in &sum.families {
        println!(
            "{:>10}: {} workloads, {} states, {} violations, {:.1} s",
            f.family.name(),
            f.workloads,
            f.states,
            f.violations,
            f.elapsed.as_secs_f64()
        );
    }
    println!(
        "time: {:.1} s, {} threads{}{}",
        sum.elapsed.as_secs_f64(),
        threads,
        if quick { ", quick" } else { "" },
        if nvm { ", nvm" } else { "" }
    );
    println!("{}", sum.last_line());
    if sum.violations > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
