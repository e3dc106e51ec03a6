//! Deadlock and data stress through a real FUSE mount (issue 14, "the mount never hangs"): the
//! library stress (crates/lanefs/tests/stress.rs) again, with real system calls from many threads
//! against `lanefs mount --foreground --threads 2` (one FUSE worker per core here, as in the
//! deadlock the issue reports). The file is 256 MiB, written, fsynced, unmounted and mounted again
//! so that no page is cached by the daemon or the kernel. Threads mix O_DIRECT and buffered
//! pread/pwrite (sub-page, 1 KiB-aligned as fio's `--bs=64k,1k`, whole pages, unaligned spans),
//! ftruncate, fallocate (allocate, KEEP_SIZE) and punch, fsync and fdatasync of the file and its
//! directory, and syncfs; the mount checkpoints every second (`-o checkpoint_secs=1`) because FUSE
//! does not forward syncfs to the daemon (the kernel sends FUSE_SYNCFS to virtiofs only).
//!
//! As in the library test every byte has one owner: writer w owns
//! `[w * REGION, (w + 1) * REGION)` and checks its model with O_DIRECT reads (the kernel's page
//! cache is not coherent with concurrent O_DIRECT writes, so buffered reads are checked only where
//! nobody writes); the stable zone is checked byte for byte by the readers; the tail thread owns
//! the bytes from `TAIL` on and the size. Afterwards every model is checked on the live mount,
//! the mount is undone, `lanefs fsck` must exit 0, and a new mount must hold every byte and the
//! size, then fsck again after its unmount.
//!
//! A watchdog fails the test when a thread's operation counter stands still for 10 s: it prints
//! the daemon's stacks and the test's own (gdb, and /proc wchan and kernel stacks), kills the
//! daemon by PID, detaches the mount by path and exits. `LANEFS_STRESS_SECS` sets the run time
//! (15 s by default), `LANEFS_STRESS_SEED` the choices, `LANEFS_TEST_NVM=1` a persistent-memory
//! region. Needs root, /dev/fuse and fusermount3 (skipped with a note otherwise).

mod common;
#[path = "../../lanefs/tests/stress_data/mod.rs"]
mod stress_data;
#[path = "../../lanefs/tests/watchdog/mod.rs"]
mod watchdog;

use common::*;
use lanefs::rng::{derive, Rng};
use rustix::fs::{fallocate, FallocateFlags};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stress_data::{fill_pattern, random_bytes, secs_from_env};
use watchdog::{Progress, StopOnPanic, Tracker, Watchdog};

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;
const WRITERS: u64 = 4;
const REGION: u64 = 8 * MIB;
const STABLE: u64 = 192 * MIB;
/// Page-aligned: a truncate's partial page never lies below it.
const TAIL: u64 = WRITERS * REGION + STABLE;
const TAIL_ZONE: u64 = 32 * MIB;

fn open(path: &Path, direct: bool) -> File {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path).unwrap_or_else(|e| panic!("open {} (direct {direct}): {e}", path.display()))
}

/// pwrite of all of `data` at `off`, through `abuf` (page-aligned) when `f` is O_DIRECT.
fn pwrite(f: &File, abuf: Option<&mut AlignedBuf>, off: u64, data: &[u8], what: &str) {
    let r = match abuf {
        Some(b) => {
            b.as_mut()[..data.len()].copy_from_slice(data);
            f.write_all_at(&b.as_ref()[..data.len()], off)
        }
        None => f.write_all_at(data, off),
    };
    r.unwrap_or_else(|e| panic!("{what}: pwrite [{off}, +{}): {e}", data.len()));
}

/// pread of up to `len` bytes at `off` (aligned for O_DIRECT by the caller); returns the bytes
/// read, looping over short reads until the end of the file.
fn pread(f: &File, abuf: &mut AlignedBuf, off: u64, len: usize, what: &str) -> Vec<u8> {
    let b = &mut abuf.as_mut()[..len];
    let mut done = 0;
    // Bounded: each turn reads at least one byte or stops.
    while done < len {
        let n = f
            .read_at(&mut b[done..], off + done as u64)
            .unwrap_or_else(|e| panic!("{what}: pread at {off}: {e}"));
        if n == 0 {
            break;
        }
        done += n;
    }
    b[..done].to_vec()
}

fn first_diff(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .or((got.len() != want.len()).then(|| got.len().min(want.len())))
}

/// O_DIRECT read of `want.len()` bytes at a page-aligned `off`, compared.
fn check_direct(f: &File, abuf: &mut AlignedBuf, off: u64, want: &[u8], what: &str) {
    let got = pread(f, abuf, off, want.len(), what);
    if let Some(i) = first_diff(&got, want) {
        panic!(
            "{what}: [{off}, +{}): {} bytes read; first difference at file offset {} ({:?} read, {:#04x} expected)",
            want.len(),
            got.len(),
            off + i as u64,
            got.get(i),
            want.get(i).copied().unwrap_or(0)
        );
    }
}

struct WriterModel {
    base: u64,
    bytes: Vec<u8>,
    ops: u64,
}

struct TailModel {
    bytes: Vec<u8>,
    ops: u64,
}

/// Every byte of every model and the size, through O_DIRECT reads of `file`.
fn check_all(file: &Path, writers: &[WriterModel], tail: &TailModel, when: &str) {
    let f = open(file, true);
    let mut abuf = AlignedBuf::new(MIB as usize);
    for w in writers {
        for (k, chunk) in w.bytes.chunks(MIB as usize).enumerate() {
            check_direct(
                &f,
                &mut abuf,
                w.base + k as u64 * MIB,
                chunk,
                &format!("{when}: region at {}", w.base),
            );
        }
    }
    let mut want = vec![0u8; MIB as usize];
    for k in 0..STABLE / MIB {
        let off = WRITERS * REGION + k * MIB;
        fill_pattern(off, &mut want);
        check_direct(&f, &mut abuf, off, &want, &format!("{when}: stable zone"));
    }
    for (k, chunk) in tail.bytes.chunks(MIB as usize).enumerate() {
        check_direct(&f, &mut abuf, TAIL + k as u64 * MIB, chunk, &format!("{when}: tail zone"));
    }
    let size = f.metadata().unwrap().len();
    assert_eq!(size, TAIL + tail.bytes.len() as u64, "{when}: size");
}

struct Ctx {
    file: PathBuf,
    mp: PathBuf,
    stop: Arc<AtomicBool>,
    deadline: Instant,
    seed: u64,
}

impl Ctx {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Acquire) && Instant::now() < self.deadline
    }
}

/// A random range in `[lo, hi)` of 1 to `max` bytes whose offset and length are multiples of
/// `align` (1: any).
fn pick(rng: &mut Rng, lo: u64, hi: u64, max: u64, align: u64) -> (u64, u64) {
    let units = (hi - lo) / align;
    let len = 1 + rng.below((max / align).clamp(1, units));
    let off = lo + rng.below(units - len + 1) * align;
    (off, len * align)
}

fn punch(f: &File, off: u64, len: u64, what: &str) {
    fallocate(f, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, off, len)
        .unwrap_or_else(|e| panic!("{what}: punch [{off}, +{len}): {e}"));
}

fn writer(ctx: &Ctx, w: u64, t: &Tracker, mut model: WriterModel) -> WriterModel {
    let _g = StopOnPanic(ctx.stop.clone(), t.clone());
    let mut rng = Rng::new(derive(ctx.seed, w));
    let (direct, buffered) = (open(&ctx.file, true), open(&ctx.file, false));
    let mut abuf = AlignedBuf::new(MIB as usize);
    let (lo, hi) = (model.base, model.base + REGION);
    let what = format!("writer {w} (seed {})", ctx.seed);
    while ctx.running() {
        match rng.below(100) {
            // fio's 1 KiB O_DIRECT writes: sub-page, 1 KiB-aligned, on cold pages.
            0..=29 => {
                let (off, len) = pick(&mut rng, lo, hi, 3072, 1024);
                let data = random_bytes(&mut rng, len as usize);
                t.step("O_DIRECT write (1k)", || pwrite(&direct, Some(&mut abuf), off, &data, &what));
                model.bytes[(off - lo) as usize..(off - lo + len) as usize].copy_from_slice(&data);
            }
            // Buffered sub-page writes at any offset (the kernel writes through to the daemon).
            30..=44 => {
                let (off, len) = pick(&mut rng, lo, hi, 3000, 1);
                let data = random_bytes(&mut rng, len as usize);
                t.step("buffered write (sub-page)", || pwrite(&buffered, None, off, &data, &what));
                model.bytes[(off - lo) as usize..(off - lo + len) as usize].copy_from_slice(&data);
            }
            // fio's 64 KiB: whole pages, O_DIRECT.
            45..=59 => {
                let (off, len) = pick(&mut rng, lo, hi, 64 * 1024, PAGE);
                let data = random_bytes(&mut rng, len as usize);
                t.step("O_DIRECT write (pages)", || pwrite(&direct, Some(&mut abuf), off, &data, &what));
                model.bytes[(off - lo) as usize..(off - lo + len) as usize].copy_from_slice(&data);
            }
            // Unaligned buffered spans: partial pages at both ends.
            60..=64 => {
                let (off, len) = pick(&mut rng, lo, hi, 70_000, 1);
                let data = random_bytes(&mut rng, len as usize);
                t.step("buffered write (span)", || pwrite(&buffered, None, off, &data, &what));
                model.bytes[(off - lo) as usize..(off - lo + len) as usize].copy_from_slice(&data);
            }
            65..=79 => {
                let (off, len) = pick(&mut rng, lo, hi, 128 * 1024, PAGE);
                let want = &model.bytes[(off - lo) as usize..(off - lo + len) as usize];
                t.step("O_DIRECT read", || check_direct(&direct, &mut abuf, off, want, &what));
            }
            80..=84 => {
                let (off, len) = pick(&mut rng, lo, hi, 40_000, 1);
                t.step("punch", || punch(&buffered, off, len, &what));
                model.bytes[(off - lo) as usize..(off - lo + len) as usize].fill(0);
            }
            // Allocation below the size changes no byte and not the size.
            85..=87 => {
                let (off, len) = pick(&mut rng, lo, hi, 200_000, 1);
                let flags =
                    if rng.chance(1, 2) { FallocateFlags::KEEP_SIZE } else { FallocateFlags::empty() };
                t.step("fallocate", || {
                    fallocate(&direct, flags, off, len).unwrap_or_else(|e| panic!("{what}: fallocate: {e}"))
                });
            }
            88..=91 => {
                let f = if rng.chance(1, 2) { &direct } else { &buffered };
                let data_only = rng.chance(1, 2);
                t.step("fsync", || {
                    if data_only { f.sync_data() } else { f.sync_all() }
                        .unwrap_or_else(|e| panic!("{what}: fsync: {e}"))
                });
            }
            // Buffered reads of its own bytes: only the length is certain (the page cache may
            // hold bytes an O_DIRECT write has replaced since).
            92..=95 => {
                let (off, len) = pick(&mut rng, lo, hi, 64 * 1024, 1);
                let n =
                    t.step("buffered read", || pread(&buffered, &mut abuf, off, len as usize, &what).len());
                assert_eq!(n as u64, len, "{what}: short buffered read at {off}");
            }
            _ => {
                t.step("O_DIRECT read (region)", || {
                    for (k, chunk) in model.bytes.chunks(MIB as usize).enumerate() {
                        check_direct(&direct, &mut abuf, lo + k as u64 * MIB, chunk, &what);
                    }
                });
            }
        }
        model.ops += 1;
    }
    model
}

fn tail(ctx: &Ctx, t: &Tracker, mut model: TailModel) -> TailModel {
    let _g = StopOnPanic(ctx.stop.clone(), t.clone());
    let mut rng = Rng::new(derive(ctx.seed, 100));
    let (direct, buffered) = (open(&ctx.file, true), open(&ctx.file, false));
    let mut abuf = AlignedBuf::new(MIB as usize);
    let end = TAIL + TAIL_ZONE;
    let what = format!("tail (seed {})", ctx.seed);
    while ctx.running() {
        let size = TAIL + model.bytes.len() as u64;
        match rng.below(100) {
            // ftruncate down or up, to a page boundary or inside a page.
            0..=19 => {
                let mut to = TAIL + rng.below(TAIL_ZONE + 1);
                if rng.chance(1, 2) {
                    to -= (to - TAIL) % PAGE;
                }
                t.step("ftruncate", || {
                    buffered.set_len(to).unwrap_or_else(|e| panic!("{what}: ftruncate {to}: {e}"))
                });
                model.bytes.resize((to - TAIL) as usize, 0);
            }
            20..=44 => {
                let direct_io = rng.chance(1, 2);
                let (off, len) = pick(&mut rng, TAIL, end, 70_000, if direct_io { 1024 } else { 1 });
                let data = random_bytes(&mut rng, len as usize);
                t.step("write", || {
                    if direct_io {
                        pwrite(&direct, Some(&mut abuf), off, &data, &what)
                    } else {
                        pwrite(&buffered, None, off, &data, &what)
                    }
                });
                let (a, b) = ((off - TAIL) as usize, (off - TAIL + len) as usize);
                if model.bytes.len() < b {
                    model.bytes.resize(b, 0);
                }
                model.bytes[a..b].copy_from_slice(&data);
            }
            45..=54 => {
                let (off, len) = pick(&mut rng, TAIL, end, 300_000, 1);
                let keep = rng.chance(1, 2);
                let flags = if keep { FallocateFlags::KEEP_SIZE } else { FallocateFlags::empty() };
                t.step("fallocate", || {
                    fallocate(&buffered, flags, off, len).unwrap_or_else(|e| panic!("{what}: fallocate: {e}"))
                });
                if !keep && off + len > size {
                    model.bytes.resize((off + len - TAIL) as usize, 0);
                }
            }
            55..=64 => {
                let (off, len) = pick(&mut rng, TAIL, end, 100_000, 1);
                t.step("punch", || punch(&direct, off, len, &what));
                let (a, b) = ((off - TAIL) as usize, ((off + len).min(size) - TAIL) as usize);
                if a < b {
                    model.bytes[a..b].fill(0);
                }
            }
            // An O_DIRECT read that may run past the end: the bytes up to the size, no more.
            65..=89 => {
                let (off, len) = pick(&mut rng, TAIL, end, 128 * 1024, PAGE);
                let got = t.step("O_DIRECT read", || pread(&direct, &mut abuf, off, len as usize, &what));
                let want_n = size.saturating_sub(off).min(len) as usize;
                assert_eq!(got.len(), want_n, "{what}: read [{off}, +{len}) with the size at {size}");
                let a = ((off - TAIL) as usize).min(model.bytes.len());
                assert!(
                    got[..] == model.bytes[a..a + want_n],
                    "{what}: read [{off}, +{len}): contents differ"
                );
            }
            90..=94 => {
                let got = t.step("fstat", || direct.metadata().unwrap().len());
                assert_eq!(got, size, "{what}: size");
            }
            _ => t.step("fdatasync", || {
                buffered.sync_data().unwrap_or_else(|e| panic!("{what}: fdatasync: {e}"))
            }),
        }
        model.ops += 1;
    }
    model
}

/// Reads below the tail, O_DIRECT (`direct`) or buffered: never short (the size stays above
/// the tail), and the stable zone reads as set up. The buffered reader drops the kernel's cached
/// pages now and then, so that its reads keep reaching the daemon.
fn reader(ctx: &Ctx, direct: bool, t: &Tracker) -> u64 {
    let _g = StopOnPanic(ctx.stop.clone(), t.clone());
    let mut rng = Rng::new(derive(ctx.seed, 200 + direct as u64));
    let f = open(&ctx.file, direct);
    let mut abuf = AlignedBuf::new(256 * 1024);
    let stable_lo = WRITERS * REGION;
    let what = format!("reader (direct {direct}, seed {})", ctx.seed);
    let mut ops = 0;
    while ctx.running() {
        let (off, len) = pick(&mut rng, 0, TAIL, 256 * 1024, if direct { PAGE } else { 1 });
        let got = t.step("read", || pread(&f, &mut abuf, off, len as usize, &what));
        assert_eq!(got.len() as u64, len, "{what}: short read at {off} below the tail");
        let (a, b) = (off.max(stable_lo), off + len);
        if a < b {
            let mut want = vec![0u8; (b - a) as usize];
            fill_pattern(a, &mut want);
            if let Some(i) = first_diff(&got[(a - off) as usize..], &want) {
                panic!("{what}: stable byte at {} changed", a + i as u64);
            }
        }
        if !direct && rng.chance(1, 32) {
            t.step("fadvise DONTNEED", || {
                rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
            });
        }
        ops += 1;
    }
    ops
}

/// fsync and fdatasync of the file through a third descriptor, fsync of the mount's root
/// directory, and syncfs of the mount.
fn syncer(ctx: &Ctx, t: &Tracker) -> u64 {
    let _g = StopOnPanic(ctx.stop.clone(), t.clone());
    let mut rng = Rng::new(derive(ctx.seed, 300));
    let f = open(&ctx.file, false);
    let root = File::open(&ctx.mp).unwrap();
    let mut ops = 0;
    while ctx.running() {
        match rng.below(10) {
            0..=5 => t.step("fsync", || f.sync_all().unwrap()),
            6..=7 => t.step("fdatasync", || f.sync_data().unwrap()),
            8 => t.step("fsync (root dir)", || root.sync_all().unwrap()),
            _ => t.step("syncfs", || rustix::fs::syncfs(&root).unwrap()),
        }
        ops += 1;
    }
    ops
}

/// The daemon's PID, for the watchdog's stacks and its clean-up.
fn daemon_pid(m: &Mounted) -> u32 {
    m.child.as_ref().expect("a foreground daemon").id()
}

const MOUNT_OPTS: [&str; 2] = ["-o", "checkpoint_secs=1"];

#[test]
fn mount_stress_one_cold_file() {
    if !fuse_available() {
        return;
    }
    let secs = secs_from_env();
    let seed = std::env::var("LANEFS_STRESS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("fuse stress: {secs} s, seed {seed} (LANEFS_STRESS_SEED), nvm {}", nvm_mode());
    let dir = tempfile::tempdir().unwrap();
    let (img, mp) = (dir.path().join("img"), dir.path().join("mnt"));
    std::fs::create_dir(&mp).unwrap();
    // Small enough for the cleaner to run while the file is overwritten (256 MiB of 640).
    mkfs_sized(&img, "640M");

    let progress = Progress::new();
    let main = progress.tracker("main");
    let suspects: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let _dog = Watchdog::start(
        "mount_stress_one_cold_file",
        progress.clone(),
        watchdog::stall_limit(),
        watchdog::OnHang { suspects: suspects.clone(), cleanup: hang_cleanup(&suspects, &img, &mp) },
    );
    let mount = |main: &Tracker| {
        let m = main.step("mount", || Mounted::foreground_with(&img, &mp, &MOUNT_OPTS));
        *suspects.lock().unwrap() = vec![("lanefs daemon".into(), daemon_pid(&m))];
        m
    };

    // Set-up: 256 MiB of the pattern, fsynced, then a new mount, so that nothing is cached.
    let m = mount(&main);
    let file = m.mp.join("f");
    {
        let f = OpenOptions::new().create(true).write(true).custom_flags(libc::O_DIRECT).open(&file).unwrap();
        let mut abuf = AlignedBuf::new(MIB as usize);
        for k in 0..(TAIL + TAIL_ZONE) / MIB {
            fill_pattern(k * MIB, abuf.as_mut());
            main.step("set-up write", || f.write_all_at(abuf.as_ref(), k * MIB).unwrap());
        }
        main.step("set-up fsync", || f.sync_all().unwrap());
    }
    let busy = main.step("umount", || umount_settled(m));
    eprintln!("fuse stress: set-up umount found the mount busy {busy} times");
    let m = mount(&main);
    main.idle();

    let mut writers: Vec<WriterModel> = (0..WRITERS)
        .map(|w| {
            let mut bytes = vec![0u8; REGION as usize];
            fill_pattern(w * REGION, &mut bytes);
            WriterModel { base: w * REGION, bytes, ops: 0 }
        })
        .collect();
    let mut tail_bytes = vec![0u8; TAIL_ZONE as usize];
    fill_pattern(TAIL, &mut tail_bytes);
    let tail_model = TailModel { bytes: tail_bytes, ops: 0 };
    let ctx = Arc::new(Ctx {
        file: file.clone(),
        mp: m.mp.clone(),
        stop: Arc::new(AtomicBool::new(false)),
        deadline: Instant::now() + Duration::from_secs(secs),
        seed,
    });
    let spawn =
        |name: String| (ctx.clone(), progress.tracker(name.clone()), std::thread::Builder::new().name(name));
    let mut writer_handles = Vec::new();
    for (w, model) in writers.drain(..).enumerate() {
        let (c, t, b) = spawn(format!("writer-{w}"));
        writer_handles.push(b.spawn(move || writer(&c, w as u64, &t, model)).unwrap());
    }
    let (c, t, b) = spawn("tail".into());
    let tail_handle = b.spawn(move || tail(&c, &t, tail_model)).unwrap();
    let mut counted = Vec::new();
    for direct in [true, false] {
        let (c, t, b) = spawn(format!("reader-{}", if direct { "direct" } else { "buffered" }));
        counted.push(b.spawn(move || reader(&c, direct, &t)).unwrap());
    }
    let (c, t, b) = spawn("sync".into());
    counted.push(b.spawn(move || syncer(&c, &t)).unwrap());

    // Join everything before reporting a failure, so that no thread outlives the test.
    let mut failure = None;
    for h in writer_handles {
        match h.join() {
            Ok(m) => writers.push(m),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    let tail_model = tail_handle.join();
    let counts: Vec<_> = counted.into_iter().map(|h| h.join()).collect();
    if let Some(e) = failure {
        std::panic::resume_unwind(e);
    }
    let tail_model = tail_model.unwrap_or_else(|e| std::panic::resume_unwind(e));
    let counts: Vec<u64> =
        counts.into_iter().map(|r| r.unwrap_or_else(|e| std::panic::resume_unwind(e))).collect();
    eprintln!(
        "fuse stress: writers {:?} ops, tail {} ops, readers and sync {counts:?}",
        writers.iter().map(|w| w.ops).collect::<Vec<_>>(),
        tail_model.ops
    );
    assert!(writers.iter().all(|w| w.ops > 0) && tail_model.ops > 0, "a thread finished no operation");
    assert!(counts.iter().all(|&n| n > 0), "a thread finished no operation: {counts:?}");

    main.step("check (live)", || check_all(&file, &writers, &tail_model, "live"));
    drop(ctx);
    // The mount may be busy for a moment after the threads closed their files (see
    // `umount_settled`); how long is reported, not asserted.
    let busy = main.step("umount", || umount_settled(m));
    main.step("fsck", || fsck_clean(&img));
    let m = mount(&main);
    main.step("check (remounted)", || check_all(&file, &writers, &tail_model, "remounted"));
    let busy2 = main.step("umount", || umount_settled(m));
    eprintln!("fuse stress: umount found the mount busy {busy} and {busy2} times");
    main.step("fsck", || fsck_clean(&img));
    main.idle();
}

/// What the watchdog does before exiting a hung test: kill the daemon by its PID, detach the
/// mount by its path, and remove the image, its region and the directories it made.
fn hang_cleanup(
    suspects: &Arc<Mutex<Vec<(String, u32)>>>,
    img: &Path,
    mp: &Path,
) -> Box<dyn FnOnce() + Send> {
    let (suspects, img, mp) = (suspects.clone(), img.to_path_buf(), mp.to_path_buf());
    Box::new(move || {
        for (_, pid) in suspects.lock().map(|v| v.clone()).unwrap_or_default() {
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        fusermount_lazy(&mp);
        let _ = std::fs::remove_file(&img);
        if let Some(r) = region_of(&img) {
            let _ = std::fs::remove_file(r);
        }
        let _ = std::fs::remove_dir(&mp);
        if let Some(d) = img.parent() {
            let _ = std::fs::remove_dir(d);
        }
    })
}
