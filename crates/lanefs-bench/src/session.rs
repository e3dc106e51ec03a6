//! A session: many runs over targets x workloads x thread counts x rounds, interleaved, and the
//! tables that summarise them.
//!
//! Runs are ordered round by round, and inside a round target by target for each (workload,
//! threads) cell: A B C A B C. Absolute throughput on a shared machine drifts over minutes; with
//! this order a drift hits every target alike, so the ratios between targets hold.

use crate::hist::Histogram;
use crate::progress::Progress;
use crate::report::{fmt_rate, fmt_us};
use crate::runner::{interrupted, run_one, RunConfig, RunResult};
use crate::target::Target;
use crate::workload::Workload;

/// Whether a target is a reference or a subject measured against the references (lanefs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Reference,
    Subject,
}

/// A target in a session.
pub struct Entry {
    pub label: String,
    pub role: Role,
    pub target: Box<dyn Target>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub workloads: Vec<Workload>,
    pub threads: Vec<usize>,
    pub rounds: u32,
    pub cfg: RunConfig,
}

impl Matrix {
    pub fn runs(&self, targets: usize) -> u64 {
        self.rounds as u64 * self.workloads.len() as u64 * self.threads.len() as u64 * targets as u64
    }
}

/// Every run's result, tagged with its round, and the runs that failed (one line each).
pub struct Outcome {
    pub results: Vec<(u32, RunResult)>,
    pub failures: Vec<String>,
    pub interrupted: bool,
}

/// Runs the matrix. `sink` sees each result as soon as it exists (JSON lines are written
/// there, so that an interrupted session keeps what it measured). A failed run is reported and
/// the session goes on; an interrupt ends it.
pub fn run_matrix(
    entries: &[Entry],
    m: &Matrix,
    progress: &Progress,
    sink: &mut dyn FnMut(u32, &RunResult) -> Result<(), String>,
) -> Result<Outcome, String> {
    let mut out = Outcome { results: Vec::new(), failures: Vec::new(), interrupted: false };
    for round in 1..=m.rounds {
        for &w in &m.workloads {
            for &threads in &m.threads {
                for e in entries {
                    if interrupted() {
                        out.interrupted = true;
                        return Ok(out);
                    }
                    let what = if m.rounds > 1 {
                        format!("{} {w} {threads}T (round {round}/{})", e.label, m.rounds)
                    } else {
                        format!("{} {w} {threads}T", e.label)
                    };
                    progress.start(&what);
                    match run_one(&*e.target, &e.label, w, threads, &m.cfg) {
                        Ok(r) => {
                            sink(round, &r)?;
                            out.results.push((round, r));
                        }
                        Err(err) if interrupted() => {
                            progress.note(&format!("lanefs bench: {what}: {err}"));
                            out.interrupted = true;
                            return Ok(out);
                        }
                        Err(err) => {
                            progress.note(&format!("lanefs bench: {err}"));
                            out.failures.push(err);
                        }
                    }
                    progress.done_one();
                }
            }
        }
    }
    Ok(out)
}

/// All rounds of one (target, workload, threads) cell.
#[derive(Clone, Debug)]
pub struct Cell {
    pub target: String,
    pub workload: Workload,
    pub threads: usize,
    pub rounds: u32,
    /// Mean over rounds (each round runs equally long).
    pub ops_per_sec: f64,
    pub min_ops_per_sec: f64,
    pub max_ops_per_sec: f64,
    /// Every round's samples merged.
    pub latency: Histogram,
    pub fsync: Option<Histogram>,
    /// Distinct notes of its runs (e.g. O_DIRECT fallback).
    pub notes: Vec<String>,
    /// Ops counted over all rounds.
    pub ops: u64,
    /// FUSE requests over all rounds, by opcode (a lanefs mount only).
    pub requests: Option<Vec<(String, u64)>>,
}

pub fn aggregate(results: &[(u32, RunResult)]) -> Vec<Cell> {
    let mut cells: Vec<Cell> = Vec::new();
    for (_, r) in results {
        let found = cells
            .iter_mut()
            .find(|c| c.target == r.target && c.workload == r.workload && c.threads == r.threads);
        match found {
            Some(c) => {
                c.ops_per_sec = (c.ops_per_sec * c.rounds as f64 + r.ops_per_sec) / (c.rounds + 1) as f64;
                c.rounds += 1;
                c.min_ops_per_sec = c.min_ops_per_sec.min(r.ops_per_sec);
                c.max_ops_per_sec = c.max_ops_per_sec.max(r.ops_per_sec);
                c.latency.merge(&r.latency);
                if let (Some(a), Some(b)) = (&mut c.fsync, &r.fsync) {
                    a.merge(b);
                }
                for n in &r.notes {
                    if !c.notes.contains(n) {
                        c.notes.push(n.clone());
                    }
                }
                c.ops += r.ops;
                c.requests = match (c.requests.take(), &r.requests) {
                    (Some(a), Some(b)) => Some(
                        b.iter()
                            .map(|(k, n)| {
                                (k.clone(), n + a.iter().find(|(j, _)| j == k).map_or(0, |(_, m)| *m))
                            })
                            .collect(),
                    ),
                    (a, b) => a.or_else(|| b.clone()),
                };
            }
            None => cells.push(Cell {
                target: r.target.clone(),
                workload: r.workload,
                threads: r.threads,
                rounds: 1,
                ops_per_sec: r.ops_per_sec,
                min_ops_per_sec: r.ops_per_sec,
                max_ops_per_sec: r.ops_per_sec,
                latency: r.latency.clone(),
                fsync: r.fsync.clone(),
                notes: r.notes.clone(),
                ops: r.ops,
                requests: r.requests.clone(),
            }),
        }
    }
    cells
}

fn find<'a>(cells: &'a [Cell], target: &str, w: Workload, threads: usize) -> Option<&'a Cell> {
    cells.iter().find(|c| c.target == target && c.workload == w && c.threads == threads)
}

/// The scaling column: most threads over one thread, when both were run.
fn scaling_pair(threads: &[usize]) -> Option<(usize, usize)> {
    let hi = *threads.iter().max()?;
    (threads.contains(&1) && hi > 1).then_some((1, hi))
}

/// One row per (workload, target): ops/s per thread count, the NT/1T scaling ratio, the spread
/// of ops/s over rounds ((max - min) / mean, when there were several rounds: how far to trust
/// a difference), and p50, p99 (and fsync p99 where there is one) per thread count, joined by
/// " / ".
pub fn compare_table(cells: &[Cell], targets: &[&str], workloads: &[Workload], threads: &[usize]) -> String {
    let tl: Vec<String> = threads.iter().map(|t| format!("{t}T")).collect();
    let joined = tl.join("/");
    let mut head = vec!["workload".to_string(), "target".to_string()];
    head.extend(tl.iter().map(|t| format!("{t} ops/s")));
    let scale = scaling_pair(threads);
    if let Some((lo, hi)) = scale {
        head.push(format!("{hi}T/{lo}T"));
    }
    let rounds = cells.iter().any(|c| c.rounds > 1);
    if rounds {
        head.push(format!("spread {joined}"));
    }
    head.push(format!("p50 µs {joined}"));
    head.push(format!("p99 µs {joined}"));
    let any_fsync = workloads.iter().any(|w| w.has_fsync());
    if any_fsync {
        head.push(format!("fsync p99 µs {joined}"));
    }
    let mut s = format!("| {} |\n|", head.join(" | "));
    for (i, _) in head.iter().enumerate() {
        s += if i < 2 { "---|" } else { "---:|" };
    }
    s.push('\n');
    for &w in workloads {
        for &t in targets {
            let row: Vec<Option<&Cell>> = threads.iter().map(|&n| find(cells, t, w, n)).collect();
            if row.iter().all(Option::is_none) {
                continue;
            }
            let mut cols = vec![w.name().to_string(), t.to_string()];
            cols.extend(row.iter().map(|c| c.map_or("-".into(), |c| fmt_rate(c.ops_per_sec))));
            if let Some((lo, hi)) = scale {
                cols.push(match (find(cells, t, w, lo), find(cells, t, w, hi)) {
                    (Some(a), Some(b)) if a.ops_per_sec > 0.0 => {
                        format!("{:.2}", b.ops_per_sec / a.ops_per_sec)
                    }
                    _ => "-".into(),
                });
            }
            if rounds {
                cols.push(
                    row.iter()
                        .map(|c| match c {
                            Some(c) if c.ops_per_sec > 0.0 => format!(
                                "{:.0}%",
                                100.0 * (c.max_ops_per_sec - c.min_ops_per_sec) / c.ops_per_sec
                            ),
                            _ => "-".into(),
                        })
                        .collect::<Vec<_>>()
                        .join(" / "),
                );
            }
            let lat = |q: f64, f: &dyn Fn(&Cell) -> Option<&Histogram>| {
                row.iter()
                    .map(|c| fmt_us(c.and_then(f).and_then(|h| h.quantile_us(q))))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            cols.push(lat(0.5, &|c| Some(&c.latency)));
            cols.push(lat(0.99, &|c| Some(&c.latency)));
            if any_fsync {
                cols.push(if w.has_fsync() { lat(0.99, &|c| c.fsync.as_ref()) } else { "-".into() });
            }
            s += &format!("| {} |\n", cols.join(" | "));
        }
    }
    s
}

/// FUSE requests per op of every cell that counted them (lanefs mounts), one row per
/// (workload, target, threads), with the opcodes that make them up. Empty when none did.
pub fn requests_table(cells: &[Cell], workloads: &[Workload], threads: &[usize]) -> String {
    let mut s = String::new();
    for &w in workloads {
        for c in cells.iter().filter(|c| c.workload == w && c.requests.is_some()) {
            if !threads.contains(&c.threads) {
                continue;
            }
            s += &format!(
                "| {} | {} | {} | {} |\n",
                w.name(),
                c.target,
                c.threads,
                crate::report::fmt_requests(c.requests.as_ref(), c.ops)
            );
        }
    }
    if s.is_empty() {
        return s;
    }
    format!("| workload | target | threads | FUSE requests per op (by opcode) |\n|---|---|---:|---|\n{s}")
}

/// Subject over reference throughput, one column per (subject, reference) pair, one row per
/// (workload, threads). Empty when there is no subject or no reference.
pub fn ratio_table(
    cells: &[Cell],
    subjects: &[&str],
    references: &[&str],
    workloads: &[Workload],
    threads: &[usize],
) -> String {
    if subjects.is_empty() || references.is_empty() {
        return String::new();
    }
    let pairs: Vec<(&str, &str)> =
        subjects.iter().flat_map(|s| references.iter().map(move |r| (*s, *r))).collect();
    let mut s = String::from("| workload | threads |");
    for (a, b) in &pairs {
        s += &format!(" {a} / {b} |");
    }
    s += "\n|---|---:|";
    for _ in &pairs {
        s += "---:|";
    }
    s.push('\n');
    for &w in workloads {
        for &n in threads {
            let mut row = format!("| {w} | {n} |");
            for (a, b) in &pairs {
                let cell = match (find(cells, a, w, n), find(cells, b, w, n)) {
                    (Some(x), Some(y)) if y.ops_per_sec > 0.0 => {
                        format!("{:.2}x", x.ops_per_sec / y.ops_per_sec)
                    }
                    _ => "-".into(),
                };
                row += &format!(" {cell} |");
            }
            s += &row;
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(target: &str, w: Workload, threads: usize, rate: f64, lat_ns: u64) -> RunResult {
        let mut h = Histogram::new();
        h.record_ns(lat_ns);
        RunResult {
            target: target.into(),
            fs_type: "x".into(),
            workload: w,
            threads,
            seconds: 1.0,
            ops: rate as u64,
            ops_per_sec: rate,
            latency: h.clone(),
            fsync: w.has_fsync().then_some(h),
            notes: vec![],
            fill: None,
            io: None,
            requests: None,
            census: None,
        }
    }

    #[test]
    fn aggregate_tables_and_ratios() {
        let rs = vec![
            (1, res("ext4", Workload::Dwsl, 1, 100.0, 10_000)),
            (1, res("ext4", Workload::Dwsl, 2, 150.0, 20_000)),
            (1, res("lanefs", Workload::Dwsl, 1, 200.0, 5_000)),
            (1, res("lanefs", Workload::Dwsl, 2, 400.0, 5_000)),
            (2, res("ext4", Workload::Dwsl, 1, 300.0, 10_000)),
        ];
        let cells = aggregate(&rs);
        assert_eq!(cells.len(), 4);
        let e1 = find(&cells, "ext4", Workload::Dwsl, 1).unwrap();
        assert_eq!(
            (e1.rounds, e1.ops_per_sec, e1.min_ops_per_sec, e1.max_ops_per_sec),
            (2, 200.0, 100.0, 300.0)
        );
        assert_eq!(e1.latency.count(), 2);

        let t = compare_table(&cells, &["ext4", "lanefs"], &[Workload::Dwsl], &[1, 2]);
        assert!(t.contains("2T/1T"), "{t}");
        assert!(t.contains("| DWSL | ext4 | 200 | 150 | 0.75 | 100% / 0% |"), "{t}");
        assert!(t.contains("| DWSL | lanefs | 200 | 400 | 2.00 | 0% / 0% |"), "{t}");
        assert!(t.contains("fsync p99"), "{t}");

        let r = ratio_table(&cells, &["lanefs"], &["ext4"], &[Workload::Dwsl], &[1, 2]);
        assert!(r.contains("lanefs / ext4"));
        assert!(r.contains("| DWSL | 1 | 1.00x |"), "{r}");
        assert!(r.contains("| DWSL | 2 | 2.67x |"), "{r}");
        assert!(ratio_table(&cells, &[], &["ext4"], &[Workload::Dwsl], &[1]).is_empty());
    }
}
