//! A small FxMark-style driver for any directory (a lanefs mount, tmpfs, ext4, ...), used to
//! measure the FUSE adapter until `lanefs bench` covers mounts:
//!
//! - DWOM: each thread overwrites its own 4 KiB block of one shared file (pwrite).
//! - DWSL: each thread overwrites 4 KiB of its own file and fsyncs it.
//! - MWCM: each thread creates empty files in one shared directory.
//! - DWOM-direct (`dwomd`): DWOM with O_DIRECT, so that the kernel does not serialize the writers
//!   (lanefs answers O_DIRECT opens with FOPEN_PARALLEL_DIRECT_WRITES).
//!
//! `cargo run --release -p lanefs-fuse --example fxmark_lite -- DIR WORKLOAD THREADS SECONDS`
//! prints `WORKLOAD THREADS ops/s`. It makes a fresh subdirectory of DIR and removes it after.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: fxmark_lite DIR dwom|dwomd|dwsl|mwcm THREADS SECONDS");
        std::process::exit(2);
    }
    let threads: usize = args[3].parse().unwrap_or(0);
    let secs: f64 = args[4].parse().unwrap_or(0.0);
    if threads == 0 || secs <= 0.0 {
        eprintln!("fxmark_lite: THREADS and SECONDS must be positive");
        std::process::exit(2);
    }
    let work = Path::new(&args[1]).join(format!("fxmark-{}", std::process::id()));
    match run(&work, &args[2], threads, Duration::from_secs_f64(secs)) {
        Ok(ops) => println!("{} {threads} {:.0}", args[2], ops),
        Err(e) => {
            eprintln!("fxmark_lite: {e}");
            let _ = fs::remove_dir_all(&work);
            std::process::exit(1);
        }
    }
    let _ = fs::remove_dir_all(&work);
}

fn run(work: &Path, workload: &str, threads: usize, dur: Duration) -> std::io::Result<f64> {
    fs::create_dir(work)?;
    let shared = work.join("shared");
    match workload {
        "dwom" | "dwomd" => File::create(&shared)?.set_len((threads * 4096) as u64)?,
        "mwcm" => fs::create_dir(&shared)?,
        "dwsl" => {}
        w => return Err(std::io::Error::other(format!("unknown workload {w}"))),
    }
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(threads + 1));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (stop, barrier, work, w) =
                (stop.clone(), barrier.clone(), work.to_path_buf(), workload.to_string());
            std::thread::spawn(move || worker(&w, t, &work, &stop, &barrier))
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    std::thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    let mut total = 0u64;
    for h in hs {
        total += h.join().map_err(|_| std::io::Error::other("worker panicked"))??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

fn worker(w: &str, t: usize, work: &Path, stop: &AtomicBool, barrier: &Barrier) -> std::io::Result<u64> {
    let block = [t as u8; 4096];
    let mut n = 0u64;
    match w {
        "dwom" => {
            let f = OpenOptions::new().write(true).open(work.join("shared"))?;
            barrier.wait();
            while !stop.load(Ordering::Relaxed) {
                f.write_all_at(&block, (t * 4096) as u64)?;
                n += 1;
            }
        }
        "dwomd" => {
            use std::os::unix::fs::OpenOptionsExt;
            let f = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(work.join("shared"))?;
            // O_DIRECT wants an aligned buffer: a 4 KiB-aligned window of an 8 KiB one.
            let buf = vec![t as u8; 8192];
            let off = (4096 - buf.as_ptr() as usize % 4096) % 4096;
            let block = &buf[off..off + 4096];
            barrier.wait();
            while !stop.load(Ordering::Relaxed) {
                f.write_all_at(block, (t * 4096) as u64)?;
                n += 1;
            }
        }
        "dwsl" => {
            let f = File::create(work.join(format!("private-{t}")))?;
            barrier.wait();
            while !stop.load(Ordering::Relaxed) {
                f.write_all_at(&block, 0)?;
                f.sync_all()?;
                n += 1;
            }
        }
        _ => {
            let dir: PathBuf = work.join("shared");
            barrier.wait();
            while !stop.load(Ordering::Relaxed) {
                File::create(dir.join(format!("t{t}-{n}")))?;
                n += 1;
            }
        }
    }
    Ok(n)
}
