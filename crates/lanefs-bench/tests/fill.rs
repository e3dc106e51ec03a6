//! `--fill`: a lanefs image filled to half before a DWAL run reports that fill and its write
//! counters in the JSON line, and the filler is gone afterwards; an impossible fill is refused
//! in one line before anything is opened.

use clap::Parser;
use lanefs::device::{create_image, DeviceOptions, FileDevice};
use lanefs::{Fs, MkfsOptions};
use lanefs_bench::fill::FILL_DIR;
use lanefs_bench::{open_target, BenchArgs};
use std::path::Path;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(v: &[&str]) -> Result<BenchArgs, String> {
    let mut all = vec!["lanefs-bench"];
    all.extend_from_slice(v);
    let a = Cli::try_parse_from(all).map_err(|e| e.to_string())?.bench;
    a.validate()?;
    Ok(a)
}

/// A temporary directory in RAM where there is one (the image is written, not only sparse).
fn scratch() -> tempfile::TempDir {
    match Path::new("/dev/shm") {
        p if p.is_dir() => tempfile::tempdir_in(p).unwrap(),
        _ => tempfile::tempdir().unwrap(),
    }
}

#[test]
fn half_full_lib_image_reports_fill_and_write_amplification() {
    let dir = scratch();
    let img = dir.path().join("fill.img");
    create_image(&img, 256 << 20).unwrap();
    let dev = FileDevice::open(&img, DeviceOptions::default()).unwrap();
    Fs::format(&dev, &MkfsOptions::default()).unwrap();
    drop(dev);

    let json = dir.path().join("out.jsonl");
    let target = format!("lib:{}", img.display());
    // A 16 MiB page cache: the default (256 MiB) holds every append of a run this short, which
    // then never reaches the device (write amplification 0, truthfully, but untestable).
    let a = args(&[
        "--target",
        &target,
        "--workload",
        "DWAL",
        "--threads",
        "1",
        "--seconds",
        "0.5",
        "--warmup",
        "0.1",
        "--fill",
        "0.5",
        "--lib-cache",
        "16M",
        "--json",
        json.to_str().unwrap(),
    ])
    .unwrap();
    lanefs_bench::run(&a).unwrap_or_else(|e| panic!("{e}"));

    let text = std::fs::read_to_string(&json).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    let fill = v["fill"].as_f64().unwrap_or_else(|| panic!("no fill in {v}"));
    assert!((fill - 0.5).abs() <= 0.05, "fill {fill}: {v}");
    let user = v["user_bytes"].as_u64().unwrap();
    let device = v["device_bytes"].as_u64().unwrap();
    let ops = v["ops"].as_u64().unwrap();
    assert!(ops > 0 && user >= ops * 4096, "the counters cover at least the counted appends: {v}");
    assert!(v["cleaning_bytes"].as_u64().is_some_and(|c| c <= device), "{v}");
    let wa = v["write_amplification"].as_f64().unwrap_or_else(|| panic!("no write amplification in {v}"));
    assert!((wa - device as f64 / user as f64).abs() < 1e-3, "{v}");
    // Appends past the 8 MiB of dirty pages the cache keeps are written back: about one device
    // byte per user byte. Not >= 1: what a wrap truncates while it is still cached is never
    // written (and the run ends with up to 8 MiB dirty), so DWAL's amplification sits just
    // under 1 (0.95 on a 1 GiB image with 2 threads).
    assert!(wa >= 0.5, "write amplification {wa}: {v}");
    assert_eq!(v["fs_type"], "lanefs-lib (cache 16 MiB)");

    // The filler and the run directory are gone, and so is their space.
    let t = open_target(&target.parse().unwrap()).unwrap();
    let left = t.readdir(Path::new("")).unwrap();
    assert!(left.is_empty(), "left {left:?}");
    assert!(t.stat(Path::new(FILL_DIR)).is_err());
    let (total, free) = t.space().unwrap();
    assert!((total - free) as f64 <= 0.02 * total as f64, "{} of {total} still in use", total - free);
    t.close().unwrap();
}

#[test]
fn impossible_fills_are_refused_in_one_line() {
    let dir = scratch();
    let img = dir.path().join("never.img");
    let target = format!("lib:{}", img.display());
    for bad in ["0.99", "-0.1", "1", "nan"] {
        let fill = format!("--fill={bad}");
        let e = match args(&["--target", &target, "--workload", "DWAL", &fill]) {
            Ok(a) => lanefs_bench::run(&a).unwrap_err(),
            Err(e) => e,
        };
        assert!(e.contains("--fill") && !e.trim_end().contains('\n'), "{bad}: {e}");
    }
    assert!(!img.exists(), "a refused fill creates no image");
}
