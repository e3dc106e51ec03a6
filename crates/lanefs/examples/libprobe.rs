//! Quick library-level probe: ops/s of three FxMark-shaped workloads at 1 and 2 threads on an
//! image file. `cargo run --release -p lanefs --example libprobe -- /dev/shm/probe.img 3`
//! (the image is created and formatted; the last argument is seconds per run). The full
//! harness is `lanefs bench`; this is for a quick look while developing.

use lanefs::device::{create_image, DeviceOptions, FileDevice, IoChoice};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn run(name: &str, threads: usize, secs: u64, fs: &Arc<Fs>, op: impl Fn(&Fs, usize, u64) + Sync) -> f64 {
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, total, fs, op) = (&stop, &total, fs.clone(), &op);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    op(&fs, t, i);
                    i += 1;
                }
                total.fetch_add(i, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs(secs));
        stop.store(true, Ordering::Relaxed);
    });
    let ops = total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    println!("{name:6} {threads}T {ops:>12.0} ops/s");
    ops
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or_else(|| "/dev/shm/lanefs-probe.img".into());
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    for threads in [1usize, 2] {
        let _ = std::fs::remove_file(&path);
        create_image(&path, 2 << 30).unwrap();
        let dev = Arc::new(FileDevice::open(&path, DeviceOptions { io: IoChoice::Auto }).unwrap());
        Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
        let fs = Arc::new(Fs::open(dev, FsOptions::default()).unwrap());
        // DWOM: overwrite disjoint 4 KiB blocks of one shared file.
        let shared = fs.create(ROOT, b"shared", 0o644, 0, 0).unwrap().ino;
        fs.write_at(shared, 0, &vec![1u8; 64 << 20]).unwrap();
        let handles: Vec<_> = (0..threads).map(|_| fs.open_file(shared).unwrap()).collect();
        let block = vec![7u8; 4096];
        run("DWOM", threads, secs, &fs, |_, t, i| {
            let blk = (i * threads as u64 + t as u64) % (16384 / threads as u64 * threads as u64);
            handles[t].write_at(blk * 4096, &block).unwrap();
        });
        drop(handles);
        // DWSL: append 4 KiB to a private file and fsync.
        let privs: Vec<_> = (0..threads)
            .map(|t| {
                let ino = fs.create(ROOT, format!("p{t}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                fs.open_file(ino).unwrap()
            })
            .collect();
        run("DWSL", threads, secs, &fs, |_, t, i| {
            privs[t].write_at(i * 4096, &block).unwrap();
            privs[t].fsync(false).unwrap();
        });
        drop(privs);
        // MWCM: create empty files in one shared directory.
        let dir = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
        run("MWCM", threads, secs, &fs, |fs, t, i| {
            fs.create(dir, format!("f{t}-{i}").as_bytes(), 0o644, 0, 0).unwrap();
        });
        match Arc::try_unwrap(fs) {
            Ok(fs) => fs.unmount().unwrap(),
            Err(_) => unreachable!("all threads joined"),
        }
    }
    let _ = std::fs::remove_file(&path);
}
