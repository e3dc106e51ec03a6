//! Every workload, briefly, with 1 and 2 threads against a temporary directory: each must count
//! operations and leave nothing behind. No timing thresholds: only that it works.

use lanefs_bench::target::DirTarget;
use lanefs_bench::{run_one, RunConfig, Workload};

/// A temporary directory in RAM where there is one: the runs are short (0.15 s), and on a disk
/// where a create costs a few hundred µs (a loaded machine) the refill of MWUL's pool alone can
/// outlast the timed phase, leaving no op to count.
fn scratch() -> tempfile::TempDir {
    match std::path::Path::new("/dev/shm") {
        p if p.is_dir() => tempfile::tempdir_in(p).unwrap(),
        _ => tempfile::tempdir().unwrap(),
    }
}

#[test]
fn every_workload_runs_and_cleans_up() {
    let dir = scratch();
    let target = DirTarget::new(dir.path()).unwrap();
    // Small file sets keep the preparation short; the code paths are the full ones.
    let cfg = RunConfig { seconds: 0.15, warmup: 0.05, scale: 0.05 };
    for w in Workload::ALL {
        for threads in [1, 2] {
            let r =
                run_one(&target, "tmp", w, threads, &cfg).unwrap_or_else(|e| panic!("{w} {threads}T: {e}"));
            assert!(r.ops > 0, "{w} {threads}T counted no op");
            assert!(r.ops_per_sec > 0.0);
            assert_eq!(r.latency.count(), r.ops, "{w}: one latency sample per op");
            assert!(r.latency.quantile_us(0.99) >= r.latency.quantile_us(0.5));
            assert_eq!(r.fsync.is_some(), w.has_fsync(), "{w}");
            if let Some(f) = &r.fsync {
                assert!(f.count() > 0, "{w} {threads}T: no fsync recorded");
            }
            let left: Vec<_> =
                std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert!(left.is_empty(), "{w} {threads}T left {left:?}");
        }
    }
}

#[test]
fn a_failing_run_still_cleans_up() {
    let dir = scratch();
    let target = DirTarget::new(dir.path()).unwrap();
    let cfg = RunConfig { seconds: 0.05, warmup: 0.0, scale: 0.05 };
    assert!(run_one(&target, "tmp", Workload::Dwol, 0, &cfg).is_err());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
