//! Device layer tests against real files: both back ends, the crash recorder, concurrency.

use lanefs::rng::Rng;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lanefs::device::{
    create_image, BlockDevice, DeviceOptions, FileDevice, IoChoice, IoMode, MemDevice, ReadReq, WriteReq,
    BLOCK_SIZE,
};

use lanefs_crashtest::{state_at, CrashDevice, EventKind, FaultPlan};

const B: usize = BLOCK_SIZE;

fn image(dir: &Path, name: &str, blocks: u64) -> PathBuf {
    let p = dir.join(name);
    create_image(&p, blocks * B as u64).unwrap();
    p
}

fn open(p: &Path, io: IoChoice) -> FileDevice {
    FileDevice::open(p, DeviceOptions { io }).unwrap()
}

/// A block whose every byte depends on (tag, addr), so misplaced blocks are caught.
fn pattern(tag: u64, addr: u64) -> Vec<u8> {
    let mut r = Rng::new(tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ addr.wrapping_add(1) ^ 0xABCDEF);
    (0..B).map(|_| r.next_u64() as u8).collect()
}

/// Backing storage whose slices start 1 byte past an allocation: never 4096-aligned.
struct Unaligned(Vec<u8>);
impl Unaligned {
    fn new(data: &[u8]) -> Unaligned {
        let mut v = vec![0u8; data.len() + 1];
        v[1..].copy_from_slice(data);
        Unaligned(v)
    }
    fn get(&self) -> &[u8] {
        &self.0[1..]
    }
}

fn tmpdirs() -> Vec<tempfile::TempDir> {
    let mut dirs = vec![tempfile::tempdir().unwrap()];
    // tmpfs, where O_DIRECT is not real: io_uring must run buffered there.
    if Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            dirs.push(d);
        }
    }
    dirs
}

fn fs_allows_real_direct(p: &Path) -> bool {
    let f = std::fs::File::open(p).unwrap();
    let magic = (rustix::fs::fstatfs(&f).unwrap().f_type as u64) & 0xFFFF_FFFF;
    matches!(magic, 0xEF53 | 0x5846_5342 | 0x9123_683E)
}

#[test]
fn scattered_batch_round_trips_on_every_back_end() {
    for dir in tmpdirs() {
        for io in [IoChoice::Auto, IoChoice::Uring, IoChoice::Sync] {
            let p = image(dir.path(), &format!("rt-{io:?}.img"), 1024);
            let dev = open(&p, io);
            assert_eq!(dev.block_count(), 1024);
            if io == IoChoice::Uring {
                assert_eq!(dev.io_mode(), IoMode::Uring, "{}", dev.describe());
            }
            if io == IoChoice::Sync {
                assert_eq!(dev.io_mode(), IoMode::Sync);
            }
            let addrs = [900u64, 3, 17, 4, 511, 18, 19, 1023, 0];
            let blocks: Vec<Vec<u8>> = addrs.iter().map(|&a| pattern(1, a)).collect();
            let reqs: Vec<WriteReq> =
                addrs.iter().zip(&blocks).map(|(&addr, d)| WriteReq { addr, data: d }).collect();
            dev.write_batch(&reqs).unwrap();
            dev.flush().unwrap();

            let mut back: Vec<Unaligned> = addrs.iter().map(|_| Unaligned::new(&[0; B])).collect();
            let mut rreqs: Vec<ReadReq> = addrs
                .iter()
                .zip(back.iter_mut())
                .map(|(&addr, u)| ReadReq { addr, buf: &mut u.0[1..] })
                .collect();
            dev.read_batch(&mut rreqs).unwrap();
            for (b, want) in back.iter().zip(&blocks) {
                assert!(b.get() == &want[..], "{}", dev.describe());
            }
            drop(dev);
            let raw = std::fs::read(&p).unwrap();
            for (&a, want) in addrs.iter().zip(&blocks) {
                assert_eq!(&raw[a as usize * B..(a as usize + 1) * B], &want[..]);
            }
            assert!(raw[B..2 * B].iter().all(|&x| x == 0), "block 1 untouched");
        }
    }
}

#[test]
fn direct_io_is_used_where_it_is_real() {
    let dir = tempfile::tempdir().unwrap();
    let p = image(dir.path(), "d.img", 64);
    let dev = open(&p, IoChoice::Auto);
    if fs_allows_real_direct(&p) {
        assert_eq!(dev.io_mode(), IoMode::Uring, "{}", dev.describe());
        assert!(dev.is_direct() && dev.describe().contains("O_DIRECT"), "{}", dev.describe());
    } else {
        assert_eq!(dev.io_mode(), IoMode::Sync, "{}", dev.describe());
    }
    if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
        let p = image(shm.path(), "d.img", 64);
        let auto = open(&p, IoChoice::Auto);
        assert_eq!(auto.io_mode(), IoMode::Sync);
        assert_eq!(auto.describe(), "sync-vectored (tmpfs)");
        let forced = open(&p, IoChoice::Uring);
        assert!(!forced.is_direct());
        assert!(forced.describe().contains("buffered"), "{}", forced.describe());
    }
}

#[test]
fn bad_requests_are_rejected_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for io in [IoChoice::Uring, IoChoice::Sync] {
        let p = image(dir.path(), &format!("bad-{io:?}.img"), 16);
        let dev = open(&p, io);
        let one = vec![7u8; B];
        let cases: Vec<Vec<WriteReq>> = vec![
            vec![WriteReq { addr: 16, data: &one }],
            vec![WriteReq { addr: 15, data: &[1u8; 2 * B] }],
            vec![WriteReq { addr: 0, data: &one[..100] }],
            vec![WriteReq { addr: 0, data: &[] }],
            vec![WriteReq { addr: u64::MAX, data: &one }],
            // A good request first: the whole batch must still be refused.
            vec![WriteReq { addr: 2, data: &one }, WriteReq { addr: 3, data: &one[..B - 1] }],
            vec![WriteReq { addr: 4, data: &[1u8; 2 * B] }, WriteReq { addr: 5, data: &one }],
        ];
        for reqs in &cases {
            let e = dev.write_batch(reqs).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{reqs:?}");
        }
        let mut buf = vec![0u8; B];
        let e = dev.read_block(16, &mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        let mut odd = vec![0u8; B + 512];
        assert!(dev.read_block(0, &mut odd).is_err());
        assert!(dev.discard(10, 7).is_err());
        drop(dev);
        assert!(std::fs::read(&p).unwrap().iter().all(|&x| x == 0), "{io:?} wrote something");
    }
}

/// Applies random 64-request batches (single blocks, multi-block requests, adjacent runs,
/// aligned and unaligned buffers) to `dev` and to a model; returns the model.
fn random_batches(dev: &dyn BlockDevice, seed: u64, rounds: usize) -> BTreeMap<u64, Vec<u8>> {
    let mut rng = Rng::new(seed);
    let blocks = dev.block_count();
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for round in 0..rounds as u64 {
        // Pick non-overlapping extents: mostly singles, some runs of adjacent single-block
        // requests, some multi-block requests.
        let mut used = std::collections::BTreeSet::new();
        let mut extents: Vec<(u64, u64)> = Vec::new();
        while extents.len() < 64 {
            let len = match rng.below(8) {
                0 => 1 + rng.below(5),
                _ => 1,
            };
            let start = rng.below(blocks - len);
            if (start..start + len).any(|a| used.contains(&a)) {
                continue;
            }
            used.extend(start..start + len);
            extents.push((start, len));
            // Sometimes follow with the adjacent block as a separate request (a mergeable run).
            if rng.below(3) == 0 && start + len < blocks && !used.contains(&(start + len)) {
                used.insert(start + len);
                extents.push((start + len, 1));
            }
        }
        let datas: Vec<Vec<u8>> = extents
            .iter()
            .map(|&(a, n)| (0..n).flat_map(|k| pattern(seed ^ round, a + k)).collect())
            .collect();
        let unaligned: Vec<Unaligned> = datas.iter().map(|d| Unaligned::new(d)).collect();
        let reqs: Vec<WriteReq> = extents
            .iter()
            .enumerate()
            .map(|(i, &(addr, _))| {
                let data = if i % 2 == 0 { unaligned[i].get() } else { &datas[i][..] };
                WriteReq { addr, data }
            })
            .collect();
        dev.write_batch(&reqs).unwrap();
        for (&(a, n), d) in extents.iter().zip(&datas) {
            for k in 0..n {
                model.insert(a + k, d[k as usize * B..(k as usize + 1) * B].to_vec());
            }
        }
    }
    model
}

fn check_against_model(dev: &dyn BlockDevice, model: &BTreeMap<u64, Vec<u8>>) {
    let addrs: Vec<u64> = model.keys().copied().collect();
    for chunk in addrs.chunks(200) {
        let mut bufs: Vec<Unaligned> = chunk.iter().map(|_| Unaligned::new(&[0; B])).collect();
        let mut reqs: Vec<ReadReq> = chunk
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&addr, u)| ReadReq { addr, buf: &mut u.0[1..] })
            .collect();
        dev.read_batch(&mut reqs).unwrap();
        for (a, b) in chunk.iter().zip(&bufs) {
            assert!(b.get() == &model[a][..], "block {a} differs ({})", dev.describe());
        }
    }
}

#[test]
fn uring_and_sync_write_identical_images() {
    for dir in tmpdirs() {
        let pu = image(dir.path(), "u.img", 4096);
        let ps = image(dir.path(), "s.img", 4096);
        let du = open(&pu, IoChoice::Uring);
        let ds = open(&ps, IoChoice::Sync);
        assert_eq!(du.io_mode(), IoMode::Uring, "{}", du.describe());
        assert_eq!(ds.io_mode(), IoMode::Sync);
        if fs_allows_real_direct(&pu) {
            assert!(du.is_direct(), "{}", du.describe());
        }
        let mu = random_batches(&du, 42, 40);
        let ms = random_batches(&ds, 42, 40);
        assert_eq!(mu, ms);
        check_against_model(&du, &mu);
        check_against_model(&ds, &ms);

        // Larger than one ring (128 SQEs) and a run longer than IOV_MAX (1024 iovecs).
        let big: Vec<Vec<u8>> = (0..1500u64).map(|i| pattern(7, i)).collect();
        let mut reqs: Vec<WriteReq> =
            (0..300u64).map(|i| WriteReq { addr: 2000 + 2 * i, data: &big[i as usize] }).collect();
        for dev in [&du, &ds] {
            dev.write_batch(&reqs).unwrap();
        }
        reqs = (0..1100u64).map(|i| WriteReq { addr: 2700 + i, data: &big[i as usize] }).collect();
        for dev in [&du, &ds] {
            dev.write_batch(&reqs).unwrap();
            dev.flush().unwrap();
        }
        // Read the long run back as one big request through io_uring.
        let mut long = vec![0u8; 1100 * B];
        du.read_batch(&mut [ReadReq { addr: 2700, buf: &mut long }]).unwrap();
        for i in 0..1100 {
            assert_eq!(&long[i * B..(i + 1) * B], &big[i][..], "long run block {i}");
        }
        drop((du, ds));
        let (iu, is) = (std::fs::read(&pu).unwrap(), std::fs::read(&ps).unwrap());
        assert!(iu == is, "io_uring and sync images differ in {}", dir.path().display());
    }
}

#[test]
fn concurrent_writers_on_one_device() {
    const THREADS: u64 = 8;
    const PER: u64 = 96;
    let dir = tempfile::tempdir().unwrap();
    let mut devs: Vec<Arc<dyn BlockDevice>> = vec![Arc::new(MemDevice::new(THREADS * PER * B as u64))];
    for io in [IoChoice::Uring, IoChoice::Sync] {
        let p = image(dir.path(), &format!("mt-{io:?}.img"), THREADS * PER);
        devs.push(Arc::new(open(&p, io)));
    }
    for dev in devs {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let dev = &dev;
                s.spawn(move || {
                    // Thread t owns blocks t, t+8, t+16, ...: interleaved, never adjacent.
                    let mine: Vec<u64> = (0..PER).map(|k| k * THREADS + t).collect();
                    for (round, chunk) in mine.chunks(1 + t as usize * 3).enumerate() {
                        let datas: Vec<Vec<u8>> = chunk.iter().map(|&a| pattern(t, a)).collect();
                        let reqs: Vec<WriteReq> =
                            chunk.iter().zip(&datas).map(|(&addr, d)| WriteReq { addr, data: d }).collect();
                        dev.write_batch(&reqs).unwrap();
                        if round % 4 == 0 {
                            dev.flush().unwrap();
                        }
                    }
                });
            }
        });
        for a in 0..THREADS * PER {
            let mut buf = vec![0u8; B];
            dev.read_block(a, &mut buf).unwrap();
            assert!(buf == pattern(a % THREADS, a), "block {a} on {}", dev.describe());
        }
    }
}

#[test]
fn crash_log_replays_to_the_snapshot_at_every_flush() {
    let mem = MemDevice::new(64 * B as u64);
    let base = mem.snapshot();
    let dev = CrashDevice::new(mem);
    let mut rng = Rng::new(99);
    let mut snapshots = Vec::new();
    for step in 0..200u64 {
        if rng.below(5) == 0 {
            dev.flush().unwrap();
            snapshots.push(dev.inner().snapshot());
            continue;
        }
        let n = 1 + rng.below(3);
        let addr = rng.below(64 - n);
        let data: Vec<u8> = (0..n).flat_map(|k| pattern(step, addr + k)).collect();
        dev.write_batch(&[WriteReq { addr, data: &data }]).unwrap();
    }
    let events = dev.events();
    let points = dev.flush_points();
    assert_eq!(points.len(), snapshots.len());
    assert!(points.len() > 10);
    for (p, snap) in points.iter().zip(&snapshots) {
        assert!(state_at(&base, &events, p + 1) == *snap, "replay differs at flush event {p}");
    }
    assert!(state_at(&base, &events, events.len()) == dev.inner().snapshot());
    // Every write event is exactly one block.
    for e in &events {
        if let EventKind::Write { data, .. } = &e.kind {
            assert_eq!(data.len(), B);
        }
    }
}

fn eio(r: std::io::Result<()>) -> bool {
    matches!(r, Err(e) if e.raw_os_error() == Some(libc::EIO))
}

#[test]
fn injected_faults_reach_the_caller_and_the_medium() {
    let old = vec![0xAAu8; 4 * B];
    let new = vec![0xBBu8; 4 * B];
    let fresh = || {
        let mem = MemDevice::new(8 * B as u64);
        mem.write_batch(&[WriteReq { addr: 0, data: &old }]).unwrap();
        mem
    };

    // 2nd write fails whole; 1st flush fails.
    let dev = CrashDevice::with_faults(fresh(), FaultPlan::new().fail_write(2).fail_flush(1));
    dev.write_block(5, &new[..B]).unwrap();
    assert!(eio(dev.write_batch(&[WriteReq { addr: 0, data: &new }])));
    assert!(dev.inner().snapshot()[..4 * B] == old[..], "failed write must land nothing");
    assert!(eio(dev.flush()));
    assert!(dev.flush_points().is_empty());
    dev.flush().unwrap();
    assert_eq!(dev.flush_points(), vec![1]);
    assert_eq!(dev.event_count(), 2);

    // Short write: 2 of 4 blocks land.
    let dev = CrashDevice::with_faults(fresh(), FaultPlan::new().short_write(1, 2));
    assert!(eio(dev.write_batch(&[WriteReq { addr: 0, data: &new }])));
    let img = dev.inner().snapshot();
    assert!(img[..2 * B] == new[..2 * B] && img[2 * B..4 * B] == old[2 * B..]);
    assert_eq!(dev.event_count(), 2);

    // Torn write: 1 whole block, then 100 bytes of the next.
    let dev = CrashDevice::with_faults(fresh(), FaultPlan::new().torn_write(1, 1, 100));
    assert!(eio(dev.write_batch(&[WriteReq { addr: 0, data: &new }])));
    let img = dev.inner().snapshot();
    assert!(img[..B] == new[..B]);
    assert!(img[B..B + 100] == new[..100], "first k bytes are new");
    assert!(img[B + 100..4 * B] == old[B + 100..], "the rest is old");
    let ev = dev.events();
    assert_eq!(ev.len(), 2);
    assert!(
        matches!(&ev[1].kind, EventKind::Write { addr: 1, data } if data[99] == 0xBB && data[100] == 0xAA)
    );

    // Replaying the log reproduces the torn medium; the plan can be replaced.
    assert!(state_at(&old, &ev, ev.len())[..4 * B] == img[..4 * B]);
    dev.set_fault_plan(FaultPlan::new().torn_write(1, 0, 0));
    assert!(eio(dev.write_block(3, &new[..B])));
    assert!(dev.inner().snapshot()[3 * B..4 * B] == old[3 * B..4 * B]);
    dev.write_block(3, &new[..B]).unwrap();
}

#[test]
fn create_image_never_shrinks_and_open_rejects_non_devices() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.img");
    create_image(&p, 10 * B as u64 + 5).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 10 * B as u64 + 5);
    assert_eq!(open(&p, IoChoice::Sync).block_count(), 10, "size rounds down to blocks");
    create_image(&p, 4 * B as u64).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 10 * B as u64 + 5);
    create_image(&p, 20 * B as u64).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 20 * B as u64);

    assert!(FileDevice::open(dir.path(), DeviceOptions::default()).is_err());
    assert!(FileDevice::open("/dev/null", DeviceOptions::default()).is_err());
    assert!(FileDevice::open(dir.path().join("missing"), DeviceOptions::default()).is_err());
    let dev = lanefs::device::open(&p, DeviceOptions::default()).unwrap();
    assert_eq!(dev.block_count(), 20);
}

#[test]
fn discard_punches_holes_in_image_files() {
    for dir in tmpdirs() {
        for io in [IoChoice::Auto, IoChoice::Sync] {
            let p = image(dir.path(), &format!("trim-{io:?}.img"), 32);
            let dev = open(&p, io);
            let data = vec![0x11u8; 8 * B];
            dev.write_batch(&[WriteReq { addr: 4, data: &data }]).unwrap();
            dev.discard(5, 2).unwrap();
            let mut back = vec![0u8; 8 * B];
            dev.read_batch(&mut [ReadReq { addr: 4, buf: &mut back }]).unwrap();
            assert!(back[..B].iter().all(|&x| x == 0x11));
            assert!(back[B..3 * B].iter().all(|&x| x == 0), "{}", dev.describe());
            assert!(back[3 * B..].iter().all(|&x| x == 0x11));
        }
    }
}

/// Destructive, so opt-in: `LANEFS_TEST_BLOCK_DEVICE=/dev/loopN cargo test -p lanefs --test
/// device -- --ignored block_device`. Checks the size against sysfs, then writes through each
/// back end and reads back through the other.
#[test]
#[ignore = "needs LANEFS_TEST_BLOCK_DEVICE=/dev/loopN (destroys its contents)"]
fn block_device_back_ends_agree() {
    let Ok(path) = std::env::var("LANEFS_TEST_BLOCK_DEVICE") else {
        panic!("set LANEFS_TEST_BLOCK_DEVICE to a scratch block device");
    };
    let name = Path::new(&path).file_name().unwrap().to_string_lossy().into_owned();
    let sectors: u64 =
        std::fs::read_to_string(format!("/sys/class/block/{name}/size")).unwrap().trim().parse().unwrap();
    let du = open(Path::new(&path), IoChoice::Auto);
    let ds = open(Path::new(&path), IoChoice::Sync);
    assert!(du.is_block_device());
    assert_eq!(du.block_count(), sectors * 512 / B as u64);
    assert_eq!(du.io_mode(), IoMode::Uring, "{}", du.describe());
    assert!(du.is_direct());
    let model = random_batches(&du, 5, 20);
    du.flush().unwrap();
    check_against_model(&ds, &model);
    let model = random_batches(&ds, 6, 20);
    ds.flush().unwrap();
    check_against_model(&du, &model);
}
