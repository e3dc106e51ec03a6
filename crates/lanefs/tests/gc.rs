//! Segment cleaning on a real image file: a nearly full file system keeps accepting overwrites
//! (the cleaner makes room), says ENOSPC only when the space is really used, keeps every byte,
//! and stays consistent across remounts. Sizes grow with `LANEFS_GC_SCALE` (default 1, quick).
//! With `LANEFS_TEST_NVM=1` every image has a persistent-memory region, `IMAGE.nvm` next to it
//! in its temporary directory (removed with it), used by every mount and fsck of the image.

mod nvm_mode;

use lanefs::device::BlockDevice;
use lanefs::device::{create_image, DeviceOptions, FileDevice};
use lanefs::rng::Rng;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, Ino, MkfsOptions, ROOT};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn scale() -> u64 {
    std::env::var("LANEFS_GC_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1)
}

/// A formatted image file (in /dev/shm when there is one, so the test measures software).
fn image(size: u64, lanes: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    let dir = tempfile::Builder::new().prefix("lanefs-gc-").tempdir_in(base).unwrap();
    let path = dir.path().join("gc.img");
    create_image(&path, size).unwrap();
    let dev = FileDevice::open(&path, DeviceOptions::default()).unwrap();
    Fs::format(&dev, &MkfsOptions { lanes, ..Default::default() }).unwrap();
    (dir, path)
}

fn opts() -> FsOptions {
    FsOptions { cache_bytes: 16 * MIB, checkpoint_interval: None, ..Default::default() }
}

fn mount(path: &std::path::Path) -> Fs {
    mount_with(path, opts())
}

/// nvm mode: the region of the image at `path`.
fn region_of(path: &std::path::Path) -> Option<std::path::PathBuf> {
    nvm_mode::enabled().then(|| path.with_extension("nvm"))
}

fn mount_with(path: &std::path::Path, opts: FsOptions) -> Fs {
    let dev = FileDevice::open(path, DeviceOptions::default()).unwrap();
    let opts = FsOptions { nvm: region_of(path), ..opts };
    let fs = Fs::open(Arc::new(dev) as Arc<dyn BlockDevice>, opts).unwrap();
    assert_eq!(fs.nvm().is_some(), nvm_mode::enabled(), "the NAT is in the region exactly in nvm mode");
    fs
}

fn fsck_clean(path: &std::path::Path) {
    let dev = FileDevice::open(path, DeviceOptions::default()).unwrap();
    let r = fsck(&dev, &FsckOptions { nvm: region_of(path), ..Default::default() }).unwrap();
    assert!(r.is_clean(), "fsck: {:#?}", r.problems);
}

/// Bytes for a write: a pattern from `seed`, different in every 8 bytes.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Files and what they must hold.
struct Model {
    files: Vec<(String, Ino, Vec<u8>)>,
}

impl Model {
    fn verify(&self, fs: &Fs, when: &str) {
        for (name, _, want) in &self.files {
            let a = fs.lookup(ROOT, name.as_bytes()).unwrap_or_else(|e| panic!("{when}: {name}: {e}"));
            assert_eq!(a.size, want.len() as u64, "{when}: size of {name}");
            let mut got = vec![0u8; want.len()];
            let mut off = 0;
            while off < got.len() {
                let n = fs.read_at(a.ino, off as u64, &mut got[off..]).unwrap();
                assert!(n > 0, "{when}: short read of {name} at {off}");
                off += n;
            }
            if got != *want {
                let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
                panic!("{when}: {name} differs first at byte {at}");
            }
        }
    }

    fn relink(&mut self, fs: &Fs) {
        for (name, ino, _) in &mut self.files {
            *ino = fs.lookup(ROOT, name.as_bytes()).unwrap().ino;
        }
    }
}

/// Writes `len` bytes of new files in 1 MiB chunks; returns the files.
fn fill(fs: &Fs, prefix: &str, len: u64, files: usize, seed: u64) -> Vec<(String, Ino, Vec<u8>)> {
    let per = (len / files as u64) & !4095;
    (0..files)
        .map(|i| {
            let name = format!("{prefix}{i}");
            let a = fs.create(ROOT, name.as_bytes(), 0o644, 0, 0).unwrap();
            let data = pattern(seed + i as u64, per as usize);
            for (k, chunk) in data.chunks(MIB as usize).enumerate() {
                fs.write_at(a.ino, k as u64 * MIB, chunk)
                    .unwrap_or_else(|e| panic!("filling {name} at {k} MiB (no ENOSPC expected): {e}"));
            }
            (name, a.ino, data)
        })
        .collect()
}

#[test]
fn nearly_full_image_survives_overwrites_deletes_and_refills() {
    let size = 96 * MIB * scale();
    let (_dir, path) = image(size, 1);
    let fs = mount(&path);
    let st = fs.statfs();
    let free = st.bfree * 4096;
    assert!(free > size / 2, "statfs says only {free} bytes free on a fresh {size}-byte image");

    // 1. Fill to 95% of the free space (LANEFS_GC_FILL percent, for measuring).
    let pct: u64 =
        std::env::var("LANEFS_GC_FILL").ok().and_then(|s| s.parse().ok()).unwrap_or(95).clamp(10, 95);
    let mut model = Model { files: fill(&fs, "f", free * pct / 100, 8, 1) };
    let after_fill = fs.statfs();
    let left = free * (100 - pct) / 100;
    assert!(after_fill.bfree * 4096 <= left + 4 * MIB, "statfs after the fill: {after_fill:?}");

    // 2. Overwrite random ranges of the files for 5x the image size, fsyncing now and then.
    let mut rng = Rng::new(0x6C61_6E65);
    let mut written = 0u64;
    let mut n = 0u64;
    let started = std::time::Instant::now();
    while written < 5 * size {
        let f = rng.below(model.files.len() as u64) as usize;
        let (name, ino, data) = &mut model.files[f];
        let len = 4096 * (1 + rng.below(16)) as usize - rng.below(2) as usize * 100;
        let off = rng.below((data.len() - len) as u64) as usize;
        let bytes = pattern(1000 + n, len);
        fs.write_at(*ino, off as u64, &bytes)
            .unwrap_or_else(|e| panic!("overwrite {n} of {name} at {off} after {written} bytes: {e}"));
        data[off..off + len].copy_from_slice(&bytes);
        if rng.below(64) == 0 {
            fs.fsync(*ino, rng.below(2) == 0).unwrap();
        }
        written += len as u64;
        n += 1;
    }
    let stats = fs.io_stats();
    assert!(stats.segments_cleaned > 0 && stats.cleaning_bytes > 0, "no cleaning happened: {stats:?}");
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "overwrites at {pct}% full: {} MiB by users in {secs:.1} s ({:.0} writes/s, {:.1} MiB/s), \
         write amplification {:.2}, {stats:?}",
        written / MIB,
        n as f64 / secs,
        written as f64 / MIB as f64 / secs,
        stats.write_amplification()
    );
    model.verify(&fs, "after the overwrites");
    fs.unmount().unwrap();
    fsck_clean(&path);

    // 3. Remount, delete half, write as much again.
    let fs = mount(&path);
    model.relink(&fs);
    model.verify(&fs, "after remount");
    let gone: Vec<_> = model.files.drain(..model.files.len() / 2).collect();
    let freed: u64 = gone.iter().map(|f| f.2.len() as u64).sum();
    for (name, _, _) in &gone {
        fs.unlink(ROOT, name.as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    model.files.extend(fill(&fs, "g", freed * 95 / 100, 4, 50));
    model.verify(&fs, "after the refill");

    // 4. Keep writing until the space is gone: ENOSPC must come only then.
    let st = fs.statfs();
    let before = st.bfree * 4096;
    let last = fs.create(ROOT, b"last", 0o644, 0, 0).unwrap();
    let chunk = pattern(7, 256 * 1024);
    let mut got = 0u64;
    let err = loop {
        match fs.write_at(last.ino, got, &chunk) {
            Ok(n) => got += n as u64,
            Err(e) => break e,
        }
        assert!(got <= before + 64 * MIB, "wrote {got} bytes, more than the {before} statfs reported free");
    };
    assert_eq!(err.to_errno(), libc::ENOSPC, "{err}");
    eprintln!("final fill: {got} bytes written, statfs had {before} free");
    assert!(
        got + 4 * MIB >= before * 97 / 100,
        "ENOSPC after {got} bytes while statfs reported {before} free"
    );
    model.files.push(("last".into(), last.ino, {
        let mut v = Vec::with_capacity(got as usize);
        while (v.len() as u64) < got {
            v.extend_from_slice(&chunk);
        }
        v.truncate(got as usize);
        v
    }));
    model.verify(&fs, "at ENOSPC");
    // Full, yet deleting works and makes the space writable again.
    fs.unlink(ROOT, b"last").unwrap();
    model.files.pop();
    fs.sync().unwrap();
    let again = fs.statfs().bfree * 4096;
    assert!(again + 4 * MIB >= got, "deleting {got} bytes gave back only {again}");
    model.files.extend(fill(&fs, "h", again * 9 / 10, 2, 90));
    model.verify(&fs, "after emptying a full file system");
    fs.unmount().unwrap();
    fsck_clean(&path);
    let fs = mount(&path);
    model.relink(&fs);
    model.verify(&fs, "final remount");
    fs.unmount().unwrap();
}

#[test]
fn cleaning_runs_while_threads_overwrite_and_fsync() {
    let size = 64 * MIB;
    let (_dir, path) = image(size, 2);
    let fs = Arc::new(mount(&path));
    let free = fs.statfs().bfree * 4096;
    let files = fill(&fs, "t", free * 85 / 100, 4, 3);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = files
        .into_iter()
        .enumerate()
        .map(|(t, (name, ino, mut data))| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 11);
                for n in 0..(3 * size / 4096 / 4 / 8) {
                    let len = 4096 * (1 + rng.below(8)) as usize;
                    let off = (rng.below((data.len() - len) as u64) as usize) & !4095;
                    let bytes = pattern(t as u64 * 1_000_000 + n, len);
                    fs.write_at(ino, off as u64, &bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
                    data[off..off + len].copy_from_slice(&bytes);
                    if n % 50 == 0 {
                        fs.fsync(ino, false).unwrap();
                    }
                }
                (name, ino, data)
            })
        })
        .collect();
    let cleaner = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut cleaned = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                cleaned += fs.clean().unwrap();
            }
            cleaned
        })
    };
    let model = Model { files: writers.into_iter().map(|w| w.join().unwrap()).collect() };
    stop.store(true, std::sync::atomic::Ordering::Release);
    let cleaned = cleaner.join().unwrap();
    assert!(cleaned > 0, "the cleaner thread emptied nothing");
    model.verify(&fs, "after concurrent cleaning");
    let fs = Arc::into_inner(fs).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&path);
    let fs = mount(&path);
    let mut model = model;
    model.relink(&fs);
    model.verify(&fs, "after remount");
    fs.unmount().unwrap();
}

#[test]
fn freed_segments_are_punched_out_of_the_image_file() {
    let (_dir, path) = image(64 * MIB, 1);
    let fs = mount(&path);
    let files = fill(&fs, "p", 24 * MIB, 2, 5);
    fs.sync().unwrap();
    let used =
        |p: &std::path::Path| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap()) * 512;
    let before = used(&path);
    for (name, _, _) in &files {
        fs.unlink(ROOT, name.as_bytes()).unwrap();
    }
    // The deleting checkpoint makes the segments prefree; the next one frees them, the ones
    // after discard those still free, a quarter of the free map at a time (lazy discard:
    // `SegmentTable::checkpoint_done`).
    for _ in 0..5 {
        fs.sync().unwrap();
    }
    let after = used(&path);
    assert!(
        after + 16 * MIB <= before,
        "image still uses {after} bytes (was {before}) after deleting 24 MiB"
    );
    fs.unmount().unwrap();
    fsck_clean(&path);
}

/// A block enters a file's mapping only once it is written: readers that miss the page cache
/// (a tiny cache, evicted by the writer) must never see a moved block, or a block an fsync or
/// checkpoint placed, before its bytes are there. The writer rewrites pages with the bytes they
/// already hold, so every read must return the original pattern.
#[test]
fn readers_never_see_a_moved_or_placed_block_before_it_is_written() {
    let (_dir, path) = image(64 * MIB, 1);
    let fs = Arc::new(mount_with(
        &path,
        FsOptions { cache_bytes: 256 << 10, checkpoint_interval: None, ..Default::default() },
    ));
    let size = 8 * MIB as usize;
    let data = Arc::new(pattern(77, size));
    let f = fs.create(ROOT, b"static", 0o644, 0, 0).unwrap().ino;
    for (k, chunk) in data.chunks(MIB as usize).enumerate() {
        fs.write_at(f, k as u64 * MIB, chunk).unwrap();
    }
    fs.sync().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pages = (size / 4096) as u64;
    let writer = {
        let (fs, data, stop) = (fs.clone(), data.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::new(5);
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let p = rng.below(pages) as usize;
                fs.write_at(f, p as u64 * 4096, &data[p * 4096..(p + 1) * 4096]).unwrap();
                if n.is_multiple_of(16) {
                    fs.fsync(f, true).unwrap();
                }
                n += 1;
            }
        })
    };
    let cleaner = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut cleaned = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                cleaned += fs.clean().unwrap();
            }
            cleaned
        })
    };
    let mut rng = Rng::new(9);
    let mut buf = vec![0u8; 4096];
    let reads = 60_000 * scale();
    for i in 0..reads {
        let p = rng.below(pages) as usize;
        assert_eq!(fs.read_at(f, p as u64 * 4096, &mut buf).unwrap(), 4096);
        if buf[..] != data[p * 4096..(p + 1) * 4096] {
            stop.store(true, std::sync::atomic::Ordering::Release);
            panic!("read {i}: page {p} does not hold its bytes (a block was read before it was written)");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    writer.join().unwrap();
    let cleaned = cleaner.join().unwrap();
    assert!(cleaned > 0, "the cleaner moved nothing while the reader read");
    let fs = Arc::into_inner(fs).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&path);
}

/// With free segments short and nobody writing, the background cleaner empties segments by
/// itself (cost-benefit victims), and the content stays exact.
#[test]
fn an_idle_file_system_cleans_in_the_background() {
    let (_dir, path) = image(64 * MIB, 1);
    let fs = mount(&path);
    let free = fs.statfs().bfree * 4096;
    let mut model = Model { files: fill(&fs, "b", free * 80 / 100, 4, 21) };
    // Overwrite a third of every file (blocks die all over the segments), then checkpoint.
    let mut rng = Rng::new(3);
    for (_, ino, data) in &mut model.files {
        for _ in 0..(data.len() / 4096 / 3) {
            let p = rng.below((data.len() / 4096) as u64) as usize;
            let bytes = pattern(p as u64 + 500, 4096);
            fs.write_at(*ino, p as u64 * 4096, &bytes).unwrap();
            data[p * 4096..(p + 1) * 4096].copy_from_slice(&bytes);
        }
    }
    fs.sync().unwrap();
    let before = fs.io_stats();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while fs.io_stats().segments_cleaned == before.segments_cleaned {
        assert!(std::time::Instant::now() < deadline, "no background cleaning in 20 s: {:?}", fs.io_stats());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let after = fs.io_stats();
    assert!(after.cleaning_rounds > before.cleaning_rounds);
    assert_eq!(after.user_bytes, before.user_bytes, "nobody wrote meanwhile");
    model.verify(&fs, "after background cleaning");
    fs.unmount().unwrap();
    fsck_clean(&path);
}

/// Appends and truncations racing with checkpoints and writeback (DWAL with its wrap): a block
/// a truncate drops while a checkpoint is being written belongs to that checkpoint's tree and
/// must die exactly once, when a later tree drops it.
#[test]
fn truncates_racing_with_checkpoints_retire_each_block_once() {
    let (_dir, path) = image(64 * MIB, 2);
    let fs = Arc::new(mount_with(
        &path,
        FsOptions { cache_bytes: 1 << 20, checkpoint_interval: None, ..Default::default() },
    ));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appenders: Vec<_> = (0..2)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let f = fs.create(ROOT, format!("a{t}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                let block = pattern(t, 4096);
                for round in 0..(1500 * scale()) {
                    for k in 0..(64 + round % 64) {
                        fs.write_at(f, k * 4096, &block).unwrap_or_else(|e| panic!("append: {e}"));
                    }
                    if round % 3 == 0 {
                        fs.fsync(f, true).unwrap();
                    }
                    fs.truncate(f, 0).unwrap_or_else(|e| panic!("truncate: {e}"));
                }
            })
        })
        .collect();
    let syncer = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                fs.sync().unwrap_or_else(|e| panic!("sync: {e}"));
            }
        })
    };
    for a in appenders {
        a.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    syncer.join().unwrap();
    let fs = Arc::into_inner(fs).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&path);
}
