//! Extended attributes at scale: thousands of names and 64 KiB values per inode, kept in an
//! xattr node while they fit and in xattr blocks beyond (`format::xattr`). Checked through the
//! library on a memory device: set, replace and remove against a model, across checkpoints and
//! remounts with fsck clean; the per-inode limit; the cleaner moving xattr blocks; and crashes at
//! every flush point of a workload, where every fsync acknowledged before the crash must have
//! kept the file's xattrs (or a later version of them).
//!
//! With `LANEFS_TEST_NVM=1` every file system keeps its NAT and lane journals in a region.

mod nvm_mode;

use lanefs::device::{BlockDevice, MemDevice};

use lanefs::format::xattr::{MAX_XATTR_STREAM, XATTR_SIZE_MAX};
use lanefs::format::SummaryKind;
use lanefs::rng::Rng;
use lanefs::testing::checkpoint::{read_checkpoint, read_sit, read_summary, read_superblock};
use lanefs::XattrFlags;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, Ino, MkfsOptions, ROOT};
use lanefs_crashtest::{flush_points, in_flight_after, state_with_subset, CrashDevice};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A device and (in nvm mode) its region.
struct Image {
    dev: Arc<MemDevice>,
    region: Option<nvm_mode::Region>,
}

fn fresh(size: u64) -> Image {
    let dev = Arc::new(MemDevice::new(size));
    Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    Image { dev, region: nvm_mode::Region::if_enabled() }
}

fn opts() -> FsOptions {
    FsOptions { checkpoint_interval: None, ..Default::default() }
}

fn mount(img: &Image) -> Fs {
    Fs::open(img.dev.clone() as Arc<dyn BlockDevice>, nvm_mode::with_region(opts(), img.region.as_ref()))
        .unwrap()
}

fn fsck_clean(img: &Image) -> lanefs::FsckReport {
    let nvm = img.region.as_ref().map(|r| r.path().to_path_buf());
    let r = fsck(&*img.dev, &FsckOptions { nvm, ..Default::default() }).unwrap();
    assert!(r.is_clean(), "fsck: {:#?}", r.problems);
    r
}

/// The value a model entry stands for: `len` bytes derived from `tag`.
fn value(tag: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(tag.wrapping_mul(7919)) as u8).collect()
}

/// Name -> (tag, len): what an inode's xattrs should be.
type Model = BTreeMap<Vec<u8>, (u32, usize)>;

fn set(fs: &Fs, ino: Ino, m: &mut Model, name: &[u8], tag: u32, len: usize) {
    fs.setxattr(ino, name, &value(tag, len), XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setxattr {len} bytes: {e}"));
    m.insert(name.to_vec(), (tag, len));
}

fn assert_matches(fs: &Fs, ino: Ino, m: &Model, what: &str) {
    let names = fs.listxattr(ino).unwrap();
    let want: Vec<Vec<u8>> = m.keys().cloned().collect();
    assert_eq!(names.len(), want.len(), "{what}: number of names");
    assert_eq!(names, want, "{what}: names");
    for (n, &(tag, len)) in m {
        let got = fs.getxattr(ino, n).unwrap();
        assert!(
            got == value(tag, len),
            "{what}: {} holds {} bytes, want {len}",
            String::from_utf8_lossy(n),
            got.len()
        );
    }
}

/// Valid xattr blocks of the image's checkpoint, from its SIT and segment summaries.
fn xattr_blocks(dev: &dyn BlockDevice) -> BTreeSet<u64> {
    let g = read_superblock(dev).unwrap().sb.geometry;
    let cp = read_checkpoint(dev, &g).unwrap().cp;
    let sit = read_sit(dev, &g, &cp).unwrap();
    let mut out = BTreeSet::new();
    for (segno, e) in g.segments().zip(&sit).filter(|(_, e)| e.valid_blocks > 0) {
        let sum = read_summary(dev, &g, segno).unwrap();
        for (off, en) in sum.entries.iter().enumerate() {
            if e.is_valid(off as u32) && en.kind == SummaryKind::Xattr {
                out.insert(g.seg_start(segno) + off as u64);
            }
        }
    }
    out
}

#[test]
fn thousands_of_xattrs_and_64k_values_survive_checkpoints_and_remounts() {
    let img = fresh(256 << 20);
    let fs = mount(&img);
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let mut m = Model::new();
    let mut dm = Model::new();
    // 2000 names of mixed sizes, eight of them 64 KiB values (XATTR_SIZE_MAX, accepted whole).
    let mut rng = Rng::new(14);
    for i in 0..2000u32 {
        let len = match i % 250 {
            0 => XATTR_SIZE_MAX,
            _ => [0, 1, 7, 20, 100, 600, 3000][rng.below(7) as usize],
        };
        set(&fs, f, &mut m, format!("user.attr.{i:05}").as_bytes(), i, len);
    }
    for i in 0..300u32 {
        set(&fs, d, &mut dm, format!("trusted.dir.{i}").as_bytes(), i, (i as usize * 13) % 400);
    }
    assert_matches(&fs, f, &m, "after setting");
    assert_eq!(m.values().filter(|v| v.1 == XATTR_SIZE_MAX).count(), 8);
    // What the kernel gives for the edge cases.
    assert_eq!(
        fs.setxattr(f, b"user.big", &vec![1; XATTR_SIZE_MAX + 1], XattrFlags::empty())
            .unwrap_err()
            .to_errno(),
        libc::E2BIG
    );
    assert_eq!(
        fs.setxattr(f, b"user.attr.00001", b"x", XattrFlags::CREATE).unwrap_err().to_errno(),
        libc::EEXIST
    );
    assert_eq!(
        fs.setxattr(f, b"user.none", b"x", XattrFlags::REPLACE).unwrap_err().to_errno(),
        libc::ENODATA
    );
    assert_eq!(fs.removexattr(f, b"user.none").unwrap_err().to_errno(), libc::ENODATA);
    fs.sync().unwrap();

    // Replace (bigger, smaller, same size), remove, and add, across another checkpoint.
    for i in (0..2000u32).step_by(7) {
        let len = if i % 500 == 0 { XATTR_SIZE_MAX } else { [0, 5000, 12, 33][(i % 4) as usize] };
        let n = format!("user.attr.{i:05}");
        fs.setxattr(f, n.as_bytes(), &value(i + 1, len), XattrFlags::REPLACE).unwrap();
        m.insert(n.into_bytes(), (i + 1, len));
    }
    for i in (3..2000u32).step_by(4) {
        let n = format!("user.attr.{i:05}");
        if m.remove(n.as_bytes()).is_some() {
            fs.removexattr(f, n.as_bytes()).unwrap();
        }
    }
    fs.sync().unwrap();
    for i in 0..150u32 {
        set(&fs, f, &mut m, format!("security.late.{i}").as_bytes(), 9000 + i, 64);
    }
    assert_matches(&fs, f, &m, "after changes");
    fs.unmount().unwrap();
    let r = fsck_clean(&img);
    assert!(r.stats.xattr_blocks > 0, "a set this large lives in xattr blocks");
    let info = lanefs::inspect(&*img.dev).unwrap();
    assert_eq!(info.usage.kinds.xattr, r.stats.xattr_blocks, "inspect counts the xattr blocks fsck found");

    let fs = mount(&img);
    assert_matches(&fs, f, &m, "after remount");
    assert_matches(&fs, d, &dm, "directory after remount");
    // Down to a few short attributes: back inline in the node, no xattr block left.
    let keep: Vec<Vec<u8>> = m.keys().take(3).cloned().collect();
    for n in m.keys().cloned().collect::<Vec<_>>() {
        if !keep.contains(&n) {
            fs.removexattr(f, &n).unwrap();
            m.remove(&n);
        }
    }
    for n in dm.keys() {
        fs.removexattr(d, n).unwrap();
    }
    dm.clear();
    for n in &keep {
        fs.setxattr(f, n, b"short", XattrFlags::empty()).unwrap();
        m.insert(n.clone(), (0, 0));
    }
    fs.unmount().unwrap();
    let r = fsck_clean(&img);
    assert_eq!(r.stats.xattr_blocks, 0);
    assert!(xattr_blocks(&*img.dev).is_empty());
    let fs = mount(&img);
    let names = fs.listxattr(f).unwrap();
    assert_eq!(names, keep);
    assert!(names.iter().all(|n| fs.getxattr(f, n).unwrap() == b"short"));
    assert!(fs.listxattr(d).unwrap().is_empty());
    // Unlinking the file frees whatever its xattrs held.
    fs.unlink(ROOT, b"f").unwrap();
    fs.unmount().unwrap();
    fsck_clean(&img);
}

#[test]
fn the_per_inode_limit_is_enospc_and_unlink_frees_the_blocks() {
    let img = fresh(128 << 20);
    let fs = mount(&img);
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let big = vec![0x5Au8; XATTR_SIZE_MAX];
    let mut n = 0;
    // Bounded: the limit is MAX_XATTR_STREAM bytes.
    let err = loop {
        match fs.setxattr(f, format!("user.v{n:03}").as_bytes(), &big, XattrFlags::empty()) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n * XATTR_SIZE_MAX <= MAX_XATTR_STREAM, "no limit");
    };
    assert_eq!(err.to_errno(), libc::ENOSPC);
    assert!(n * (XATTR_SIZE_MAX + 13) > MAX_XATTR_STREAM - 2 * XATTR_SIZE_MAX, "only {n} values fit");
    // Room again after a removal; replacing a value by one as large always fits.
    fs.setxattr(f, b"user.v000", &big, XattrFlags::REPLACE).unwrap();
    fs.removexattr(f, b"user.v001").unwrap();
    fs.setxattr(f, b"user.again", &big, XattrFlags::CREATE).unwrap();
    // The file system itself is far from full: another inode takes as much.
    let g = fs.create(ROOT, b"g", 0o644, 0, 0).unwrap().ino;
    for i in 0..n {
        fs.setxattr(g, format!("user.v{i:03}").as_bytes(), &big, XattrFlags::empty()).unwrap();
    }
    fs.sync().unwrap();
    fs.unlink(ROOT, b"g").unwrap();
    // Open across the unmount: an orphan, reclaimed by the next mount.
    fs.open_ino(f).unwrap();
    fs.unlink(ROOT, b"f").unwrap();
    fs.sync().unwrap();
    assert!(!xattr_blocks(&*img.dev).is_empty(), "the orphan's xattr blocks are still in use");
    // A crash: the orphan stays in the checkpoint.
    std::mem::forget(fs);
    let copy = Image {
        dev: Arc::new(MemDevice::from_bytes(img.dev.snapshot())),
        region: img.region.as_ref().map(|r| r.copy()),
    };
    let fs = mount(&copy);
    assert_eq!(fs.recovery().orphans_removed, 1);
    fs.unmount().unwrap();
    fsck_clean(&copy);
    assert!(xattr_blocks(&*copy.dev).is_empty(), "orphan reclaim freed the xattr blocks");
}

#[test]
fn the_cleaner_moves_xattr_blocks() {
    let img = fresh(64 << 20);
    let fs = mount(&img);
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut m = Model::new();
    // About 3 MiB of stream: more than a segment of xattr blocks.
    for i in 0..46u32 {
        set(&fs, f, &mut m, format!("user.v{i:02}").as_bytes(), i, XATTR_SIZE_MAX);
    }
    fs.sync().unwrap();
    // Same-size replacements of every other value: the checkpoint rewrites only their blocks,
    // leaving the first segment half valid.
    for i in (0..46u32).step_by(2) {
        set(&fs, f, &mut m, format!("user.v{i:02}").as_bytes(), 100 + i, XATTR_SIZE_MAX);
    }
    fs.sync().unwrap();
    fs.unmount().unwrap();
    fsck_clean(&img);
    let before = xattr_blocks(&*img.dev);
    let fs = mount(&img);
    let cleaned = fs.clean().unwrap();
    assert!(cleaned > 0, "the cleaner emptied nothing");
    assert_matches(&fs, f, &m, "after cleaning");
    fs.unmount().unwrap();
    fsck_clean(&img);
    let after = xattr_blocks(&*img.dev);
    assert_eq!(before.len(), after.len());
    assert!(before != after, "no xattr block moved");
    let fs = mount(&img);
    assert_matches(&fs, f, &m, "after cleaning and remount");
    fs.unmount().unwrap();
}

#[test]
fn fsck_and_mount_catch_a_damaged_xattr_block() {
    let img = fresh(64 << 20);
    let fs = mount(&img);
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut m = Model::new();
    for i in 0..40u32 {
        set(&fs, f, &mut m, format!("user.v{i:02}").as_bytes(), i, 3000);
    }
    fs.unmount().unwrap();
    fsck_clean(&img);
    let blocks = xattr_blocks(&*img.dev);
    assert!(blocks.len() >= 20, "{} xattr blocks", blocks.len());
    let victim = *blocks.iter().nth(blocks.len() / 2).unwrap();
    let mut good = vec![0u8; 4096];
    img.dev.read_block(victim, &mut good).unwrap();
    // A flipped byte (the block's crc32c catches it), and changed bytes under a resealed crc
    // (the stream's crc32c in the node catches those).
    let mut flipped = good.clone();
    flipped[100] ^= 0x40;
    let mut resealed = good.clone();
    resealed[200] ^= 0x01;
    lanefs::format::codec::seal(&mut resealed, lanefs::format::codec::CRC_OFFSET);
    for (what, bad) in [("flipped", flipped), ("resealed", resealed)] {
        img.dev.write_block(victim, &bad).unwrap();
        let nvm = img.region.as_ref().map(|r| r.path().to_path_buf());
        let r = fsck(&*img.dev, &FsckOptions { nvm, ..Default::default() }).unwrap();
        assert!(
            r.problems.iter().any(|p| p.structure == lanefs::Structure::Xattr),
            "{what}: fsck missed it: {:#?}",
            r.problems
        );
        // Mount succeeds (the inode is loaded on first use); reading its xattrs is an error.
        let fs = mount(&img);
        let e = fs.listxattr(f).unwrap_err();
        assert!(matches!(e, lanefs::Error::Corrupt { .. }), "{what}: {e}");
        drop(fs.unmount());
    }
    img.dev.write_block(victim, &good).unwrap();
    fsck_clean(&img);
    let fs = mount(&img);
    assert_matches(&fs, f, &m, "repaired");
    fs.unmount().unwrap();
}

/// One version of the file's xattrs: from the point `at` (device events) on, it may be on disk.
struct Version {
    at: usize,
    xattrs: Model,
}

/// An acknowledged fsync: after a crash past `at`, the file has version `seq` or a later one.
struct Promise {
    at: usize,
    seq: usize,
}

#[test]
fn fsynced_xattrs_survive_a_crash_at_every_flush_point() {
    // Crash states are built from the device's events alone (without a region, in either
    // mode): tests/durability.rs pairs them with a region's.
    let (mut states, mut with_blocks) = (0, 0);
    for seed in [5u64, 17] {
        let dev = MemDevice::new(64 << 20);
        Fs::format(&dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
        let base = dev.snapshot();
        let crash = Arc::new(CrashDevice::new(dev));
        // A small journal bound: checkpoints come during the workload, writing xattr blocks.
        let o = FsOptions { checkpoint_interval: None, journal_blocks_limit: 48, ..Default::default() };
        let fs: &'static Fs =
            Box::leak(Box::new(Fs::open(crash.clone() as Arc<dyn BlockDevice>, o.clone()).unwrap()));
        let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        fs.fsync(ROOT, false).unwrap();
        let mut rng = Rng::new(seed);
        let mut m = Model::new();
        let mut versions = vec![Version { at: 0, xattrs: m.clone() }];
        let mut promises = Vec::new();
        for step in 0..300u32 {
            let r = rng.next_u64();
            let at = crash.event_count();
            match r % 10 {
                0..=6 => {
                    let len = match (r >> 8) % 16 {
                        0 => XATTR_SIZE_MAX,
                        1..=3 => 2000 + (r >> 16) as usize % 9000,
                        _ => (r >> 16) as usize % 200,
                    };
                    // A few hundred names, so the set outgrows its node and stays there.
                    let name = format!("user.n{}", (r >> 32) % 250);
                    set(fs, f, &mut m, name.as_bytes(), step, len);
                }
                7 if !m.is_empty() => {
                    let k = m.keys().nth((r >> 8) as usize % m.len()).unwrap().clone();
                    fs.removexattr(f, &k).unwrap();
                    m.remove(&k);
                }
                8 => {
                    fs.fsync(f, false).unwrap();
                    promises.push(Promise { at: crash.event_count(), seq: versions.len() - 1 });
                    continue;
                }
                9 if r.is_multiple_of(3) => {
                    fs.sync().unwrap();
                    promises.push(Promise { at: crash.event_count(), seq: versions.len() - 1 });
                    continue;
                }
                _ => continue,
            }
            versions.push(Version { at, xattrs: m.clone() });
        }
        assert!(promises.len() > 10, "seed {seed}: {} fsyncs", promises.len());
        assert!(m.len() > 50 && versions.iter().any(|v| v.xattrs.values().any(|x| x.1 == XATTR_SIZE_MAX)));
        let events = crash.events();
        let flushes = flush_points(&events);
        let mut sub = Rng::new(seed ^ 0xABCD);
        for (n, &fl) in flushes.iter().enumerate() {
            // Right after flush `fl`: promises made before event fl + 1 hold.
            let img = state_with_subset(&base, &events, Some(fl), &[]).unwrap();
            let x =
                verify(img, fl + 1, fl + 1, &promises, &versions, f, &o, &format!("seed {seed} flush {n}"));
            with_blocks += usize::from(x > 0);
            states += 1;
            let inflight = in_flight_after(&events, Some(fl));
            if !inflight.is_empty() {
                let subset: Vec<usize> =
                    inflight.iter().copied().filter(|_| sub.next_u64().is_multiple_of(2)).collect();
                let img = state_with_subset(&base, &events, Some(fl), &subset).unwrap();
                let next = flushes.get(n + 1).copied().unwrap_or(events.len());
                let what = format!("seed {seed} flush {n} + {} in flight", subset.len());
                with_blocks += usize::from(verify(img, fl + 1, next, &promises, &versions, f, &o, &what) > 0);
                states += 1;
            }
        }
    }
    eprintln!("{states} crash states, {with_blocks} with the set in xattr blocks");
    assert!(states > 40, "only {states} crash states");
    assert!(with_blocks * 2 > states, "the set was in xattr blocks in only {with_blocks} of {states} states");
}

/// Name -> (fingerprint, length) of each value: what a crash state is compared by.
type Seen = BTreeMap<Vec<u8>, (u32, usize)>;

fn fingerprint(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

fn seen_of(m: &Model) -> Seen {
    m.iter().map(|(n, &(t, l))| (n.clone(), (fingerprint(&value(t, l)), l))).collect()
}

/// Mounts a crash state and checks the file's xattrs: they are the version of the newest
/// fsync that returned before event `promised`, or a later version begun before event `begun`
/// (a checkpoint may have made it durable); then fsck. Returns the xattr blocks fsck found.
#[allow(clippy::too_many_arguments)]
fn verify(
    image: Vec<u8>,
    promised: usize,
    begun: usize,
    promises: &[Promise],
    versions: &[Version],
    f: Ino,
    o: &FsOptions,
    what: &str,
) -> u64 {
    let dev = Arc::new(MemDevice::from_bytes(image));
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, o.clone())
        .unwrap_or_else(|e| panic!("{what}: mount: {e}"));
    let newest = promises.iter().rfind(|p| p.at <= promised);
    match fs.listxattr(f) {
        Ok(names) => {
            let got: Seen = names
                .into_iter()
                .map(|n| {
                    let v = fs.getxattr(f, &n).unwrap();
                    (n, (fingerprint(&v), v.len()))
                })
                .collect();
            let first = newest.map_or(0, |p| p.seq);
            let ok = versions[first..]
                .iter()
                .enumerate()
                .filter(|(i, v)| *i == 0 || v.at < begun)
                .any(|(_, v)| seen_of(&v.xattrs) == got);
            assert!(
                ok,
                "{what}: {} xattrs match neither the fsynced version ({} names) nor a later one",
                got.len(),
                versions[first].xattrs.len()
            );
        }
        // Only before the first fsync (the file's name was made durable before any).
        Err(e) => assert!(newest.is_none() && e.to_errno() == libc::ENOENT, "{what}: the file: {e}"),
    }
    fs.unmount().unwrap();
    let r = fsck(&*dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "{what}: fsck: {:#?}", r.problems);
    r.stats.xattr_blocks
}
