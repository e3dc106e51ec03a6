//! fallocate on the engine: preallocation reserves space (ENOSPC up front, with nothing
//! changed, and never later for a write into the reserved range, however full the file system
//! is otherwise), the reservation survives unmount and crashes, truncate, punch, zero range and
//! unlink give it back, and zero range zeroes bytes (cached pages too) and keeps the space
//! allocated. fsck, which counts the unwritten blocks of every tree against the checkpoint's
//! reserved count, checks every image.
//!
//! With `LANEFS_TEST_NVM=1` every image has a persistent-memory region (`nvm_mode`), except in
//! the crash test, which records the device only.

mod nvm_mode;

use lanefs::device::{BlockDevice, MemDevice};

use lanefs::rng::Rng;
use lanefs::FallocMode;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, Ino, MkfsOptions, ROOT};
use lanefs_crashtest::{flush_points, state_at, CrashDevice};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const B: u64 = 4096;
const COLLAPSE: FallocMode = FallocMode(0x08);
const INSERT: FallocMode = FallocMode(0x20);
const UNSHARE: FallocMode = FallocMode(0x40);

/// A formatted in-memory image and the region its mounts use in nvm mode.
struct Image {
    dev: Arc<MemDevice>,
    region: Option<nvm_mode::Region>,
}

impl Image {
    fn new(size: u64) -> Image {
        let dev = MemDevice::new(size);
        Fs::format(&dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
        Image { dev: Arc::new(dev), region: nvm_mode::Region::if_enabled() }
    }

    fn mount(&self) -> Fs {
        let opts = FsOptions {
            cache_bytes: 8 * MIB,
            checkpoint_interval: None,
            nvm: self.region.as_ref().map(|r| r.path().to_path_buf()),
            ..Default::default()
        };
        Fs::open(self.dev.clone() as Arc<dyn BlockDevice>, opts).unwrap()
    }

    fn fsck_clean(&self) {
        let opts =
            FsckOptions { nvm: self.region.as_ref().map(|r| r.path().to_path_buf()), ..Default::default() };
        let r = fsck(&*self.dev, &opts).unwrap();
        assert!(r.is_clean(), "fsck: {:#?}", r.problems);
    }
}

#[track_caller]
fn errno(r: lanefs::Result<()>) -> i32 {
    r.expect_err("an error").to_errno()
}

/// Free blocks as statfs reports them, with nothing dirty (so the count is exact).
fn free(fs: &Fs) -> u64 {
    fs.sync().unwrap();
    fs.statfs().bfree
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn read_all(fs: &Fs, ino: Ino) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let mut done = 0;
    while done < size {
        let n = fs.read_at(ino, done as u64, &mut buf[done..]).unwrap();
        assert!(n > 0, "short read at {done} of {size}");
        done += n;
    }
    buf
}

/// Writes a new file `name` in 256 KiB pieces until ENOSPC; returns its inode and the bytes
/// written. Any other error fails the test.
fn fill(fs: &Fs, name: &str) -> (Ino, u64) {
    let ino = fs.create(ROOT, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
    let chunk = pattern(7, 256 << 10);
    let mut off = 0u64;
    loop {
        match fs.write_at(ino, off, &chunk) {
            Ok(n) => off += n as u64,
            Err(e) if e.to_errno() == libc::ENOSPC => break,
            Err(e) => panic!("filling {name} at {off}: {e}"),
        }
        assert!(off < 1 << 30, "the file system never filled");
    }
    // The last pieces may fit one page at a time.
    let page = pattern(8, B as usize);
    while fs.write_at(ino, off, &page).is_ok() {
        off += B;
    }
    (ino, off)
}

/// Writes `len` bytes of pattern `seed` at `off` in 64 KiB pieces; every piece must succeed.
fn write_range(fs: &Fs, ino: Ino, off: u64, len: u64, seed: u64, what: &str) -> Vec<u8> {
    let data = pattern(seed, len as usize);
    for (k, piece) in data.chunks(64 << 10).enumerate() {
        let at = off + (k as u64) * (64 << 10);
        fs.write_at(ino, at, piece).unwrap_or_else(|e| panic!("{what}: write at {at}: {e}"));
    }
    data
}

#[test]
fn fallocate_beyond_the_free_space_fails_and_changes_nothing() {
    let img = Image::new(128 * MIB);
    let fs = img.mount();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let old = pattern(1, 10_000);
    fs.write_at(f, 0, &old).unwrap();
    let before = free(&fs);
    let attr = fs.getattr(f).unwrap();
    assert!(before > 4096, "a 128 MiB image has room: {before} blocks");
    // statfs reports the data blocks that fit beside the nodes that map them (a node per
    // ~1000 blocks): a few more than that may fit, a node's share more may not.
    let beyond = |free: u64| (free + free / 256 + 4) * B;
    let too_big = beyond(before);
    for mode in [
        FallocMode::empty(),
        FallocMode::KEEP_SIZE,
        FallocMode::ZERO_RANGE,
        FallocMode::ZERO_RANGE | FallocMode::KEEP_SIZE,
    ] {
        assert_eq!(errno(fs.fallocate(f, mode, 20_000, too_big)), libc::ENOSPC, "mode {mode:#x}");
        let now = fs.getattr(f).unwrap();
        assert_eq!((now.size, now.blocks), (attr.size, attr.blocks), "mode {mode:#x} changed the file");
        assert_eq!(read_all(&fs, f), old);
        assert_eq!(free(&fs), before, "mode {mode:#x} kept space after ENOSPC");
    }
    // Exactly what statfs reports free fits (the nodes that map it included): a file system
    // with nothing else going on grants it, then has nothing left.
    let all = fs.create(ROOT, b"all", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(all, FallocMode::empty(), 0, before * B).unwrap();
    assert_eq!(errno(fs.fallocate(f, FallocMode::empty(), 20_000, 64 * B)), libc::ENOSPC);
    fs.unlink(ROOT, b"all").unwrap();
    assert_eq!(free(&fs), before, "the unlink gave it all back");
    // The same file system grants what it has: half the space, then the rest is short again.
    let half = before / 2;
    fs.fallocate(f, FallocMode::empty(), 20_000, half * B).unwrap();
    let after = free(&fs);
    assert!(after <= before - half, "{half} blocks preallocated, free went from {before} to {after}");
    assert!(after + 16 >= before - half, "the preallocation cost more than its blocks and nodes");
    assert_eq!(fs.getattr(f).unwrap().size, 20_000 + half * B);
    assert!(fs.getattr(f).unwrap().blocks >= half * 8, "st_blocks counts the preallocated blocks");
    let mut expect = old.clone();
    expect.resize((20_000 + half * B) as usize, 0);
    assert_eq!(read_all(&fs, f), expect, "preallocated blocks read as zeros");
    assert_eq!(errno(fs.fallocate(f, FallocMode::empty(), 1 << 30, beyond(after))), libc::ENOSPC);
    // A new file cannot have what is promised to f.
    let g = fs.create(ROOT, b"g", 0o644, 0, 0).unwrap().ino;
    assert_eq!(errno(fs.fallocate(g, FallocMode::KEEP_SIZE, 0, beyond(after))), libc::ENOSPC);
    assert_eq!(fs.getattr(g).unwrap().blocks, 0);
    fs.unmount().unwrap();
    img.fsck_clean();
}

#[test]
fn reserved_space_stays_writable_when_the_file_system_is_otherwise_full() {
    let img = Image::new(128 * MIB);
    let fs = img.mount();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let len = 16 * MIB;
    // Past the size (KEEP_SIZE) and up to it: both are promised.
    fs.fallocate(f, FallocMode::empty(), 0, len / 2).unwrap();
    fs.fallocate(f, FallocMode::KEEP_SIZE, len / 2, len / 2).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, len / 2);
    // Made before the fill: a new inode needs a node block, which a full file system refuses.
    let h = fs.create(ROOT, b"h", 0o644, 0, 0).unwrap().ino;
    let (g, filled) = fill(&fs, "g");
    assert!(filled > 32 * MIB, "only {filled} bytes fit beside the preallocation");
    assert!(free(&fs) < 64, "full: {} blocks free", fs.statfs().bfree);
    assert_eq!(errno(fs.create(ROOT, b"i", 0o644, 0, 0).map(|_| ())), libc::ENOSPC);
    assert_eq!(errno(fs.fallocate(h, FallocMode::empty(), 0, 64 * B)), libc::ENOSPC);
    assert_eq!(fs.write_at(h, 0, &[1u8; 64 << 10]).unwrap_err().to_errno(), libc::ENOSPC);
    // Every byte of the promised range can be written, and (the file system still full)
    // written again: an overwrite needs a free block only until the next checkpoint.
    let first = write_range(&fs, f, 0, len, 11, "first write into the reservation");
    fs.fsync(f, false).unwrap();
    let second = write_range(&fs, f, 0, len, 12, "overwrite of the reservation");
    fs.fsync(f, false).unwrap();
    assert_ne!(first, second);
    assert_eq!(fs.getattr(f).unwrap().size, len);
    assert_eq!(read_all(&fs, f), second);
    assert_eq!(fs.write_at(h, 0, &[1u8; 64 << 10]).unwrap_err().to_errno(), libc::ENOSPC, "still full");
    let g_data = read_all(&fs, g);
    fs.unmount().unwrap();
    img.fsck_clean();
    let fs = img.mount();
    assert_eq!(read_all(&fs, f), second);
    assert_eq!(read_all(&fs, g), g_data);
    fs.unmount().unwrap();
    img.fsck_clean();
}

#[test]
fn the_reservation_survives_remount_and_truncate_punch_zero_and_unlink_give_it_back() {
    let img = Image::new(128 * MIB);
    let fs = img.mount();
    let n = 2048u64; // 8 MiB: two direct nodes per file
    let files: Vec<Ino> = (0..4)
        .map(|i| {
            let ino = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.fallocate(ino, if i % 2 == 0 { FallocMode::empty() } else { FallocMode::KEEP_SIZE }, 0, n * B)
                .unwrap();
            ino
        })
        .collect();
    let promised = free(&fs);
    fs.unmount().unwrap();
    img.fsck_clean();
    let fs = img.mount();
    assert_eq!(free(&fs), promised, "a remount keeps the reservations");
    // (statfs reports the data blocks that fit beside their nodes: within a few blocks of n.)
    let gained = |before: u64, what: &str| {
        let now = free(&fs);
        assert!(now + 4 >= before + n, "{what}: free went from {before} to {now}, {n} blocks given back");
        assert!(now <= before + n + 8, "{what}: free went from {before} to {now}, more than {n} blocks");
        now
    };
    // Preallocated past the size (KEEP_SIZE): a truncate to the size drops it, as on ext4.
    fs.truncate(files[1], 0).unwrap();
    let now = gained(promised, "truncate");
    // A punch goes as far as the size (as on ext4).
    fs.fallocate(files[0], FallocMode::PUNCH_HOLE | FallocMode::KEEP_SIZE, 0, n * B + 100).unwrap();
    let now = gained(now, "punch");
    fs.unlink(ROOT, b"f2").unwrap();
    let now = gained(now, "unlink");
    // Zero range keeps what it covers allocated: nothing comes back.
    fs.fallocate(files[3], FallocMode::ZERO_RANGE | FallocMode::KEEP_SIZE, 0, n * B).unwrap();
    assert_eq!(free(&fs), now);
    fs.unmount().unwrap();
    img.fsck_clean();
    // What is left is still promised, and still writable on a full file system.
    let fs = img.mount();
    assert_eq!(free(&fs), now);
    fill(&fs, "g");
    write_range(&fs, files[3], 0, n * B, 3, "the remaining reservation after remount");
    fs.unmount().unwrap();
    img.fsck_clean();
}

/// A crash at any flush point of a run that preallocates, writes into, zeroes and deletes
/// preallocated ranges recovers to an image whose reserved count matches its trees (fsck), and
/// once the fallocate's fsync was acknowledged, its whole range is writable on a file system
/// that another file then fills to ENOSPC.
#[test]
fn the_reservation_survives_a_crash_at_every_flush_point() {
    let dev = MemDevice::new(64 * MIB);
    Fs::format(&dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
    let base = dev.snapshot();
    let crash = Arc::new(CrashDevice::new(dev));
    let opts = || FsOptions { checkpoint_interval: None, journal_blocks_limit: 64, ..Default::default() };
    // A crash, not an unmount, ends the run: the file system is never dropped.
    let fs: &'static Fs =
        Box::leak(Box::new(Fs::open(crash.clone() as Arc<dyn BlockDevice>, opts()).unwrap()));
    let len = 4 * MIB;
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(f, FallocMode::KEEP_SIZE, 0, len).unwrap();
    fs.fsync(f, false).unwrap();
    let promised = crash.event_count();
    fs.write_at(f, 0, &pattern(1, (len / 4) as usize)).unwrap();
    fs.fsync(f, false).unwrap();
    fs.fallocate(f, FallocMode::ZERO_RANGE | FallocMode::KEEP_SIZE, 100_000, 300_000).unwrap();
    fs.fsync(f, false).unwrap();
    let h = fs.create(ROOT, b"h", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(h, FallocMode::empty(), 0, 2 * MIB).unwrap();
    fs.fsync(h, false).unwrap();
    fs.sync().unwrap();
    fs.unlink(ROOT, b"h").unwrap();
    fs.fsync(ROOT, false).unwrap();
    fs.write_at(f, len / 2, &pattern(2, 50_000)).unwrap();
    fs.fsync(f, false).unwrap();
    let events = crash.events();
    let points = flush_points(&events);
    assert!(points.len() >= 8, "the run has {} flush points", points.len());
    let after: Vec<usize> = points.iter().copied().filter(|&p| p >= promised).collect();
    // The full check (fill, then write the range) at the first state that must keep the
    // promise, the last, and a few between; fsck everywhere.
    let full_checks: Vec<usize> =
        [0, after.len() / 3, 2 * after.len() / 3, after.len() - 1].iter().map(|&k| after[k]).collect();
    for &p in &points {
        let what = format!("crash after flush event {p} of {}", events.len());
        let dev = Arc::new(MemDevice::from_bytes(state_at(&base, &events, p + 1)));
        let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts())
            .unwrap_or_else(|e| panic!("{what}: mount: {e}"));
        if full_checks.contains(&p) {
            let size = fs.getattr(f).unwrap_or_else(|e| panic!("{what}: f: {e}")).size;
            assert!(size <= len, "{what}: f grew to {size}");
            fill(&fs, "g");
            write_range(&fs, f, 0, len, 9, &what);
            fs.fsync(f, false).unwrap();
            assert_eq!(read_all(&fs, f), pattern(9, len as usize), "{what}");
        }
        fs.unmount().unwrap_or_else(|e| panic!("{what}: unmount: {e}"));
        let r = fsck(&*dev, &FsckOptions::default()).unwrap();
        assert!(r.is_clean(), "{what}: fsck: {:#?}", r.problems);
    }
}

/// The file as the test believes it is.
struct Model {
    data: Vec<u8>,
}

impl Model {
    fn write(&mut self, off: u64, bytes: &[u8]) {
        let end = off as usize + bytes.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[off as usize..end].copy_from_slice(bytes);
    }
    /// Zero (or punch) `[off, off + len)` within the size, then grow to `off + len` unless
    /// `keep`.
    fn zero(&mut self, off: u64, len: u64, keep: bool) {
        let end = (off + len) as usize;
        let size = self.data.len();
        for b in &mut self.data[(off as usize).min(size)..end.min(size)] {
            *b = 0;
        }
        if !keep && size < end {
            self.data.resize(end, 0);
        }
    }
}

#[test]
fn zero_range_zeroes_partial_and_cached_pages_and_keeps_the_space() {
    let img = Image::new(128 * MIB);
    let fs = img.mount();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut m = Model { data: Vec::new() };
    let d = pattern(5, 40_960);
    fs.write_at(f, 0, &d).unwrap();
    m.write(0, &d);
    fs.fsync(f, false).unwrap();
    fs.sync().unwrap();
    // Within the size, over written blocks: a partial page at each end, whole pages between.
    fs.fallocate(f, FallocMode::ZERO_RANGE, 5000, 10_000).unwrap();
    m.zero(5000, 10_000, false);
    assert_eq!(read_all(&fs, f), m.data);
    // Over pages still dirty in the cache (never written to the device).
    let d = pattern(6, 12_000);
    fs.write_at(f, 20_000, &d).unwrap();
    m.write(20_000, &d);
    fs.fallocate(f, FallocMode::ZERO_RANGE | FallocMode::KEEP_SIZE, 21_000, 9_000).unwrap();
    m.zero(21_000, 9_000, true);
    assert_eq!(read_all(&fs, f), m.data);
    // Past the end with KEEP_SIZE: the size stays, the blocks are allocated, and growing the
    // file later shows zeros there.
    let blocks = fs.getattr(f).unwrap().blocks;
    fs.fallocate(f, FallocMode::ZERO_RANGE | FallocMode::KEEP_SIZE, 40_000, 20_000).unwrap();
    m.zero(40_000, 20_000, true);
    assert_eq!(fs.getattr(f).unwrap().size, 40_960);
    assert!(fs.getattr(f).unwrap().blocks >= blocks + 4 * 8, "zero range past the end allocates");
    fs.truncate(f, 60_000).unwrap();
    m.data.resize(60_000, 0);
    assert_eq!(read_all(&fs, f), m.data);
    // Past the end without it: the size grows to the end of the range.
    fs.fallocate(f, FallocMode::ZERO_RANGE, 70_000, 5_000).unwrap();
    m.zero(70_000, 5_000, false);
    assert_eq!(fs.getattr(f).unwrap().size, 75_000);
    assert_eq!(read_all(&fs, f), m.data);
    // Zeroed blocks are reserved: writing into them draws on the reservation.
    let before = free(&fs);
    let d = pattern(7, 8192);
    fs.write_at(f, 8192, &d).unwrap();
    m.write(8192, &d);
    assert_eq!(free(&fs), before, "a write into zeroed blocks takes no new space");
    // Modes FUSE and the VFS refuse, refused here too, changing nothing.
    for mode in [
        COLLAPSE,
        INSERT,
        UNSHARE,
        FallocMode::PUNCH_HOLE | FallocMode::ZERO_RANGE | FallocMode::KEEP_SIZE,
        FallocMode::PUNCH_HOLE,
    ] {
        assert_eq!(errno(fs.fallocate(f, mode, 0, 4096)), libc::EOPNOTSUPP, "mode {mode:#x}");
    }
    assert_eq!(read_all(&fs, f), m.data);
    fs.unmount().unwrap();
    img.fsck_clean();
    let fs = img.mount();
    assert_eq!(read_all(&fs, f), m.data, "after remount");
    fs.unmount().unwrap();
    img.fsck_clean();
}

/// Random writes, truncates, preallocations, punches and zero ranges against a byte model,
/// read back after every step, with syncs and remounts between; fsck after each remount.
#[test]
fn random_fallocate_modes_match_a_byte_model() {
    let img = Image::new(64 * MIB);
    let mut rng = Rng::new(0xFA11);
    let mut fs = img.mount();
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut m = Model { data: Vec::new() };
    for step in 0..400 {
        let off = rng.below(20 * B);
        let len = 1 + if rng.chance(1, 2) { rng.below(B) } else { rng.below(6 * B) };
        let keep = rng.chance(1, 2);
        let what = match rng.below(10) {
            0..=2 => {
                let d = pattern(step, len as usize);
                fs.write_at(f, off, &d).unwrap();
                m.write(off, &d);
                "write"
            }
            3 => {
                fs.truncate(f, off).unwrap();
                m.data.resize(off as usize, 0);
                "truncate"
            }
            4 => {
                fs.fallocate(f, if keep { FallocMode::KEEP_SIZE } else { FallocMode::empty() }, off, len)
                    .unwrap();
                if !keep && (m.data.len() as u64) < off + len {
                    m.data.resize((off + len) as usize, 0);
                }
                "allocate"
            }
            5 => {
                fs.fallocate(f, FallocMode::PUNCH_HOLE | FallocMode::KEEP_SIZE, off, len).unwrap();
                m.zero(off, len, true);
                "punch"
            }
            6..=7 => {
                let mode =
                    FallocMode::ZERO_RANGE | if keep { FallocMode::KEEP_SIZE } else { FallocMode::empty() };
                fs.fallocate(f, mode, off, len).unwrap();
                m.zero(off, len, keep);
                "zero range"
            }
            8 => {
                fs.fsync(f, false).unwrap();
                "fsync"
            }
            _ => {
                if rng.chance(1, 3) {
                    fs.unmount().unwrap();
                    img.fsck_clean();
                    fs = img.mount();
                    "remount"
                } else {
                    fs.sync().unwrap();
                    "sync"
                }
            }
        };
        assert_eq!(fs.getattr(f).unwrap().size, m.data.len() as u64, "step {step} ({what} {off} {len})");
        let got = read_all(&fs, f);
        if let Some(i) = (0..got.len()).find(|&i| got[i] != m.data[i]) {
            panic!("step {step} ({what} {off} {len} keep {keep}): byte {i} is {}, not {}", got[i], m.data[i]);
        }
    }
    fs.unmount().unwrap();
    img.fsck_clean();
}
