//! mkfs, fsck and checkpoint selection on real images: fresh images of many sizes, images with
//! a tree written through the segment allocator, and images broken on purpose.

mod common;

use common::Builder;
use lanefs::device::{BlockDevice, DeviceOptions, FileDevice, IoChoice, MemDevice, BLOCK_SIZE};
use lanefs::format::layout::{Geometry, ROOT_INO};
use lanefs::format::SitBlock;
use lanefs::testing::checkpoint;
use lanefs::Error;
use lanefs::{detect_existing, format_device, MkfsOptions};
use lanefs::{fsck as check, FsckOptions, FsckReport};

fn mkfs(dev: &dyn BlockDevice, lanes: u32) {
    format_device(dev, &MkfsOptions { lanes, ..Default::default() }).unwrap();
}

fn fsck(dev: &dyn BlockDevice) -> FsckReport {
    check(dev, &FsckOptions::default()).unwrap()
}

fn assert_clean(r: &FsckReport) {
    assert!(r.is_clean(), "fsck found: {:#?}", r.problems);
    assert_eq!(r.exit_code(), 0);
}

fn problems(r: &FsckReport) -> String {
    r.problems.iter().map(|p| format!("{}: {}\n", p.structure, p.message)).collect()
}

#[test]
fn fresh_images_are_clean_from_minimum_to_64_gib() {
    let dir = tempfile::tempdir().unwrap();
    let sizes: Vec<(u64, u32)> = vec![
        (Geometry::min_size_bytes(1), 1),
        (Geometry::min_size_bytes(2), 2),
        (Geometry::min_size_bytes(8), 8),
        (100 << 20, 2),
        (1 << 30, 2),
        (8 << 30, 4),
        (64 << 30, 2),
    ];
    for (size, lanes) in sizes {
        let path = dir.path().join(format!("img-{size}-{lanes}"));
        lanefs::device::create_image(&path, size).unwrap();
        let dev = FileDevice::open(&path, DeviceOptions { io: IoChoice::Sync }).unwrap();
        mkfs(&dev, lanes);
        let r = fsck(&dev);
        assert_clean(&r);
        assert_eq!(r.stats.inodes, 1);
        assert_eq!(r.stats.directories, 1);
        // Sparse: formatting wrote a few blocks, not the image.
        let used =
            std::fs::metadata(&path).map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512).unwrap();
        assert!(used < 16 << 20, "{size}: mkfs wrote {used} bytes");
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn below_minimum_size_is_refused_with_the_minimum_named() {
    let min = Geometry::min_size_bytes(2);
    let dev = MemDevice::new(min - (2 << 20));
    let e = format_device(&dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("minimum"), "{e}");
}

#[test]
fn existing_file_systems_are_detected() {
    let dev = MemDevice::new(64 << 20);
    assert_eq!(detect_existing(&dev).unwrap(), None);
    mkfs(&dev, 1);
    assert_eq!(detect_existing(&dev).unwrap(), Some("lanefs"));
    let mut b = vec![0u8; BLOCK_SIZE];
    b[1080] = 0x53;
    b[1081] = 0xEF;
    let dev = MemDevice::new(64 << 20);
    dev.write_block(0, &b).unwrap();
    assert_eq!(detect_existing(&dev).unwrap(), Some("ext2/ext3/ext4"));
}

#[test]
fn a_tree_with_files_dirs_and_links_is_clean_and_survives_reformat() {
    let dev = MemDevice::new(256 << 20);
    mkfs(&dev, 2);
    let mut b = Builder::open(&dev);
    let d1 = b.mkdir(ROOT_INO, "a");
    let d2 = b.mkdir(d1, "b");
    let f = b.create(d2, "file", &vec![7u8; 3 * BLOCK_SIZE + 5]);
    b.link(f, ROOT_INO, "hardlink");
    for i in 0..300 {
        b.create(d1, &format!("small-{i:04}"), format!("content {i}").as_bytes());
    }
    b.commit();
    let r = fsck(&dev);
    assert_clean(&r);
    assert_eq!(r.stats.inodes, 304);
    assert_eq!(r.stats.directories, 3);
    // 4 file blocks, 300 small files, and 4 dentry blocks (root 1, a 2, b 1).
    assert_eq!(r.stats.data_blocks, 4 + 300 + 4);
    // Reformatting leaves only the root, whatever the old image held.
    mkfs(&dev, 2);
    let r = fsck(&dev);
    assert_clean(&r);
    assert_eq!(r.stats.inodes, 1);
}

#[test]
fn wrong_link_count_is_found() {
    let dev = MemDevice::new(64 << 20);
    mkfs(&dev, 1);
    let mut b = Builder::open(&dev);
    let f = b.create(ROOT_INO, "f", b"x");
    b.inodes.get_mut(&f).unwrap().nlink = 3;
    b.commit();
    let r = fsck(&dev);
    assert_eq!(r.exit_code(), 4);
    assert!(problems(&r).contains("link count 3, the tree gives 1"), "{}", problems(&r));
}

#[test]
fn entry_to_missing_inode_and_unreachable_inode_are_found() {
    let dev = MemDevice::new(64 << 20);
    mkfs(&dev, 1);
    let mut b = Builder::open(&dev);
    let f = b.create(ROOT_INO, "f", b"x");
    let g = b.create(ROOT_INO, "g", b"y");
    // Point "f"'s entry at a nonexistent inode and drop "g"'s entry.
    let root = b.dirs.get_mut(&ROOT_INO).unwrap();
    root.iter_mut().find(|d| d.ino == f).unwrap().ino = 999;
    root.retain(|d| d.ino != g);
    b.commit();
    let p = problems(&fsck(&dev));
    assert!(p.contains("points to inode 999, which does not exist"), "{p}");
    assert!(p.contains(&format!("inode {g} is not reachable")), "{p}");
}

#[test]
fn block_owned_twice_is_found() {
    let dev = MemDevice::new(64 << 20);
    mkfs(&dev, 1);
    let mut b = Builder::open(&dev);
    let f = b.create(ROOT_INO, "f", b"x");
    let g = b.create(ROOT_INO, "g", b"y");
    let shared = b.inodes[&f].addrs[0];
    b.inodes.get_mut(&g).unwrap().addrs[0] = shared;
    b.commit();
    let p = problems(&fsck(&dev));
    assert!(p.contains(&format!("block {shared} is owned twice")), "{p}");
}

#[test]
fn directory_with_two_names_is_found() {
    let dev = MemDevice::new(64 << 20);
    mkfs(&dev, 1);
    let mut b = Builder::open(&dev);
    let d = b.mkdir(ROOT_INO, "d");
    let e = b.mkdir(ROOT_INO, "e");
    b.add_entry(e, "loop", d);
    b.commit();
    let p = problems(&fsck(&dev));
    assert!(p.contains(&format!("directory {d} has more than one name")), "{p}");
}

#[test]
fn sit_and_counter_damage_is_repaired() {
    let dev = MemDevice::new(64 << 20);
    mkfs(&dev, 1);
    let mut b = Builder::open(&dev);
    b.create(ROOT_INO, "f", &vec![1u8; 10 * BLOCK_SIZE]);
    b.commit();
    assert_clean(&fsck(&dev));
    // Rewrite SIT block 0 with one segment's count and bitmap wiped, as a new checkpoint.
    let g = checkpoint::read_superblock(&dev).unwrap().sb.geometry;
    let cpr = checkpoint::read_checkpoint(&dev, &g).unwrap();
    let mut cp = cpr.cp;
    let sit = checkpoint::read_sit(&dev, &g, &cp).unwrap();
    let victim = sit.iter().position(|e| e.valid_blocks >= 10).unwrap();
    let mut blk = SitBlock::empty(0);
    for (i, e) in blk.entries.iter_mut().enumerate() {
        if i < sit.len() {
            *e = sit[i].clone();
        }
    }
    blk.entries[victim].bitmap = [0; 64];
    blk.entries[victim].valid_blocks = 0;
    cp.version += 1;
    cp.valid_blocks += 7;
    let set = checkpoint::CommitSet { nat: vec![], sit: vec![blk], summaries: vec![] };
    checkpoint::commit(&dev, &g, &mut cp, cpr.pack, &set).unwrap();
    let r = fsck(&dev);
    assert_eq!(r.exit_code(), 4);
    let p = problems(&r);
    assert!(p.contains(&format!("segment {victim}: SIT says 0 valid blocks")), "{p}");
    assert!(p.contains("counters"), "{p}");
    let r = check(&dev, &FsckOptions { repair: true, ..Default::default() }).unwrap();
    assert_eq!(r.exit_code(), 1, "{}", problems(&r));
    assert_clean(&fsck(&dev));
}

#[test]
fn a_generation_counter_behind_an_inode_is_repaired() {
    let dev = std::sync::Arc::new(MemDevice::new(64 << 20));
    mkfs(&*dev, 1);
    let fs = lanefs::Fs::open(dev.clone(), lanefs::FsOptions::default()).unwrap();
    let mut newest = 0u64;
    for i in 0..10 {
        let a = fs.create(lanefs::ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        newest = newest.max(a.generation as u64);
    }
    fs.unmount().unwrap();
    assert_clean(&fsck(&*dev));
    let g = checkpoint::read_superblock(&*dev).unwrap().sb.geometry;
    let cpr = checkpoint::read_checkpoint(&*dev, &g).unwrap();
    let mut cp = cpr.cp;
    assert!(cp.next_generation > newest, "{} not past {newest}", cp.next_generation);
    // A counter that would hand out a generation an inode has (so a reused inode number could
    // look like the file a handle names).
    cp.next_generation = newest;
    cp.version += 1;
    let set = checkpoint::CommitSet { nat: vec![], sit: vec![], summaries: vec![] };
    checkpoint::commit(&*dev, &g, &mut cp, cpr.pack, &set).unwrap();
    let r = fsck(&*dev);
    assert_eq!(r.exit_code(), 4);
    assert!(problems(&r).contains(&format!("generation counter {newest} is not past")), "{}", problems(&r));
    let r = check(&*dev, &FsckOptions { repair: true, ..Default::default() }).unwrap();
    assert_eq!(r.exit_code(), 1, "{}", problems(&r));
    assert_clean(&fsck(&*dev));
    let cp = checkpoint::read_checkpoint(&*dev, &g).unwrap().cp;
    assert_eq!(cp.next_generation, newest + 1);
}

/// Flipping a byte in a block of the image.
fn flip(dev: &MemDevice, addr: u64, off: usize) {
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_block(addr, &mut b).unwrap();
    b[off] ^= 0x5A;
    dev.write_block(addr, &b).unwrap();
}

#[test]
fn corrupt_active_checkpoint_falls_back_and_both_corrupt_is_exit_4() {
    let dev = MemDevice::new(64 << 20);
    mkfs(&dev, 2);
    let g = checkpoint::read_superblock(&dev).unwrap().sb.geometry;
    let first = checkpoint::read_checkpoint(&dev, &g).unwrap();
    // mkfs leaves both packs valid, so one bad pack always has a fallback.
    let older = *first.other.as_ref().expect("both packs valid after mkfs");
    flip(&dev, g.cp_pack_addr(first.pack) + 1, 100);
    let second = checkpoint::read_checkpoint(&dev, &g).unwrap();
    assert_eq!(second.pack, 1 - first.pack);
    assert_eq!(second.cp.version, older);
    let r = fsck(&dev);
    assert_clean(&r);
    assert!(r.notes.iter().any(|n| n.contains("not usable")), "{:?}", r.notes);
    flip(&dev, g.cp_pack_addr(second.pack), 40);
    let r = fsck(&dev);
    assert_eq!(r.exit_code(), 4);
    let p = problems(&r);
    assert!(p.contains("checkpoint pack") && p.contains("no valid checkpoint pack"), "{p}");
}

#[test]
fn bad_superblock_copy_is_repaired_and_both_bad_is_reported() {
    let dev = MemDevice::new(64 << 20);
    mkfs(&dev, 1);
    flip(&dev, 0, 200);
    let r = fsck(&dev);
    assert_eq!(r.exit_code(), 4);
    assert!(problems(&r).contains("copy A"));
    let r = check(&dev, &FsckOptions { repair: true, ..Default::default() }).unwrap();
    assert_eq!(r.exit_code(), 1);
    assert_clean(&fsck(&dev));
    flip(&dev, 0, 300);
    flip(&dev, 1, 300);
    let r = fsck(&dev);
    assert_eq!(r.exit_code(), 4);
    assert!(problems(&r).contains("both copies are bad"), "{}", problems(&r));
}

#[test]
fn non_lanefs_and_truncated_images_are_errors() {
    let dev = MemDevice::new(64 << 20);
    assert!(matches!(check(&dev, &FsckOptions::default()), Err(Error::NotLanefs(_))));
    mkfs(&dev, 1);
    let mut bytes = dev.snapshot();
    bytes.truncate(32 << 20);
    let small = MemDevice::from_bytes(bytes);
    let r = check(&small, &FsckOptions::default()).unwrap();
    assert!(problems(&r).contains("truncated"), "{}", problems(&r));
}

/// Random single-byte corruption anywhere in the metadata never panics or hangs fsck; any flip
/// inside a checksummed block is either found or harmless (the other copy / pack is used).
#[test]
fn corruption_sweep_never_panics() {
    let dev = MemDevice::new(64 << 20);
    mkfs(&dev, 2);
    let mut b = Builder::open(&dev);
    let d = b.mkdir(ROOT_INO, "d");
    for i in 0..40 {
        b.create(d, &format!("f{i}"), &vec![i as u8; 2 * BLOCK_SIZE]);
    }
    b.commit();
    let g = checkpoint::read_superblock(&dev).unwrap().sb.geometry;
    let image = dev.snapshot();
    let meta_end = g.main_blkaddr;
    let used_main = (g.main_blkaddr..g.main_blkaddr + g.main_blocks())
        .filter(|&a| image[a as usize * BLOCK_SIZE..(a as usize + 1) * BLOCK_SIZE].iter().any(|&x| x != 0))
        .collect::<Vec<_>>();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut found = 0;
    for i in 0..400 {
        let addr = if i % 2 == 0 {
            next() % meta_end
        } else {
            used_main[(next() % used_main.len() as u64) as usize]
        };
        let off = (next() % BLOCK_SIZE as u64) as usize;
        let mut bytes = image.clone();
        bytes[addr as usize * BLOCK_SIZE + off] ^= 1 << (next() % 8);
        let bad = MemDevice::from_bytes(bytes);
        match check(&bad, &FsckOptions::default()) {
            Ok(r) if !r.is_clean() => found += 1,
            Ok(_) | Err(_) => {}
        }
    }
    assert!(found > 50, "only {found} of 400 corruptions were reported");
}
