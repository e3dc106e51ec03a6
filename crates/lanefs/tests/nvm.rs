//! The NAT in a persistent-memory region (`FsOptions::nvm`, issue 7 step 2): mounts, crashes
//! and refusals through the library. The protocol's own crash states are enumerated in
//! `src/pmem/nat_tests.rs`.

use lanefs::device::{BlockDevice, MemDevice};

use lanefs::format::checkpoint::CP_FLAG_NVM_NAT;
use lanefs::testing::checkpoint::{read_checkpoint, read_superblock};
use lanefs::testing::pmem::MIN_REGION_SIZE;
use lanefs::RegionFault;
use lanefs::{Error, Fs, FsOptions, MkfsOptions, ROOT};
use lanefs_crashtest::{CrashDevice, EventKind, FaultPlan};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod region;
use region::{data, image, opts, scratch};

fn mount(dev: &Arc<dyn BlockDevice>, nvm: Option<&Path>) -> lanefs::Result<Fs> {
    Fs::open(dev.clone(), opts(nvm))
}

fn flags(dev: &dyn BlockDevice) -> u32 {
    let g = read_superblock(dev).unwrap().sb.geometry;
    read_checkpoint(dev, &g).unwrap().cp.flags
}

fn read_all(fs: &Fs, path: &str) -> Vec<u8> {
    let a = fs.resolve(path).unwrap();
    let mut b = vec![0u8; a.size as usize];
    assert_eq!(fs.read_at(a.ino, 0, &mut b).unwrap(), b.len());
    b
}

/// Creates `n` files under a new directory `d` and fsyncs them; returns their contents.
fn populate(fs: &Fs, d: &str, n: usize, seed: u8) -> Vec<(String, Vec<u8>)> {
    let dir = fs.mkdir(ROOT, d.as_bytes(), 0o755, 0, 0).unwrap().ino;
    let mut out = Vec::new();
    for i in 0..n {
        let f = fs.create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        let b = data(seed.wrapping_add(i as u8), 3000 + 1500 * i);
        fs.write_at(f, 0, &b).unwrap();
        fs.fsync(f, false).unwrap();
        out.push((format!("/{d}/f{i}"), b));
    }
    out
}

fn check_files(fs: &Fs, files: &[(String, Vec<u8>)]) {
    for (p, b) in files {
        assert_eq!(&read_all(fs, p), b, "{p}");
    }
}

/// Records in the region's last NAT log (0 without a region).
fn last_log_records(region: &Path) -> u32 {
    std::fs::read(region).map(|r| u32::from_le_bytes(r[4104..4108].try_into().unwrap())).unwrap_or(0)
}

fn nat_area(dev: &dyn BlockDevice) -> std::ops::Range<u64> {
    let g = read_superblock(dev).unwrap().sb.geometry;
    g.nat_blkaddr..g.nat_blkaddr + 2 * g.nat_blocks as u64
}

#[test]
fn files_survive_checkpoints_and_remounts_with_the_nat_in_the_region() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let dev: Arc<dyn BlockDevice> = Arc::new(image());
    // First without a region: the device NAT has entries to seed the region from.
    let fs = mount(&dev, None).unwrap();
    let mut files = populate(&fs, "z", 6, 0);
    fs.unmount().unwrap();
    let fs = mount(&dev, Some(&region)).unwrap();
    assert!(region.exists(), "created on first use");
    assert!(fs.nvm().unwrap().describe().contains("NAT of"));
    check_files(&fs, &files);
    files.extend(populate(&fs, "a", 8, 1));
    fs.sync().unwrap();
    assert_ne!(flags(&*dev) & CP_FLAG_NVM_NAT, 0, "the checkpoint says where its NAT is");
    files.extend(populate(&fs, "b", 5, 2));
    fs.unlink(fs.resolve("/a").unwrap().ino, b"f3").unwrap();
    files.retain(|(p, _)| p != "/a/f3");
    fs.unmount().unwrap();

    let fs = mount(&dev, Some(&region)).unwrap();
    check_files(&fs, &files);
    assert!(fs.resolve("/a/f3").is_err());
    // Many checkpoints in a row: each log replaces the previous one.
    for round in 0..5u8 {
        files.extend(populate(&fs, &format!("c{round}"), 3, 10 + round));
        fs.sync().unwrap();
    }
    drop(fs);
    let fs = mount(&dev, Some(&region)).unwrap();
    check_files(&fs, &files);
}

#[test]
fn checkpoints_with_a_region_write_no_nat_block() {
    for with_region in [false, true] {
        let d = scratch();
        let region = d.path().join("r.nvm");
        let crash = Arc::new(CrashDevice::new(image()));
        let dev: Arc<dyn BlockDevice> = crash.clone();
        let nvm = with_region.then_some(region.as_path());
        let fs = mount(&dev, nvm).unwrap();
        let start = crash.event_count();
        populate(&fs, "a", 20, 3);
        fs.sync().unwrap();
        populate(&fs, "b", 20, 4);
        fs.unmount().unwrap();
        let area = nat_area(&*dev);
        let written = crash.with_events(|ev| {
            ev[start..].iter().filter(|e| matches!(e.kind, EventKind::Write { .. })).count()
        });
        let nat_writes = crash.with_events(|ev| {
            ev[start..]
                .iter()
                .filter(|e| matches!(&e.kind, EventKind::Write { addr, .. } if area.contains(addr)))
                .count()
        });
        eprintln!(
            "region {with_region}: {written} blocks written, {nat_writes} of them NAT blocks, {} region records",
            last_log_records(&region)
        );
        if with_region {
            assert_eq!(nat_writes, 0, "NAT blocks written with the NAT in the region");
        } else {
            assert!(nat_writes >= 2, "the control run writes NAT blocks ({nat_writes})");
        }
    }
}

#[test]
fn a_flagged_image_needs_its_region() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let dev: Arc<dyn BlockDevice> = Arc::new(image());
    let fs = mount(&dev, Some(&region)).unwrap();
    let files = populate(&fs, "a", 3, 5);
    fs.unmount().unwrap();

    // Without a region: the device NAT is stale, so the mount is refused.
    let e = mount(&dev, None).err().unwrap();
    assert!(e.to_string().contains("--nvm"), "{e}");
    // A region path that does not exist is not created: the NAT is elsewhere.
    let other = d.path().join("elsewhere.nvm");
    let e = mount(&dev, Some(&other)).err().unwrap();
    assert!(matches!(e, Error::Region { fault: RegionFault::Missing, .. }), "{e}");
    assert!(e.to_string().contains(&other.display().to_string()), "{e}");
    assert!(!other.exists());
    // The region of another image.
    let dev2: Arc<dyn BlockDevice> = Arc::new(image());
    let e = mount(&dev2, Some(&region)).err().unwrap();
    assert!(matches!(e, Error::Region { fault: RegionFault::WrongImage, .. }), "{e}");
    // A corrupt region header.
    let good = std::fs::read(&region).unwrap();
    let mut bad = good.clone();
    bad[100] ^= 1;
    std::fs::write(&region, &bad).unwrap();
    let e = mount(&dev, Some(&region)).err().unwrap();
    assert!(matches!(e, Error::Region { fault: RegionFault::Corrupt, .. }), "{e}");
    // A region recreated since (bound to the image, but empty).
    std::fs::remove_file(&region).unwrap();
    let uuid = read_superblock(&*dev).unwrap().sb.uuid;
    drop(
        lanefs::testing::pmem::PmemRegion::create(&region, MIN_REGION_SIZE, uuid, &Default::default())
            .unwrap(),
    );
    let e = mount(&dev, Some(&region)).err().unwrap();
    assert!(matches!(e, Error::Region { fault: RegionFault::Stale, .. }), "{e}");
    // The right one again.
    std::fs::write(&region, &good).unwrap();
    let fs = mount(&dev, Some(&region)).unwrap();
    check_files(&fs, &files);
    drop(fs);
    // fsck without the region says it needs it.
    let e = lanefs::fsck(&*dev, &Default::default()).err().unwrap();
    assert!(e.to_string().contains("persistent-memory region"), "{e}");
}

#[test]
fn too_small_region_is_refused_naming_the_file() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let dev = MemDevice::new(1 << 30);
    Fs::format(&dev, &MkfsOptions::default()).unwrap();
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let e = mount(&dev, Some(&region)).err().unwrap();
    assert!(matches!(e, Error::Region { fault: RegionFault::TooSmall, .. }), "{e}");
    assert!(e.to_string().contains("--nvm-size"), "{e}");
    // The refused mount left a valid 1 MiB region, which stays too small; a new one of the
    // default size fits.
    assert!(mount(&dev, Some(&region)).is_err());
    std::fs::remove_file(&region).unwrap();
    let fs = Fs::open(dev.clone(), FsOptions { nvm_size: None, ..opts(Some(&region)) }).unwrap();
    // The default: the NAT of this 1 GiB image plus 32 MiB of journal for each of its lanes.
    let len = std::fs::metadata(&region).unwrap().len();
    let lanes = MkfsOptions::default().lanes;
    assert!(len >= lanes as u64 * lanefs::testing::pmem::DEFAULT_JOURNAL_PER_LANE + (4 << 20), "{len}");
    assert!(len <= lanes as u64 * lanefs::testing::pmem::DEFAULT_JOURNAL_PER_LANE + (16 << 20), "{len}");
    populate(&fs, "a", 2, 6);
    fs.unmount().unwrap();
}

#[test]
fn crash_after_fsync_recovers_from_region_and_journal() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let copy = d.path().join("copy.nvm");
    let mem = Arc::new(image());
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let fs = mount(&dev, Some(&region)).unwrap();
    let mut files = populate(&fs, "a", 6, 7);
    fs.sync().unwrap();
    files.extend(populate(&fs, "b", 6, 8));
    // Rewrite a checkpointed file and fsync: journal only.
    let f = fs.resolve("/a/f1").unwrap().ino;
    let b = data(99, 9000);
    fs.write_at(f, 0, &b).unwrap();
    fs.fsync(f, false).unwrap();
    files.iter_mut().find(|(p, _)| p == "/a/f1").unwrap().1 = b;
    // Crash: the device and the region as they are now (the fsyncs committed to the region's
    // lane journals; no checkpoint runs meanwhile).
    let img = mem.snapshot();
    std::fs::copy(&region, &copy).unwrap();
    drop(fs);

    let dev2: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(img));
    let fs = mount(&dev2, Some(&copy)).unwrap();
    assert!(fs.recovery().transactions > 0, "{:?}", fs.recovery());
    check_files(&fs, &files);
    drop(fs);
    let fs = mount(&dev2, Some(&copy)).unwrap();
    check_files(&fs, &files);
}

#[test]
fn a_checkpoint_that_fails_before_its_pack_leaves_the_previous_nat() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let crash = Arc::new(CrashDevice::new(image()));
    let dev: Arc<dyn BlockDevice> = crash.clone();
    let fs = mount(&dev, Some(&region)).unwrap();
    let mut files = populate(&fs, "a", 4, 9);
    fs.sync().unwrap();
    files.extend(populate(&fs, "b", 4, 10));
    // Renames and unlinks change NAT entries at the next checkpoint.
    let a = fs.resolve("/a").unwrap().ino;
    fs.unlink(a, b"f0").unwrap();
    files.retain(|(p, _)| p != "/a/f0");
    fs.fsync(a, false).unwrap();
    let before = flags(&*dev);
    let version = {
        let g = read_superblock(&*dev).unwrap().sb.geometry;
        read_checkpoint(&*dev, &g).unwrap().cp.version
    };
    // The checkpoint's first flush (after its node blocks, before its pack) fails: the region
    // has a committed log for a pack that never lands.
    crash.set_fault_plan(FaultPlan::new().fail_flush(1));
    assert!(fs.sync().is_err());
    drop(fs);
    crash.set_fault_plan(FaultPlan::new());
    assert_eq!(flags(&*dev), before);
    // COMMIT word (offset 4096 + 8): the log of the next checkpoint, not empty.
    let r = std::fs::read(&region).unwrap();
    let commit = u64::from_le_bytes(r[4104..4112].try_into().unwrap());
    assert_eq!(commit >> 32, (version + 1) & 0xFFFF_FFFF);
    assert!(commit as u32 > 0, "the failed checkpoint logged NAT changes");
    let fs = mount(&dev, Some(&region)).unwrap();
    check_files(&fs, &files);
    assert!(fs.resolve("/a/f0").is_err());
    fs.unmount().unwrap();
    let fs = mount(&dev, Some(&region)).unwrap();
    check_files(&fs, &files);
}

#[test]
fn read_only_mount_reads_the_region_and_writes_nothing() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let mem = Arc::new(image());
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let fs = mount(&dev, Some(&region)).unwrap();
    let files = populate(&fs, "a", 3, 11);
    fs.sync().unwrap();
    let more = populate(&fs, "b", 2, 12);
    let img = mem.snapshot();
    let r_before = std::fs::read(&region).unwrap();
    drop(fs);
    // A crashed image (journal to replay), mounted read-only with its region.
    let ro_mem = Arc::new(MemDevice::from_bytes(img.clone()));
    let ro_dev: Arc<dyn BlockDevice> = ro_mem.clone();
    let copy: PathBuf = d.path().join("copy.nvm");
    std::fs::write(&copy, &r_before).unwrap();
    let fs = Fs::open(ro_dev, FsOptions { read_only: true, ..opts(Some(&copy)) }).unwrap();
    check_files(&fs, &files);
    check_files(&fs, &more);
    assert!(fs.nvm().is_none());
    drop(fs);
    assert_eq!(std::fs::read(&copy).unwrap(), r_before, "read-only mount changed the region");
    assert!(ro_mem.snapshot() == img, "read-only mount changed the image");
}

#[test]
fn fsck_checks_the_region_with_the_image_and_repairs_through_it() {
    use lanefs::{fsck, FsckOptions};
    let d = scratch();
    let region = d.path().join("r.nvm");
    let copy = d.path().join("copy.nvm");
    let mem = Arc::new(image());
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let with = |p: &Path, repair: bool| FsckOptions { repair, nvm: Some(p.to_path_buf()) };
    let fs = mount(&dev, Some(&region)).unwrap();
    let mut files = populate(&fs, "a", 4, 20);
    fs.sync().unwrap();
    files.extend(populate(&fs, "b", 3, 21));
    // A crash with transactions in the region's lane journals: the checkpoint is consistent,
    // and fsck says what the next mount will replay.
    let img = mem.snapshot();
    std::fs::copy(&region, &copy).unwrap();
    let crashed = MemDevice::from_bytes(img);
    let r = fsck(&crashed, &with(&copy, false)).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    assert!(
        r.notes.iter().any(|n| n.contains("region lane journals: ") && n.contains("transactions")),
        "{:?}",
        r.notes
    );
    // Without the region fsck cannot check it (operational error naming the option).
    let e = fsck(&crashed, &FsckOptions::default()).unwrap_err();
    assert!(e.to_string().contains("--nvm"), "{e}");
    // A corrupt journal is a problem, and stops a repair.
    let mut bad = std::fs::read(&copy).unwrap();
    let nat_end = {
        let g = read_superblock(&crashed).unwrap().sb.geometry;
        let r = lanefs::testing::pmem::PmemRegion::open(&copy, None, &Default::default()).unwrap();
        lanefs::testing::pmem::nat::NvmNat::new(r, &g).unwrap().layout().end
    };
    let g = read_superblock(&crashed).unwrap().sb.geometry;
    let layout = lanefs::testing::pmem::journal::JournalLayout::of(nat_end, bad.len(), g.lanes);
    let busy = (0..layout.lanes)
        .find(|&l| u32::from_le_bytes(bad[layout.tail(l)..layout.tail(l) + 4].try_into().unwrap()) > 0)
        .expect("a lane journal holds transactions");
    bad[layout.log(busy) + 8 + 30] ^= 0x40;
    std::fs::write(&copy, &bad).unwrap();
    let r = fsck(&crashed, &with(&copy, true)).unwrap();
    assert_eq!(r.exit_code(), 4);
    assert!(r
        .problems
        .iter()
        .any(|p| p.message.contains("lane") && p.message.contains(&copy.display().to_string())));
    drop(fs);

    // The cleanly unmounted image: clean with its region.
    let r = fsck(&*dev, &with(&region, false)).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    // Wrong counters in a new pack (its region side done as a checkpoint does it): found, and
    // repaired by a checkpoint that goes through the region too.
    {
        let g = read_superblock(&*dev).unwrap().sb.geometry;
        let cpr = read_checkpoint(&*dev, &g).unwrap();
        let mut cp = cpr.cp;
        cp.version += 1;
        cp.valid_blocks += 7;
        let uuid = read_superblock(&*dev).unwrap().sb.uuid;
        let r = lanefs::testing::pmem::PmemRegion::open(&region, Some(uuid), &Default::default()).unwrap();
        let nvm = lanefs::testing::pmem::nat::NvmNat::new(r, &g).unwrap();
        nvm.stage(cp.version, &[]).unwrap();
        let set = lanefs::testing::checkpoint::CommitSet { nat: vec![], sit: vec![], summaries: vec![] };
        lanefs::testing::checkpoint::commit(&*dev, &g, &mut cp, cpr.pack, &set).unwrap();
        nvm.apply(cp.version).unwrap();
    }
    let r = fsck(&*dev, &with(&region, false)).unwrap();
    assert_eq!(r.exit_code(), 4, "{:?}", r.problems);
    let r = fsck(&*dev, &with(&region, true)).unwrap();
    assert_eq!(r.exit_code(), 1, "{:?}", r.problems);
    let r = fsck(&*dev, &with(&region, false)).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    let fs = mount(&dev, Some(&region)).unwrap();
    check_files(&fs, &files);
}

/// Regression (found by `LANEFS_TEST_NVM=1` on tests/cli.rs): when the newest checkpoint pack
/// is unreadable, mount falls back to the other one; with a region whose NAT log of the lost
/// checkpoint was already written in place, the region's entries are no longer those of the
/// older checkpoint. Mount and fsck used them anyway (fsck then found SIT and tree at odds; a
/// mount would reuse blocks the NAT still names). Now both refuse with an error naming the
/// region; with an empty log (no NAT entry changed) the fallback still works.
#[test]
fn a_lost_newest_pack_is_not_paired_with_the_nat_of_the_region() {
    let d = scratch();
    let region = d.path().join("r.nvm");
    let mem = Arc::new(image());
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let corrupt_newest = |mem: &MemDevice| {
        let g = read_superblock(mem).unwrap().sb.geometry;
        let pack = lanefs::testing::checkpoint::read_checkpoint(mem, &g).unwrap().pack as u64;
        let at = g.cp_blkaddr as u64 + pack * g.cp_pack_blocks as u64 + 1;
        let mut b = vec![0u8; 4096];
        mem.read_block(at, &mut b).unwrap();
        b[77] ^= 0xFF;
        mem.write_block(at, &b).unwrap();
    };
    let version = |mem: &MemDevice| {
        let g = read_superblock(mem).unwrap().sb.geometry;
        read_checkpoint(mem, &g).unwrap().cp.version
    };

    // Two checkpoints with the same NAT (nothing changed in between): the fallback works.
    let fs = mount(&dev, Some(&region)).unwrap();
    let files = populate(&fs, "a", 3, 1);
    fs.sync().unwrap();
    fs.unmount().unwrap();
    let v = version(&mem);
    corrupt_newest(&mem);
    assert!(version(&mem) < v);
    let fs = mount(&dev, Some(&region)).unwrap();
    check_files(&fs, &files);
    fs.unmount().unwrap();

    // The newest checkpoint changed NAT entries and applied them in place: refused.
    let fs = mount(&dev, Some(&region)).unwrap();
    fs.sync().unwrap();
    populate(&fs, "b", 3, 2);
    fs.unmount().unwrap();
    corrupt_newest(&mem);
    match mount(&dev, Some(&region)) {
        Err(Error::Region { fault: RegionFault::Stale, path, reason }) => {
            assert_eq!(path, region);
            assert!(reason.contains("unreadable"), "{reason}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("mounted the older checkpoint with the NAT of the lost one"),
    }
    // fsck reports it as a problem of the region (exit 4), naming the file.
    let opts = lanefs::FsckOptions { nvm: Some(region.clone()), ..Default::default() };
    let r = lanefs::fsck(&*mem, &opts).unwrap();
    let named = |m: &str| m.contains("unreadable") && m.contains(&*region.to_string_lossy());
    assert!(r.problems.iter().any(|p| named(&p.message)), "{:#?}", r.problems);
}
