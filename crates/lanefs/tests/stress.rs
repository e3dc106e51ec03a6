//! Deadlock and data stress through the library (issue 14, "the mount never hangs"): many threads
//! work on one file whose pages start cold (written, synced, and the file system closed and
//! reopened with a small page cache, so that partial-page writes load their base from the device
//! and writeback and eviction run the whole time), mixing sub-page, full-page and unaligned
//! writes, reads, truncates, fallocate (allocate and KEEP_SIZE), punch (PUNCH_HOLE|KEEP_SIZE),
//! fsync, fdatasync and forced checkpoints (`Fs::sync`), on an image small enough that the cleaner
//! moves the file's blocks meanwhile.
//!
//! The file is laid out so that every byte has exactly one owner and the expected contents stay
//! exact under concurrency:
//!
//! ```text
//! [0, STABLE_END)            writer w owns [w * REGION, (w + 1) * REGION): writes, punches,
//!                            fallocates, reads and checks its own bytes against its model
//! [STABLE_END - STABLE, ..)  the stable zone: written once at set-up; readers check every byte
//! [TAIL, TAIL + TAIL_ZONE]   the tail thread owns these bytes and the file size: truncates,
//!                            writes, allocates (growing the size), punches, checks
//! ```
//!
//! Nothing else writes a writer's region, so its model is exact at any moment and it checks
//! reads as it goes. Afterwards: every model is checked on the live file system, again after a
//! sync, the image is closed and fsck must find it clean, then it is reopened (cold again) and
//! every byte and the size are checked, once more after a sync, and fsck runs again.
//!
//! A watchdog (tests/watchdog) fails the test when any thread's operation counter stands still
//! for 10 s, printing every thread's stack (gdb, and /proc wchan as a fallback) first.
//!
//! `LANEFS_STRESS_SECS` sets the run time (15 s by default, CI's quick mode; `scripts/stress`
//! runs 600 in full mode), `LANEFS_STRESS_SEED` the operation choices (the seed is printed; the
//! interleaving is the machine's), `LANEFS_STRESS_IMAGE_MIB` the image size (160; 1024 keeps the
//! cleaner idle). With `LANEFS_TEST_NVM=1` the file system keeps its NAT and journals in a
//! persistent-memory region.

mod nvm_mode;
mod stress_data;
mod watchdog;

use lanefs::device::{create_image, BlockDevice, DeviceOptions, FileDevice};
use lanefs::rng::Rng;
use lanefs::FallocMode;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, Ino, MkfsOptions, ROOT};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stress_data::{fill_pattern, random_bytes, secs_from_env};
use watchdog::{Progress, StopOnPanic, Tracker, Watchdog};

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;
/// Writer threads, each with its own region.
const WRITERS: u64 = 4;
const REGION: u64 = 4 * MIB;
/// Bytes nobody writes after set-up, after the writers' regions.
const STABLE: u64 = 24 * MIB;
/// Where the tail thread's zone (and its control of the size) begins; page-aligned, so that a
/// truncate's partial page never lies in a writer's region.
const TAIL: u64 = WRITERS * REGION + STABLE;
/// The size stays within [TAIL, TAIL + TAIL_ZONE].
const TAIL_ZONE: u64 = 8 * MIB;
/// A page cache far smaller than the file (dirty pages past half of it are written back, clean
/// ones past all of it evicted), so that pages go cold again during the run.
const SMALL_CACHE: u64 = MIB;
/// Small enough for the cleaner to run during the run (the file takes 56 MiB of it, and
/// every overwrite leaves garbage behind).
const IMAGE_BYTES: u64 = 160 * MIB;

/// The image (a file on disk, read and written as the mount does: io_uring and O_DIRECT where
/// the file system allows) and, in nvm mode, its region.
struct Image {
    _dir: tempfile::TempDir,
    path: PathBuf,
    region: Option<nvm_mode::Region>,
}

impl Image {
    fn new() -> Image {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stress.img");
        // LANEFS_STRESS_IMAGE_MIB: another size, to tell failures that need the cleaner (which
        // a large image keeps idle) from those that do not.
        let bytes = std::env::var("LANEFS_STRESS_IMAGE_MIB")
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(IMAGE_BYTES, |m: u64| m * MIB);
        create_image(&path, bytes).unwrap();
        let dev = FileDevice::open(&path, DeviceOptions::default()).unwrap();
        Fs::format(&dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
        Image { _dir: dir, path, region: nvm_mode::Region::if_enabled() }
    }

    fn dev(&self) -> Arc<dyn BlockDevice> {
        Arc::new(FileDevice::open(&self.path, DeviceOptions::default()).unwrap())
    }

    fn mount(&self, opts: FsOptions) -> Fs {
        let fs = Fs::open(self.dev(), nvm_mode::with_region(opts, self.region.as_ref())).unwrap();
        assert_eq!(fs.nvm().is_some(), self.region.is_some(), "nvm mode: the NAT is in the region");
        fs
    }

    /// fsck of the closed image (with its region in nvm mode) must find nothing wrong.
    fn fsck_clean(&self, when: &str) {
        let nvm = self.region.as_ref().map(|r| r.path().to_path_buf());
        let r = fsck(&*self.dev(), &FsckOptions { nvm, ..Default::default() }).unwrap();
        assert!(r.is_clean(), "fsck {when}: {:#?}", r.problems);
    }
}

/// What one writer's region holds, and the operations it ran.
struct WriterModel {
    base: u64,
    bytes: Vec<u8>,
    ops: u64,
}

/// The tail zone's bytes: `bytes.len()` is the file size minus `TAIL`.
struct TailModel {
    bytes: Vec<u8>,
    ops: u64,
}

/// Reads `[off, off + want.len())` and compares; panics with the first differing offset.
fn check_range(fs: &Fs, ino: Ino, off: u64, want: &[u8], what: &str) {
    let mut got = vec![0u8; want.len()];
    let n = fs.read_at(ino, off, &mut got).unwrap_or_else(|e| panic!("{what}: read at {off}: {e}"));
    assert_eq!(n, want.len(), "{what}: short read at {off}");
    if got != want {
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!(
            "{what}: byte {} (file offset {}) reads {:#04x}, expected {:#04x} ({} of {} bytes differ)",
            i,
            off + i as u64,
            got[i],
            want[i],
            got.iter().zip(want).filter(|(a, b)| a != b).count(),
            want.len()
        );
    }
}

/// Every byte of every model, and the size.
fn check_all(fs: &Fs, ino: Ino, writers: &[WriterModel], tail: &TailModel, when: &str) {
    for w in writers {
        for (k, chunk) in w.bytes.chunks(MIB as usize).enumerate() {
            check_range(fs, ino, w.base + k as u64 * MIB, chunk, &format!("{when}: region at {}", w.base));
        }
    }
    let mut stable = vec![0u8; STABLE as usize];
    fill_pattern(WRITERS * REGION, &mut stable);
    check_range(fs, ino, WRITERS * REGION, &stable, &format!("{when}: stable zone"));
    check_range(fs, ino, TAIL, &tail.bytes, &format!("{when}: tail zone"));
    assert_eq!(fs.getattr(ino).unwrap().size, TAIL + tail.bytes.len() as u64, "{when}: size");
}

struct Ctx {
    fs: Arc<Fs>,
    ino: Ino,
    stop: Arc<AtomicBool>,
    deadline: Instant,
    seed: u64,
}

impl Ctx {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Acquire) && Instant::now() < self.deadline
    }
}

/// A random byte range inside `[lo, hi)` of at most `max` bytes, sometimes page-aligned.
fn pick_range(rng: &mut Rng, lo: u64, hi: u64, max: u64) -> (u64, u64) {
    let len = 1 + rng.below(max.min(hi - lo));
    let mut off = lo + rng.below(hi - lo - len + 1);
    if rng.chance(1, 3) {
        off -= (off - lo) % PAGE;
    }
    (off, len)
}

fn writer(ctx: &Ctx, w: u64, t: &Tracker, mut model: WriterModel) -> WriterModel {
    let _g = StopOnPanic(ctx.stop.clone(), t.clone());
    let mut rng = Rng::new(lanefs::rng::derive(ctx.seed, w));
    let (fs, ino) = (&*ctx.fs, ctx.ino);
    // Half the calls go through an open handle (as FUSE file handles do), half by inode.
    let h = fs.open_file(ino).unwrap();
    let (lo, hi) = (model.base, model.base + REGION);
    let what = |op: &str, off: u64, len: u64| format!("writer {w} (seed {}): {op} [{off}, +{len})", ctx.seed);
    while ctx.running() {
        let roll = rng.below(100);
        match roll {
            // Sub-page writes, like fio's 1 KiB writes and PostgreSQL's 8 KiB blocks over
            // 4 KiB pages: most pages are partial and cold.
            0..=34 => {
                let (off, len) = pick_range(&mut rng, lo, hi, 3000);
                let data = random_bytes(&mut rng, len as usize);
                t.step("write (sub-page)", || {
                    let r =
                        if rng.chance(1, 2) { h.write_at(off, &data) } else { fs.write_at(ino, off, &data) };
                    assert_eq!(r.unwrap_or_else(|e| panic!("{}: {e}", what("write", off, len))), data.len());
                });
                model.bytes[(off - lo) as usize..(off - lo + len) as usize].copy_from_slice(&data);
            }
            // Whole pages, 1 to 16 (fio's 64 KiB).
            35..=54 => {
                let pages = 1 + rng.below(16);
                let off = lo + rng.below(REGION / PAGE - pages + 1) * PAGE;
                let data = random_bytes(&mut rng, (pages * PAGE) as usize);
                t.step("write (pages)", || {
                    fs.write_at(ino, off, &data).unwrap_or_else(|e| panic!("{}: {e}", what("write", off, 0)))
                });
                model.bytes[(off - lo) as usize..(off - lo) as usize + data.len()].copy_from_slice(&data);
            }
            // Unaligned writes spanning pages: a partial page at each end.
            55..=62 => {
                let (off, len) = pick_range(&mut rng, lo, hi, 70_000);
                let data = random_bytes(&mut rng, len as usize);
                t.step("write (span)", || {
                    h.write_at(off, &data).unwrap_or_else(|e| panic!("{}: {e}", what("write", off, len)))
                });
                model.bytes[(off - lo) as usize..(off - lo + len) as usize].copy_from_slice(&data);
            }
            // Reads of its own bytes, checked.
            63..=82 => {
                let (off, len) = pick_range(&mut rng, lo, hi, 128 * 1024);
                let want = &model.bytes[(off - lo) as usize..(off - lo + len) as usize];
                t.step("read", || check_range(fs, ino, off, want, &what("read", off, len)));
            }
            // Punch: whole pages dropped, partial edge pages zeroed (loaded if cold).
            83..=87 => {
                let (off, len) = pick_range(&mut rng, lo, hi, 40_000);
                t.step("punch", || {
                    fs.fallocate(ino, FallocMode::PUNCH_HOLE | FallocMode::KEEP_SIZE, off, len)
                        .unwrap_or_else(|e| panic!("{}: {e}", what("punch", off, len)))
                });
                model.bytes[(off - lo) as usize..(off - lo + len) as usize].fill(0);
            }
            // Allocation inside the file changes no byte and (the region lies below the size)
            // not the size either, with or without KEEP_SIZE.
            88..=91 => {
                let (off, len) = pick_range(&mut rng, lo, hi, 200_000);
                let mode = if rng.chance(1, 2) { FallocMode::KEEP_SIZE } else { FallocMode::empty() };
                t.step("fallocate", || {
                    fs.fallocate(ino, mode, off, len)
                        .unwrap_or_else(|e| panic!("{}: {e}", what("fallocate", off, len)))
                });
            }
            92..=95 => {
                let datasync = rng.chance(1, 2);
                t.step("fsync", || {
                    let r = if datasync { h.fsync(true) } else { fs.fsync(ino, false) };
                    r.unwrap_or_else(|e| panic!("writer {w}: fsync: {e}"))
                });
            }
            // Now and then the whole region, read and checked: most of it is cold by now.
            _ => {
                t.step("read (region)", || {
                    for (k, chunk) in model.bytes.chunks(MIB as usize).enumerate() {
                        let off = lo + k as u64 * MIB;
                        check_range(fs, ino, off, chunk, &what("read (region)", off, MIB));
                    }
                });
            }
        }
        model.ops += 1;
    }
    model
}

/// Owns the bytes from `TAIL` on and the size.
fn tail(ctx: &Ctx, t: &Tracker, mut model: TailModel) -> TailModel {
    let _g = StopOnPanic(ctx.stop.clone(), t.clone());
    let mut rng = Rng::new(lanefs::rng::derive(ctx.seed, 100));
    let (fs, ino) = (&*ctx.fs, ctx.ino);
    let end = TAIL + TAIL_ZONE;
    let what = |op: &str, off: u64, len: u64| format!("tail (seed {}): {op} [{off}, +{len})", ctx.seed);
    while ctx.running() {
        let size = TAIL + model.bytes.len() as u64;
        match rng.below(100) {
            // Truncate down or up, to a page boundary or inside a page (whose tail then reads
            // as zeros: the partial page is loaded if cold).
            0..=19 => {
                let mut to = TAIL + rng.below(TAIL_ZONE + 1);
                if rng.chance(1, 2) {
                    to -= (to - TAIL) % PAGE;
                }
                t.step("truncate", || {
                    fs.truncate(ino, to).unwrap_or_else(|e| panic!("{}: {e}", what("truncate", to, 0)))
                });
                model.bytes.resize((to - TAIL) as usize, 0);
            }
            20..=44 => {
                let (off, len) = pick_range(&mut rng, TAIL, end, 70_000);
                let data = random_bytes(&mut rng, len as usize);
                t.step("write", || {
                    fs.write_at(ino, off, &data)
                        .unwrap_or_else(|e| panic!("{}: {e}", what("write", off, len)))
                });
                let (a, b) = ((off - TAIL) as usize, (off - TAIL + len) as usize);
                if model.bytes.len() < b {
                    model.bytes.resize(b, 0);
                }
                model.bytes[a..b].copy_from_slice(&data);
            }
            // Allocation; without KEEP_SIZE it may grow the file (with zeros).
            45..=54 => {
                let (off, len) = pick_range(&mut rng, TAIL, end, 300_000);
                let keep = rng.chance(1, 2);
                let mode = if keep { FallocMode::KEEP_SIZE } else { FallocMode::empty() };
                t.step("fallocate", || {
                    fs.fallocate(ino, mode, off, len)
                        .unwrap_or_else(|e| panic!("{}: {e}", what("fallocate", off, len)))
                });
                if !keep && off + len > size {
                    model.bytes.resize((off + len - TAIL) as usize, 0);
                }
            }
            55..=64 => {
                let (off, len) = pick_range(&mut rng, TAIL, end, 100_000);
                t.step("punch", || {
                    fs.fallocate(ino, FallocMode::PUNCH_HOLE | FallocMode::KEEP_SIZE, off, len)
                        .unwrap_or_else(|e| panic!("{}: {e}", what("punch", off, len)))
                });
                let (a, b) = ((off - TAIL) as usize, ((off + len).min(size) - TAIL) as usize);
                if a < b {
                    model.bytes[a..b].fill(0);
                }
            }
            // A read that may run past the end: it returns the bytes up to the size, no more.
            65..=89 => {
                let (off, len) = pick_range(&mut rng, TAIL, end, 128 * 1024);
                t.step("read", || {
                    let mut got = vec![0u8; len as usize];
                    let n = fs
                        .read_at(ino, off, &mut got)
                        .unwrap_or_else(|e| panic!("{}: {e}", what("read", off, len)));
                    let want_n = size.saturating_sub(off).min(len) as usize;
                    assert_eq!(n, want_n, "{}: the size is {size}", what("read", off, len));
                    let a = ((off - TAIL) as usize).min(model.bytes.len());
                    assert!(got[..n] == model.bytes[a..a + n], "{}: contents differ", what("read", off, len));
                });
            }
            90..=94 => {
                t.step("getattr", || {
                    let got = fs.getattr(ino).unwrap().size;
                    assert_eq!(got, size, "tail (seed {}): size", ctx.seed);
                });
            }
            _ => t.step("fsync", || fs.fsync(ino, rng.chance(1, 2)).unwrap()),
        }
        model.ops += 1;
    }
    model
}

/// Reads anywhere below the tail: the stable zone must read as set up, and nothing below the
/// tail may read short (the size never drops below it).
fn reader(ctx: &Ctx, r: u64, t: &Tracker) -> u64 {
    let _g = StopOnPanic(ctx.stop.clone(), t.clone());
    let mut rng = Rng::new(lanefs::rng::derive(ctx.seed, 200 + r));
    let (fs, ino) = (&*ctx.fs, ctx.ino);
    let h = fs.open_file(ino).unwrap();
    let stable_lo = WRITERS * REGION;
    let mut ops = 0;
    while ctx.running() {
        let (off, len) = pick_range(&mut rng, 0, TAIL, 256 * 1024);
        let mut got = vec![0u8; len as usize];
        let n = t.step("read", || h.read_at(off, &mut got).unwrap());
        assert_eq!(n, len as usize, "reader {r} (seed {}): short read at {off} below the tail", ctx.seed);
        let (a, b) = (off.max(stable_lo), off + len);
        if a < b {
            let mut want = vec![0u8; (b - a) as usize];
            fill_pattern(a, &mut want);
            let g = &got[(a - off) as usize..(b - off) as usize];
            if g != want.as_slice() {
                let i = g.iter().zip(&want).position(|(x, y)| x != y).unwrap();
                panic!("reader {r} (seed {}): stable byte at {} changed", ctx.seed, a + i as u64);
            }
        }
        ops += 1;
    }
    ops
}

fn fsyncer(ctx: &Ctx, t: &Tracker) -> u64 {
    let _g = StopOnPanic(ctx.stop.clone(), t.clone());
    let mut rng = Rng::new(lanefs::rng::derive(ctx.seed, 300));
    let mut ops = 0;
    while ctx.running() {
        // Mostly the file; sometimes the root directory (a namespace fsync racing data ones).
        let (ino, datasync) = if rng.chance(1, 10) { (ROOT, false) } else { (ctx.ino, rng.chance(1, 2)) };
        t.step("fsync", || ctx.fs.fsync(ino, datasync).unwrap_or_else(|e| panic!("fsync {ino}: {e}")));
        ops += 1;
        // Short pauses: dirty pages pile up between fsyncs, so that writeback runs too.
        std::thread::sleep(Duration::from_millis(rng.below(20)));
    }
    ops
}

/// Forced checkpoints, as `sync(2)` asks for them. (Cleaning is not forced here: `Fs::clean`
/// cleans until no victim is left, which under these writers takes many rounds and longer than
/// the watchdog's limit; the image is small instead, so that the cleaner runs on its own and
/// moves the file's blocks under partial-page loads.)
fn checkpointer(ctx: &Ctx, t: &Tracker) -> u64 {
    let _g = StopOnPanic(ctx.stop.clone(), t.clone());
    let mut rng = Rng::new(lanefs::rng::derive(ctx.seed, 400));
    let mut ops = 0;
    while ctx.running() {
        t.step("sync (checkpoint)", || ctx.fs.sync().unwrap_or_else(|e| panic!("sync: {e}")));
        ops += 1;
        // A pause between checkpoints, so that the others run between drains too.
        std::thread::sleep(Duration::from_millis(rng.below(150)));
    }
    ops
}

#[test]
fn stress_one_cold_file() {
    let secs = secs_from_env();
    let seed = std::env::var("LANEFS_STRESS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    let mode = if nvm_mode::enabled() { "nvm" } else { "plain" };
    eprintln!("stress: {secs} s, seed {seed} (LANEFS_STRESS_SEED), mode {mode}");
    let img = Image::new();
    let progress = Progress::new();
    let main = progress.tracker("main");
    // On a hang the process exits without unwinding: remove the image and region first.
    let cleanup_paths: Vec<PathBuf> =
        [Some(img.path.clone()), img.region.as_ref().map(|r| r.path().to_path_buf())]
            .into_iter()
            .flatten()
            .collect();
    let _dog = Watchdog::start(
        "stress_one_cold_file",
        progress.clone(),
        watchdog::stall_limit(),
        watchdog::OnHang {
            suspects: Default::default(),
            cleanup: Box::new(move || {
                for p in &cleanup_paths {
                    let _ = std::fs::remove_file(p);
                    // The temporary directory each lives in, now empty.
                    let _ = p.parent().map(std::fs::remove_dir);
                }
            }),
        },
    );

    // Set-up: the whole file written with the pattern, synced, and the file system closed.
    let initial_tail = TAIL_ZONE / 2;
    let ino = {
        let fs = img.mount(FsOptions { checkpoint_interval: None, ..Default::default() });
        let ino = main.step("create", || fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino);
        let mut buf = vec![0u8; MIB as usize];
        for k in 0..(TAIL + initial_tail) / MIB {
            fill_pattern(k * MIB, &mut buf);
            main.step("set-up write", || fs.write_at(ino, k * MIB, &buf).unwrap());
        }
        main.step("set-up sync", || fs.sync().unwrap());
        main.step("set-up unmount", || fs.unmount().unwrap());
        ino
    };
    let mut writers: Vec<WriterModel> = (0..WRITERS)
        .map(|w| {
            let base = w * REGION;
            let mut bytes = vec![0u8; REGION as usize];
            fill_pattern(base, &mut bytes);
            WriterModel { base, bytes, ops: 0 }
        })
        .collect();
    let mut tail_bytes = vec![0u8; initial_tail as usize];
    fill_pattern(TAIL, &mut tail_bytes);
    let tail_model = TailModel { bytes: tail_bytes, ops: 0 };

    // The run: reopened with a small cache, so that every page starts on the device only and
    // goes back there under pressure; background checkpoints every 2 s on top of forced ones.
    let fs = Arc::new(main.step("reopen", || {
        img.mount(FsOptions {
            cache_bytes: SMALL_CACHE,
            checkpoint_interval: Some(Duration::from_secs(2)),
            ..Default::default()
        })
    }));
    main.idle();
    let ctx = Arc::new(Ctx {
        fs: fs.clone(),
        ino,
        stop: Arc::new(AtomicBool::new(false)),
        deadline: Instant::now() + Duration::from_secs(secs),
        seed,
    });
    // Each thread gets the context, its own counter, and a builder with its name.
    let spawn =
        |name: &str| (ctx.clone(), progress.tracker(name), std::thread::Builder::new().name(name.into()));
    let mut writer_handles = Vec::new();
    for (w, model) in writers.drain(..).enumerate() {
        let (c, t, b) = spawn(&format!("writer-{w}"));
        writer_handles.push(b.spawn(move || writer(&c, w as u64, &t, model)).unwrap());
    }
    let (c, t, b) = spawn("tail");
    let tail_handle = b.spawn(move || tail(&c, &t, tail_model)).unwrap();
    let mut counted = Vec::new();
    for r in 0..2 {
        let (c, t, b) = spawn(&format!("reader-{r}"));
        counted.push(("reader", b.spawn(move || reader(&c, r, &t)).unwrap()));
    }
    let (c, t, b) = spawn("fsync");
    counted.push(("fsync", b.spawn(move || fsyncer(&c, &t)).unwrap()));
    let (c, t, b) = spawn("checkpoint");
    counted.push(("checkpoint", b.spawn(move || checkpointer(&c, &t)).unwrap()));

    // Join everything before reporting a failure, so that no thread outlives the test.
    let writer_results: Vec<_> = writer_handles.into_iter().map(|h| h.join()).collect();
    let tail_result = tail_handle.join();
    let count_results: Vec<_> = counted.into_iter().map(|(n, h)| (n, h.join())).collect();
    for r in writer_results {
        writers.push(r.unwrap_or_else(|e| std::panic::resume_unwind(e)));
    }
    let tail_model = tail_result.unwrap_or_else(|e| std::panic::resume_unwind(e));
    let counts: Vec<(&str, u64)> = count_results
        .into_iter()
        .map(|(n, r)| (n, r.unwrap_or_else(|e| std::panic::resume_unwind(e))))
        .collect();
    let stats = fs.io_stats();
    eprintln!(
        "stress: writers {:?} ops, tail {} ops, others {counts:?}; checkpoints {}, writeback {} MiB, cleaned {} segments",
        writers.iter().map(|w| w.ops).collect::<Vec<_>>(),
        tail_model.ops,
        stats.checkpoints_durable,
        stats.writeback_bytes >> 20,
        stats.segments_cleaned,
    );
    // Every thread got work done: one that never finished an operation was starved for the
    // whole run (the watchdog would have fired first, unless the run is shorter than its limit).
    assert!(writers.iter().all(|w| w.ops > 0) && tail_model.ops > 0, "a thread finished no operation");
    assert!(counts.iter().all(|&(_, n)| n > 0), "a thread finished no operation: {counts:?}");

    // Afterwards: exact contents on the live file system, after a sync, and across a remount.
    main.begin("check (live)");
    check_all(&fs, ino, &writers, &tail_model, "live");
    main.done();
    main.step("sync", || fs.sync().unwrap());
    main.step("check (after sync)", || check_all(&fs, ino, &writers, &tail_model, "after sync"));
    drop(ctx);
    let fs = Arc::into_inner(fs).expect("every thread let go of the file system");
    main.step("unmount", || fs.unmount().unwrap());
    main.step("fsck", || img.fsck_clean("after the run"));
    let fs =
        main.step("remount", || img.mount(FsOptions { checkpoint_interval: None, ..Default::default() }));
    main.step("check (remounted)", || check_all(&fs, ino, &writers, &tail_model, "remounted"));
    main.step("sync", || fs.sync().unwrap());
    main.step("check (remounted, synced)", || {
        check_all(&fs, ino, &writers, &tail_model, "remounted and synced")
    });
    main.step("unmount", || fs.unmount().unwrap());
    main.step("fsck", || img.fsck_clean("after the remount"));
    main.idle();
}
