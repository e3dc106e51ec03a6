//! Reports: one JSON object per run (JSON lines), markdown tables, and the machine facts that
//! make a figure reproducible (cores, kernel, commit, date).

use crate::runner::RunResult;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// Facts about where and from what the figures were measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub cores: usize,
    /// `uname -r`.
    pub kernel: String,
    /// Short hash of the source tree's HEAD, or "unknown".
    pub commit: String,
    /// Start of the benchmark, UTC, ISO 8601.
    pub date: String,
}

impl Machine {
    pub fn detect() -> Machine {
        Machine {
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            commit: git_commit(),
            date: utc_now(),
        }
    }
}

/// The commit of the source the binary was built from (its crate directory, when it still
/// exists), else of the current directory, else "unknown".
fn git_commit() -> String {
    for dir in [Path::new(env!("CARGO_MANIFEST_DIR")), Path::new(".")] {
        if !dir.is_dir() {
            continue;
        }
        let out = Command::new("git").arg("-C").arg(dir).args(["rev-parse", "--short", "HEAD"]).output();
        if let Ok(o) = out {
            let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if o.status.success() && !s.is_empty() {
                return s;
            }
        }
    }
    "unknown".into()
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format_utc(secs)
}

/// Seconds since the epoch as an ISO 8601 UTC date (civil-from-days, proleptic Gregorian).
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

fn opt_us(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |x| json!(round(x, 3)))
}

/// The JSON object of one run. `round` is the compare round, when there is one.
pub fn json_line(r: &RunResult, m: &Machine, round_no: Option<u32>) -> Value {
    let mut v = json!({
        "target": r.target,
        "workload": r.workload.name(),
        "threads": r.threads,
        "seconds": round(r.seconds, 3),
        "ops": r.ops,
        "ops_per_sec": round(r.ops_per_sec, 1),
        "p50_us": opt_us(r.latency.quantile_us(0.5)),
        "p99_us": opt_us(r.latency.quantile_us(0.99)),
        "fsync_p50_us": opt_us(r.fsync.as_ref().and_then(|h| h.quantile_us(0.5))),
        "fsync_p99_us": opt_us(r.fsync.as_ref().and_then(|h| h.quantile_us(0.99))),
        "cores": m.cores,
        "kernel": m.kernel,
        "commit": m.commit,
        "fs_type": r.fs_type,
        "date": m.date,
        "notes": r.notes,
        "fill": r.fill.map_or(Value::Null, |f| json!(round(f, 4))),
        "user_bytes": r.io.map_or(Value::Null, |c| json!(c.user_bytes)),
        "device_bytes": r.io.map_or(Value::Null, |c| json!(c.device_bytes)),
        "cleaning_bytes": r.io.map_or(Value::Null, |c| json!(c.cleaning_bytes)),
        "segments_cleaned": r.io.map_or(Value::Null, |c| json!(c.segments_cleaned)),
        "checkpoints": r.io.map_or(Value::Null, |c| json!(c.checkpoints)),
        "cp_exclusive_us_max": r.io.map_or(Value::Null, |c| json!(c.cp_exclusive_us_max)),
        "cp_waits": r.io.map_or(Value::Null, |c| json!(c.cp_waits)),
        "cp_helped": r.io.map_or(Value::Null, |c| json!(c.cp_helped)),
        "fsync_flushes": r.io.map_or(Value::Null, |c| json!(c.fsync_flushes)),
        "fsyncs": r.io.map_or(Value::Null, |c| json!(c.fsyncs)),
        "flushes_per_fsync": r.io.and_then(|c| (c.fsyncs > 0).then(|| json!(round(c.fsync_flushes as f64 / c.fsyncs as f64, 3)))).unwrap_or(Value::Null),
        "write_amplification": wa(r).map_or(Value::Null, |x| json!(round(x, 3))),
        "fuse_requests": r.requests.as_ref().map_or(Value::Null, |c| {
            Value::Object(c.iter().filter(|(_, n)| *n > 0).map(|(k, n)| (k.clone(), json!(n))).collect())
        }),
        "requests_per_op": r.requests.as_ref().and_then(|c| requests_per_op(c, r.ops)).map_or(Value::Null, |(x, _)| json!(round(x, 3))),
        "contended_per_op": contended_per_op(r),
    });
    if let Some(n) = round_no {
        v["round"] = json!(n);
    }
    v
}

/// lanefs's contended lock acquisitions per counted operation, by lock class (only the
/// classes that had any), over the timed phase; null for targets with no census.
fn contended_per_op(r: &RunResult) -> Value {
    let Some(c) = &r.census else { return Value::Null };
    let ops = r.ops.max(1) as f64;
    let per: serde_json::Map<String, Value> =
        c.nonzero().map(|(rank, n)| (format!("{rank:?}"), json!(round(n as f64 / ops, 6)))).collect();
    Value::Object(per)
}

/// The run's write amplification, when the target counts its writes and users wrote something.
fn wa(r: &RunResult) -> Option<f64> {
    r.io.and_then(|c| c.write_amplification())
}

/// FUSE requests per op over a run or a cell, and the opcodes that make it up (those at 0.01
/// per op or more, largest first: `LOOKUP 1.00, CREATE 1.00, ...`). None without ops.
pub fn requests_per_op(requests: &[(String, u64)], ops: u64) -> Option<(f64, String)> {
    if ops == 0 {
        return None;
    }
    let per = |n: u64| n as f64 / ops as f64;
    let mut parts: Vec<(&str, f64)> =
        requests.iter().map(|(k, n)| (k.as_str(), per(*n))).filter(|(_, x)| *x >= 0.005).collect();
    parts.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total = per(requests.iter().map(|(_, n)| n).sum());
    Some((total, parts.iter().map(|(k, x)| format!("{k} {x:.2}")).collect::<Vec<_>>().join(", ")))
}

/// A requests-per-op cell: the total, and what it is made of.
pub fn fmt_requests(requests: Option<&Vec<(String, u64)>>, ops: u64) -> String {
    match requests.and_then(|c| requests_per_op(c, ops)) {
        Some((x, parts)) if parts.is_empty() => format!("{x:.2}"),
        Some((x, parts)) => format!("{x:.2} ({parts})"),
        None => "-".into(),
    }
}

/// A latency in µs for a table: more digits for small values, "-" when absent.
pub fn fmt_us(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x < 10.0 => format!("{x:.2}"),
        Some(x) if x < 1000.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.0}"),
    }
}

pub fn fmt_rate(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// One row per run. A `used` column (the fraction of the target in use at the start of the run)
/// when the targets report their space, and `WA` (write amplification over warm-up and timed
/// phase) when some row has it.
pub fn markdown_table(results: &[RunResult]) -> String {
    let with_wa = results.iter().any(|r| wa(r).is_some());
    let with_fill = results.iter().any(|r| r.fill.is_some());
    let with_requests = results.iter().any(|r| r.requests.is_some());
    let mut head = String::from("| target | fs | workload | threads | ops/s |");
    let mut rule = String::from("|---|---|---|---:|---:|");
    if with_fill {
        head += " used |";
        rule += "---:|";
    }
    if with_wa {
        head += " WA |";
        rule += "---:|";
    }
    head += " p50 µs | p99 µs | fsync p50 µs | fsync p99 µs |";
    rule += "---:|---:|---:|---:|";
    if with_requests {
        head += " FUSE requests/op |";
        rule += "---|";
    }
    head += " notes |\n";
    rule += "---|\n";
    let mut s = head + &rule;
    for r in results {
        s += &format!(
            "| {} | {} | {} | {} | {} |",
            r.target,
            r.fs_type,
            r.workload,
            r.threads,
            fmt_rate(r.ops_per_sec)
        );
        if with_fill {
            s += &format!(" {} |", r.fill.map_or("-".into(), |f| format!("{:.1}%", 100.0 * f)));
        }
        if with_wa {
            s += &format!(" {} |", wa(r).map_or("-".into(), |x| format!("{x:.2}")));
        }
        s += &format!(
            " {} | {} | {} | {} |",
            fmt_us(r.latency.quantile_us(0.5)),
            fmt_us(r.latency.quantile_us(0.99)),
            fmt_us(r.fsync.as_ref().and_then(|h| h.quantile_us(0.5))),
            fmt_us(r.fsync.as_ref().and_then(|h| h.quantile_us(0.99))),
        );
        if with_requests {
            s += &format!(" {} |", fmt_requests(r.requests.as_ref(), r.ops));
        }
        s += &format!(" {} |\n", r.notes.join("; "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hist::Histogram;
    use crate::workload::Workload;

    fn result(w: Workload, fsync: bool) -> RunResult {
        let mut latency = Histogram::new();
        for v in 1..=1000 {
            latency.record_ns(v * 1000);
        }
        RunResult {
            target: "dir:/x".into(),
            fs_type: "tmpfs".into(),
            workload: w,
            threads: 2,
            seconds: 1.0004,
            ops: 1000,
            ops_per_sec: 999.6,
            latency: latency.clone(),
            fsync: fsync.then_some(latency),
            notes: vec![],
            fill: None,
            io: None,
            requests: None,
            census: None,
        }
    }

    fn machine() -> Machine {
        Machine { cores: 2, kernel: "6.1.0".into(), commit: "abc1234".into(), date: format_utc(0) }
    }

    #[test]
    fn json_line_has_every_field() {
        let v = json_line(&result(Workload::Dwsl, true), &machine(), None);
        for k in [
            "target",
            "workload",
            "threads",
            "seconds",
            "ops",
            "ops_per_sec",
            "p50_us",
            "p99_us",
            "fsync_p50_us",
            "fsync_p99_us",
            "cores",
            "kernel",
            "commit",
            "fs_type",
            "date",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["workload"], "DWSL");
        assert_eq!(v["threads"], 2);
        assert_eq!(v["ops"], 1000);
        assert_eq!(v["commit"], "abc1234");
        assert_eq!(v["fs_type"], "tmpfs");
        assert_eq!(v["date"], "1970-01-01T00:00:00Z");
        let p50 = v["p50_us"].as_f64().unwrap();
        assert!((p50 - 500.0).abs() < 10.0, "{p50}");
        assert!(v["fsync_p99_us"].as_f64().is_some());
        assert!(v.get("round").is_none());
        // One line: serialises without newlines.
        assert!(!v.to_string().contains('\n'));
    }

    #[test]
    fn requests_per_op_show_the_total_and_its_parts() {
        let mut r = result(Workload::Mwcl, false);
        assert_eq!(fmt_requests(None, r.ops), "-");
        assert!(json_line(&r, &machine(), None)["requests_per_op"].is_null());
        let c = vec![
            ("LOOKUP".to_string(), 1000),
            ("CREATE".to_string(), 1000),
            ("GETATTR".to_string(), 2000),
            ("WRITE".to_string(), 1),
        ];
        r.requests = Some(c.clone());
        assert_eq!(fmt_requests(Some(&c), 1000), "4.00 (GETATTR 2.00, LOOKUP 1.00, CREATE 1.00)");
        assert_eq!(fmt_requests(Some(&c), 0), "-");
        let v = json_line(&r, &machine(), None);
        assert_eq!(v["requests_per_op"], 4.001);
        assert_eq!(v["fuse_requests"]["WRITE"], 1);
        assert!(markdown_table(&[r]).contains("| 4.00 (GETATTR 2.00, LOOKUP 1.00, CREATE 1.00) |"));
    }

    #[test]
    fn json_line_nulls_fsync_when_not_applicable() {
        let v = json_line(&result(Workload::Dwol, false), &machine(), Some(3));
        assert!(v["fsync_p50_us"].is_null());
        assert!(v["fsync_p99_us"].is_null());
        assert_eq!(v["round"], 3);
    }

    #[test]
    fn contention_per_op_by_lock_class() {
        use lanefs::sync::{Census, Rank};
        let v = json_line(&result(Workload::Dwom, false), &machine(), None);
        assert!(v["contended_per_op"].is_null(), "a target with no census: {v}");
        let mut r = result(Workload::Dwom, false);
        r.census = Some(Census::from_counts([(Rank::Range, 25), (Rank::PageShard, 3)]));
        let v = json_line(&r, &machine(), None);
        let per = v["contended_per_op"].as_object().expect("an object");
        assert_eq!(per.len(), 2, "only classes that waited: {per:?}");
        assert_eq!(per["Range"], 0.025);
        assert_eq!(per["PageShard"], 0.003);
        r.census = Some(Census::default());
        let v = json_line(&r, &machine(), None);
        assert_eq!(v["contended_per_op"], serde_json::json!({}), "none waited");
    }

    #[test]
    fn write_counters_and_fill() {
        use crate::target::IoCounters;
        // Not a lib: target: the fields are there, null.
        let v = json_line(&result(Workload::Dwal, false), &machine(), None);
        for k in [
            "fill",
            "user_bytes",
            "device_bytes",
            "cleaning_bytes",
            "segments_cleaned",
            "checkpoints",
            "cp_exclusive_us_max",
            "cp_waits",
            "cp_helped",
            "fsync_flushes",
            "fsyncs",
            "flushes_per_fsync",
            "write_amplification",
        ] {
            assert!(v.get(k).is_some_and(|x| x.is_null()), "{k}: {v}");
        }
        let mut r = result(Workload::Dwal, false);
        r.fill = Some(0.95123);
        r.io = Some(IoCounters {
            user_bytes: 1000,
            device_bytes: 1500,
            cleaning_bytes: 300,
            segments_cleaned: 2,
            checkpoints: 7,
            cp_exclusive_us_max: 640,
            cp_waits: 3,
            cp_helped: 2,
            fsync_flushes: 4,
            fsyncs: 16,
        });
        let v = json_line(&r, &machine(), None);
        assert_eq!(v["fill"], 0.9512);
        assert_eq!(v["user_bytes"], 1000);
        assert_eq!(v["device_bytes"], 1500);
        assert_eq!(v["cleaning_bytes"], 300);
        assert_eq!(v["segments_cleaned"], 2);
        assert_eq!(v["checkpoints"], 7);
        assert_eq!(v["cp_exclusive_us_max"], 640);
        assert_eq!(v["cp_waits"], 3);
        assert_eq!(v["cp_helped"], 2);
        assert_eq!(v["fsync_flushes"], 4);
        assert_eq!(v["fsyncs"], 16);
        assert_eq!(v["flushes_per_fsync"], 0.25);
        assert_eq!(v["write_amplification"], 1.5);
        let t = markdown_table(&[r.clone(), result(Workload::Dwol, false)]);
        assert!(t.starts_with("| target | fs | workload | threads | ops/s | used | WA | p50"), "{t}");
        assert!(t.contains("| DWAL | 2 | 1000 | 95.1% | 1.50 |"), "{t}");
        assert!(t.contains("| DWOL | 2 | 1000 | - | - |"), "{t}");
        // Users wrote nothing: no amplification to speak of.
        r.io = Some(IoCounters { user_bytes: 0, device_bytes: 4096, ..Default::default() });
        assert!(json_line(&r, &machine(), None)["write_amplification"].is_null());
        let t = markdown_table(&[r]);
        assert!(t.contains(" used |") && !t.contains(" WA |"), "{t}");
    }

    #[test]
    fn dates() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn table_has_a_row_per_run() {
        let t = markdown_table(&[result(Workload::Dwol, false), result(Workload::Dwsl, true)]);
        assert_eq!(t.lines().count(), 4);
        assert!(t.contains("| DWOL | 2 | 1000 |"));
    }

    #[test]
    fn machine_facts() {
        let m = Machine::detect();
        assert!(m.cores >= 1);
        assert!(!m.kernel.is_empty() && !m.commit.is_empty());
        assert!(m.date.ends_with('Z'));
    }
}
