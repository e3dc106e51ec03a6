//! The lane journals in a persistent-memory region (`FsOptions::nvm`, issue 7 step 3): fsync
//! commits its transaction to the region instead of writing journal blocks. Through the
//! library: what fsync writes to the device, recovery from the region and from device journals
//! written before the switch, the checkpoint an fsync takes when its lane's journal is full, and a
//! crash at every region event of a run of fsyncs. The protocol's own crash states (torn
//! entries, every subset of unpersisted words) are enumerated in `src/pmem/journal_tests.rs`.

use lanefs::device::{BlockDevice, MemDevice};

use lanefs::testing::pmem::{PmemCrash, RegionOptions};
use lanefs::{Fs, FsOptions, MkfsOptions, SetAttr, ROOT};
use lanefs_crashtest::{CrashDevice, EventKind};
use std::collections::BTreeMap;
use std::sync::Arc;

mod region;
use lanefs::FallocMode;
use region::{data, image, opts, scratch};

/// Every entry of the directories `dirs`: path -> (contents (none for a directory), permission
/// bits).
type State = BTreeMap<String, (Vec<u8>, u32)>;

fn state(fs: &Fs, dirs: &[&str]) -> State {
    let mut out = State::new();
    for d in dirs {
        let dino = fs.resolve(d).unwrap().ino;
        for e in fs.readdir(dino, 0, 100_000).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let a = fs.getattr(e.ino).unwrap();
            let mut b = Vec::new();
            if a.mode & 0o170000 != 0o040000 {
                b.resize(a.size as usize, 0);
                assert_eq!(fs.read_at(e.ino, 0, &mut b).unwrap(), b.len());
            }
            out.insert(format!("{d}/{}", String::from_utf8_lossy(&e.name)), (b, a.mode & 0o7777));
        }
    }
    out
}

/// Device bytes written and flushes, by a CrashDevice's event log from `from` on.
fn device_io(crash: &CrashDevice<MemDevice>, from: usize) -> (u64, usize) {
    crash.with_events(|ev| {
        let mut bytes = 0;
        let mut flushes = 0;
        for e in &ev[from..] {
            match &e.kind {
                EventKind::Write { data, .. } => bytes += data.len() as u64,
                EventKind::Flush => flushes += 1,
            }
        }
        (bytes, flushes)
    })
}

#[test]
fn fsync_writes_no_journal_block_with_a_region() {
    const N: u64 = 32;
    let mut per_fsync = Vec::new();
    // Without a region; with one; with one and small fsyncs' pages inline.
    for (with_region, inline) in [(false, 0), (true, 0), (true, 4)] {
        let d = scratch();
        let region = d.path().join("r.nvm");
        let crash = Arc::new(CrashDevice::new(image()));
        let dev: Arc<dyn BlockDevice> = crash.clone();
        let o = FsOptions { nvm_inline_pages: Some(inline), ..opts(with_region.then_some(region.as_path())) };
        let fs = Fs::open(dev, o).unwrap();
        let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        fs.write_at(f, 0, &data(1, 64 << 10)).unwrap();
        fs.sync().unwrap();
        // 4 KiB write + fsync, N times (overwrites, as DWSL does).
        let (start, before) = (crash.event_count(), fs.io_stats());
        for i in 0..N {
            fs.write_at(f, (i % 16) * 4096, &data(i as u8, 4096)).unwrap();
            fs.fsync(f, false).unwrap();
        }
        let (bytes, flushes) = device_io(&crash, start);
        let after = fs.io_stats();
        eprintln!(
            "region {with_region}, inline {inline}: 4 KiB write + fsync: {} device bytes, {} flushes, {} region bytes per fsync",
            bytes / N,
            flushes as f64 / N as f64,
            (after.nvm_journal_bytes - before.nvm_journal_bytes) / N
        );
        assert_eq!(after.journal_bytes - before.journal_bytes, bytes, "io_stats counts what the device saw");
        per_fsync.push(bytes / N);
        let region_bytes = after.nvm_journal_bytes - before.nvm_journal_bytes;
        if inline > 0 {
            // The page goes inline into the region's journal; the device gets it at the next
            // checkpoint.
            assert_eq!((bytes, flushes), (0, 0), "nothing for the device");
            assert!((N * 4096..N * (4096 + 512)).contains(&region_bytes), "{region_bytes}");
        } else if with_region {
            assert_eq!(flushes as u64, N, "one device flush per fsync");
            assert_eq!(bytes, N * 4096, "the data block only");
            assert!(region_bytes > 0 && region_bytes < N * 512, "{region_bytes}");
        } else {
            assert_eq!(flushes as u64, N, "one device flush per fsync");
            assert_eq!(bytes, N * 8192, "data block and journal block");
            assert_eq!(after.nvm_journal_bytes, 0);
        }
        // A larger write (8 pages) + fsync: data blocks, as without a region.
        let (start, before) = (crash.event_count(), fs.io_stats());
        for i in 0..N {
            fs.write_at(f, (i % 8) * 4096, &data(i as u8 ^ 0x55, 8 * 4096)).unwrap();
            fs.fsync(f, false).unwrap();
        }
        let (bytes, flushes) = device_io(&crash, start);
        let region_bytes = fs.io_stats().nvm_journal_bytes - before.nvm_journal_bytes;
        eprintln!(
            "region {with_region}, inline {inline}: 32 KiB write + fsync: {} device bytes, {} flushes, {} region bytes per fsync",
            bytes / N,
            flushes as f64 / N as f64,
            region_bytes / N
        );
        assert_eq!(flushes as u64, N, "one device flush per fsync");
        if with_region {
            assert_eq!(bytes, N * 8 * 4096, "the data blocks only");
            assert!(region_bytes > 0 && region_bytes < N * 512, "{region_bytes}");
        } else {
            assert_eq!(bytes, N * 9 * 4096, "data blocks and a journal block");
        }
        // Metadata only (chmod + fsync): nothing for the device at all with a region.
        let start = crash.event_count();
        for i in 0..N {
            let mode = if i % 2 == 0 { 0o600 } else { 0o644 };
            fs.setattr(f, &SetAttr { mode: Some(mode), ..Default::default() }).unwrap();
            fs.fsync(f, false).unwrap();
        }
        let (bytes, flushes) = device_io(&crash, start);
        eprintln!(
            "region {with_region}, inline {inline}: chmod + fsync: {} device bytes, {flushes} flushes in all",
            bytes / N
        );
        if with_region {
            assert_eq!((bytes, flushes), (0, 0));
        } else {
            assert_eq!((bytes, flushes), (N * 4096, N as usize));
        }
        // And it all survives a crash now.
        let want = state(&fs, &["/"]);
        let img = crash.inner().snapshot();
        let copy = d.path().join("copy.nvm");
        if with_region {
            std::fs::copy(&region, &copy).unwrap();
        }
        drop(fs);
        let dev2: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(img));
        let fs = Fs::open(dev2, opts(with_region.then_some(copy.as_path()))).unwrap();
        assert!(fs.recovery().transactions >= 2 * N as usize, "{:?}", fs.recovery());
        assert_eq!(state(&fs, &["/"]), want);
    }
    assert_eq!(per_fsync, vec![8192, 4096, 0]);
}

#[test]
fn device_journals_from_before_the_region_are_recovered() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let mem = Arc::new(image());
    let dev: Arc<dyn BlockDevice> = mem.clone();
    // Without a region: fsyncs go to the device journal; then a crash.
    let fs = Fs::open(dev, opts(None)).unwrap();
    let dir = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..5u8 {
        let f = fs.create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write_at(f, 0, &data(i, 5000)).unwrap();
        fs.fsync(f, false).unwrap();
    }
    let want = state(&fs, &["/d"]);
    let img = mem.snapshot();
    drop(fs);
    // The first mount with a region recovers them, and its checkpoint flags the pack.
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(img));
    let fs = Fs::open(dev.clone(), opts(Some(&region))).unwrap();
    assert_eq!(fs.recovery().transactions, 5);
    assert_eq!(state(&fs, &["/d"]), want);
    let dir = fs.resolve("/d").unwrap().ino;
    let f = fs.create(dir, b"g", 0o644, 0, 0).unwrap().ino;
    fs.write_at(f, 0, &data(9, 7000)).unwrap();
    fs.fsync(f, false).unwrap();
    assert!(fs.io_stats().nvm_journal_bytes > 0, "fsync went to the region");
    let want = state(&fs, &["/d"]);
    drop(fs);
    let fs = Fs::open(dev.clone(), opts(Some(&region))).unwrap();
    assert_eq!(state(&fs, &["/d"]), want);
    drop(fs);
    // From now on the image needs its region.
    assert!(Fs::open(dev, opts(None)).is_err());
}

#[test]
fn a_transaction_too_big_for_the_region_is_made_durable_by_a_checkpoint() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let copy = d.path().join("copy.nvm");
    let mem = Arc::new(image());
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let fs = Fs::open(dev, opts(Some(&region))).unwrap();
    // 2500 creates of long names in one directory, journaled by one directory fsync: ~750 KB
    // of records, more than a lane's journal in a 1 MiB region holds.
    let dir = fs.mkdir(ROOT, b"many", 0o755, 0, 0).unwrap().ino;
    for i in 0..2500 {
        fs.create(dir, format!("n{i:05}{}", "x".repeat(190)).as_bytes(), 0o644, 0, 0).unwrap();
    }
    let before = fs.io_stats();
    let version = |dev: &MemDevice| {
        let g = lanefs::testing::checkpoint::read_superblock(dev).unwrap().sb.geometry;
        lanefs::testing::checkpoint::read_checkpoint(dev, &g).unwrap().cp.version
    };
    let v0 = version(&mem);
    fs.fsync(dir, false).unwrap();
    let mid = fs.io_stats();
    assert_eq!(mid.journal_bytes, before.journal_bytes, "no device journal block with a region");
    assert_eq!(mid.nvm_journal_bytes, before.nvm_journal_bytes, "nothing committed to the region");
    assert!(version(&mem) > v0, "the fsync took a checkpoint");
    // A small one still goes to the region.
    let f = fs.create(ROOT, b"small", 0o644, 0, 0).unwrap().ino;
    fs.write_at(f, 0, &data(3, 4096)).unwrap();
    fs.fsync(f, false).unwrap();
    assert!(fs.io_stats().nvm_journal_bytes > mid.nvm_journal_bytes);
    let want = state(&fs, &["/", "/many"]);
    let img = mem.snapshot();
    std::fs::copy(&region, &copy).unwrap();
    drop(fs);
    let dev2: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(img));
    let fs = Fs::open(dev2, opts(Some(&copy))).unwrap();
    assert_eq!(state(&fs, &["/", "/many"]), want);
    assert_eq!(fs.resolve("/many").unwrap().nlink, 2);
}

/// xorshift64*.
fn next(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// A few crash images of `cm`: nothing pending landed, everything, and two random subsets (the
/// protocol test enumerates subsets exhaustively; here each image costs a mount).
fn some_images(cm: &PmemCrash, seed: &mut u64) -> Vec<Vec<u8>> {
    let mut out = vec![cm.image_with(|_, _| None)];
    if !cm.pending().is_empty() {
        out.push(cm.everything());
        for _ in 0..2 {
            let mask = next(seed);
            out.push(cm.image_with(|i, w| (mask >> (i % 64) & 1 != 0).then(|| w.values.len() - 1)));
        }
    }
    out
}

#[test]
fn a_crash_at_every_region_event_of_a_run_of_fsyncs() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let crashed = d.path().join("crash.nvm");
    let mem = Arc::new(image());
    let dev: Arc<dyn BlockDevice> = mem.clone();
    // Small fsyncs log their pages inline: the crash states cover `Data` records too.
    let record = FsOptions {
        nvm_region: RegionOptions { record: true, ..Default::default() },
        nvm_inline_pages: Some(4),
        ..opts(Some(&region))
    };
    let fs = Fs::open(dev, record).unwrap();
    let dirs = ["/d", "/e"];
    let dn = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let en = fs.mkdir(ROOT, b"e", 0o755, 0, 0).unwrap().ino;
    for i in 0..4u8 {
        let f = fs.create(dn, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write_at(f, 0, &data(i, 6000)).unwrap();
    }
    fs.sync().unwrap();
    type Op<'a> = Box<dyn Fn(&Fs) + 'a>;
    let ops: Vec<(&str, Op)> = vec![
        (
            "overwrite",
            Box::new(|fs: &Fs| {
                let f = fs.resolve("/d/f0").unwrap().ino;
                fs.write_at(f, 4096, &data(50, 4096)).unwrap();
                fs.fsync(f, false).unwrap();
            }),
        ),
        (
            "create",
            Box::new(|fs: &Fs| {
                let g = fs.create(dn, b"g", 0o644, 0, 0).unwrap().ino;
                fs.write_at(g, 0, &data(51, 10000)).unwrap();
                fs.fsync(g, false).unwrap();
            }),
        ),
        (
            "chmod",
            Box::new(|fs: &Fs| {
                let f = fs.resolve("/d/f1").unwrap().ino;
                fs.setattr(f, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
                fs.fsync(f, false).unwrap();
            }),
        ),
        (
            "rename",
            Box::new(|fs: &Fs| {
                fs.rename(dn, b"f2", en, b"h", lanefs::RenameFlags::empty()).unwrap();
                fs.fsync(en, false).unwrap();
            }),
        ),
        (
            "unlink",
            Box::new(|fs: &Fs| {
                fs.unlink(dn, b"f3").unwrap();
                fs.fsync(dn, false).unwrap();
            }),
        ),
        (
            "append",
            Box::new(|fs: &Fs| {
                let g = fs.resolve("/d/g").unwrap().ino;
                fs.write_at(g, 10000, &data(52, 4096)).unwrap();
                fs.fsync(g, false).unwrap();
            }),
        ),
    ];
    let r = fs.nvm().unwrap().region();
    let mut models = vec![state(&fs, &dirs)];
    // Per op: its region events and the device right after it (the device takes no write
    // during an fsync's region events: its data was written and flushed before them).
    let mut windows = Vec::new();
    for (_, op) in &ops {
        let k0 = r.recorded_events();
        op(&fs);
        let k1 = r.recorded_events();
        models.push(state(&fs, &dirs));
        windows.push((k0, k1, Arc::new(MemDevice::from_bytes(mem.snapshot()))));
    }
    assert!(models.windows(2).all(|w| w[0] != w[1]));
    let all: Vec<(usize, PmemCrash)> = windows
        .iter()
        .flat_map(|(k0, k1, _)| (*k0..=*k1).map(|k| (k, r.crash_model_at(k).unwrap())))
        .collect();
    let total = r.recorded_events();
    drop(fs);

    let mut seed = 0xC0FF_EE00_0000_0001;
    let (mut states, mut rw_mounts) = (0, 0);
    let mut it = all.into_iter();
    for (i, (k0, k1, dev)) in windows.iter().enumerate() {
        assert!(*k1 > *k0, "{}: no region event", ops[i].0);
        for (k, cm) in it.by_ref().take(k1 - k0 + 1) {
            for (n, img) in some_images(&cm, &mut seed).into_iter().enumerate() {
                states += 1;
                std::fs::write(&crashed, &img).unwrap();
                let what = format!("{} (op {i}), crash at event {k} of {k0}..={k1}, image {n}", ops[i].0);
                // Read-only: replays into memory, writes neither the device nor the region,
                // so one device image serves every crash state of the op.
                let ddev: Arc<dyn BlockDevice> = dev.clone();
                let fs = Fs::open(ddev, FsOptions { read_only: true, ..opts(Some(&crashed)) })
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let got = state(&fs, &dirs);
                drop(fs);
                if k == *k1 {
                    assert_eq!(got, models[i + 1], "{what}: committed");
                } else if k == *k0 {
                    assert_eq!(got, models[i], "{what}: not begun");
                } else {
                    assert!(
                        got == models[i] || got == models[i + 1],
                        "{what}: neither before nor after\n{got:?}"
                    );
                }
                // Now and then a read-write mount (recovery, checkpoint, reset) and a remount.
                if n == 1 && (k == *k0 + 1 || k + 1 == *k1) {
                    rw_mounts += 1;
                    let copy: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(dev.snapshot()));
                    let fs = Fs::open(copy.clone(), opts(Some(&crashed)))
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(state(&fs, &dirs), got, "{what}: read-write");
                    drop(fs);
                    let fs = Fs::open(copy, opts(Some(&crashed))).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(state(&fs, &dirs), got, "{what}: remount");
                }
            }
        }
    }
    eprintln!("{states} crash states over {total} region events, {rw_mounts} read-write recoveries");
    assert!(states > 100 && rw_mounts >= ops.len());
}

#[test]
fn full_lane_journals_are_emptied_by_checkpoints_and_nothing_is_lost() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let copy = d.path().join("copy.nvm");
    let mem = Arc::new(image());
    let dev: Arc<dyn BlockDevice> = mem.clone();
    // Background checkpoints on (kicked at half a lane's journal); a 1 MiB region holds a few
    // thousand small transactions per lane, so these fsyncs fill lanes several times over.
    let fs = Fs::open(
        dev,
        FsOptions { checkpoint_interval: Some(std::time::Duration::from_secs(3600)), ..opts(Some(&region)) },
    )
    .unwrap();
    let dir = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let files: Vec<u64> =
        (0..8).map(|i| fs.create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    for round in 0..8000u32 {
        let f = files[round as usize % files.len()];
        if round % 5 == 0 {
            fs.write_at(f, (round as u64 % 7) * 4096, &data(round as u8, 4096)).unwrap();
        } else {
            let mode = 0o600 | ((round % 2) * 0o044);
            fs.setattr(f, &SetAttr { mode: Some(mode), ..Default::default() }).unwrap();
        }
        fs.fsync(f, false).unwrap();
    }
    let st = fs.io_stats();
    assert!(st.nvm_journal_bytes > 1_000_000, "{st:?}");
    assert!(st.checkpoint_bytes > 0, "{st:?}");
    assert_eq!(st.journal_bytes % 4096, 0);
    let want = state(&fs, &["/d"]);
    // The image and the region are copied one after the other while background checkpoints
    // may still run: a pair taken across a checkpoint's commit is no state a crash leaves (a
    // crash stops both at once), so copy until no checkpoint overlapped the two copies.
    // Bounded: a kicked checkpoint ends, and nothing kicks another (no fsync runs now).
    let mut img = Vec::new();
    for attempt in 0..100 {
        let before = fs.io_stats();
        img = mem.snapshot();
        std::fs::copy(&region, &copy).unwrap();
        let after = fs.io_stats();
        let quiet = before.checkpoints_begun == before.checkpoints_durable
            && (after.checkpoints_begun, after.checkpoints_durable)
                == (before.checkpoints_begun, before.checkpoints_durable);
        if quiet {
            break;
        }
        assert!(attempt < 99, "background checkpoints never stopped");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(fs);
    let dev2: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(img));
    let fs = Fs::open(dev2, opts(Some(&copy))).unwrap();
    assert_eq!(state(&fs, &["/d"]), want);
}

/// A page an fsync logged inline (`Record::Data`) and a later punch dropped: the page was
/// never on the device, so the punch must still journal a hole, or replay brings the logged
/// page back (found by `lanefs crashtest --nvm`, mt-lanes, seed 11).
#[test]
fn a_punched_page_that_was_only_logged_inline_stays_a_hole() {
    for punch_fsynced in [true, false] {
        let d = scratch();
        let region = d.path().join("r.nvm");
        let copy = d.path().join("copy.nvm");
        let mem = Arc::new(image());
        let dev: Arc<dyn BlockDevice> = mem.clone();
        let o = FsOptions { nvm_inline_pages: Some(4), ..opts(Some(&region)) };
        let fs = Fs::open(dev, o).unwrap();
        let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        fs.sync().unwrap();
        fs.write_at(f, 0, &data(7, 3 * 4096)).unwrap();
        fs.fsync(f, false).unwrap();
        assert_eq!(fs.io_stats().journal_bytes, 0, "the pages went inline, not to the device");
        fs.fallocate(f, FallocMode::PUNCH_HOLE | FallocMode::KEEP_SIZE, 4096, 4096).unwrap();
        let mut want = data(7, 3 * 4096);
        if punch_fsynced {
            fs.fsync(f, false).unwrap();
            want[4096..8192].fill(0);
        }
        let img = mem.snapshot();
        std::fs::copy(&region, &copy).unwrap();
        drop(fs);
        let fs = Fs::open(Arc::new(MemDevice::from_bytes(img)), opts(Some(&copy))).unwrap();
        let f = fs.resolve("/f").unwrap().ino;
        let mut got = vec![0u8; 3 * 4096];
        assert_eq!(fs.read_at(f, 0, &mut got).unwrap(), got.len());
        assert!(
            got == want,
            "punch fsynced {punch_fsynced}: the punched page came back or the data was lost"
        );
    }
}

/// `FsOptions::nvm_inline_pages` left to lanefs: small fsyncs go inline where a device flush
/// costs something (an image on a disk file system), not where it is free (an image in tmpfs).
#[test]
fn inline_pages_by_default_only_where_a_flush_costs_something() {
    use lanefs::device::{create_image, DeviceOptions, FileDevice};
    let on_disk = tempfile::tempdir().unwrap();
    let in_ram = scratch();
    for d in [on_disk.path(), in_ram.path()] {
        let img = d.join("i.img");
        create_image(&img, 64 << 20).unwrap();
        let dev = FileDevice::open(&img, DeviceOptions::default()).unwrap();
        Fs::format(&dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
        let free = dev.flush_is_free();
        let region = d.join("r.nvm");
        let fs = Fs::open(Arc::new(dev), opts(Some(&region))).unwrap();
        let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        fs.sync().unwrap();
        let before = fs.io_stats();
        fs.write_at(f, 0, &data(3, 4096)).unwrap();
        fs.fsync(f, false).unwrap();
        let device = fs.io_stats().journal_bytes - before.journal_bytes;
        eprintln!("{}: flush free {free}: {device} device bytes for a 4 KiB write + fsync", d.display());
        assert_eq!(device, if free { 4096 } else { 0 }, "{}", d.display());
    }
    let shm_is_tmpfs = rustix::fs::statfs("/dev/shm").is_ok_and(|s| s.f_type as u64 == 0x0102_1994);
    if shm_is_tmpfs {
        let img = in_ram.path().join("i.img");
        assert!(FileDevice::open(&img, DeviceOptions::default()).unwrap().flush_is_free());
    }
}
