use super::*;
use std::fs::OpenOptions;
use std::sync::Arc;

const UUID: [u8; 16] = *b"0123456789abcdef";
const OTHER: [u8; 16] = *b"fedcba9876543210";
const SIZE: u64 = MIN_REGION_SIZE;

/// A scratch directory on tmpfs where there is one (the emulation the mode targets).
pub(super) fn scratch() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

fn create(path: &Path) -> PmemRegion {
    PmemRegion::create(path, SIZE, UUID, &RegionOptions::default()).unwrap()
}

pub(super) fn fault_of(e: &Error) -> RegionFault {
    match e {
        Error::Region { fault, .. } => *fault,
        e => panic!("not a region error: {e}"),
    }
}

/// Opening fails with `fault`, and the message names the file.
fn refused(path: &Path, uuid: Option<[u8; 16]>, fault: RegionFault) -> String {
    let e = PmemRegion::open(path, uuid, &RegionOptions::default()).unwrap_err();
    assert_eq!(fault_of(&e), fault, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    msg
}

#[test]
fn create_open_round_trip() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    let r = create(&p);
    assert_eq!(r.size() as u64, SIZE);
    assert_eq!(r.uuid(), UUID);
    assert_eq!(r.data_range(), HEADER_BYTES..SIZE as usize);
    assert!(!r.describe().is_empty());
    // Everything but the region itself is gone (the temporary name).
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    r.store_u64(HEADER_BYTES, 0x1122_3344_5566_7788).unwrap();
    r.write_bytes(HEADER_BYTES + 13, b"hello, region").unwrap();
    r.persist(HEADER_BYTES..HEADER_BYTES + 64).unwrap();
    drop(r);

    let r = PmemRegion::open(&p, Some(UUID), &RegionOptions::default()).unwrap();
    assert_eq!(r.load_u64(HEADER_BYTES).unwrap(), 0x1122_3344_5566_7788);
    let mut b = [0u8; 13];
    r.read_bytes(HEADER_BYTES + 13, &mut b).unwrap();
    assert_eq!(&b, b"hello, region");
    // Little-endian in the file.
    drop(r);
    let raw = std::fs::read(&p).unwrap();
    assert_eq!(raw[HEADER_BYTES..HEADER_BYTES + 8], 0x1122_3344_5566_7788u64.to_le_bytes());
    // The header is what RegionHeader encodes.
    let h = RegionHeader::decode(&raw[..HEADER_BYTES], &p).unwrap();
    assert_eq!((h.size, h.uuid), (SIZE, UUID));
    // Any UUID is accepted when none is expected.
    PmemRegion::open(&p, None, &RegionOptions::default()).unwrap();
}

#[test]
fn create_refuses_an_existing_file_and_open_or_create_creates_once() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    std::fs::write(&p, b"precious").unwrap();
    let e = PmemRegion::create(&p, SIZE, UUID, &RegionOptions::default()).unwrap_err();
    assert_eq!(fault_of(&e), RegionFault::Io, "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), b"precious");
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1, "temporary file left behind");

    let q = d.path().join("q.nvm");
    let (r, created) = PmemRegion::open_or_create(&q, SIZE, UUID, &RegionOptions::default()).unwrap();
    assert!(created);
    r.store_u64(HEADER_BYTES + 8, 42).unwrap();
    r.persist_all().unwrap();
    drop(r);
    let (r, created) = PmemRegion::open_or_create(&q, 2 * SIZE, UUID, &RegionOptions::default()).unwrap();
    assert!(!created);
    assert_eq!(r.size() as u64, SIZE, "an existing region keeps its size");
    assert_eq!(r.load_u64(HEADER_BYTES + 8).unwrap(), 42);
    drop(r);
    let e = PmemRegion::open_or_create(&q, SIZE, OTHER, &RegionOptions::default()).unwrap_err();
    assert_eq!(fault_of(&e), RegionFault::WrongImage);
}

#[test]
fn missing_wrong_image_and_in_use_are_refused() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    refused(&p, Some(UUID), RegionFault::Missing);
    let r = create(&p);
    let msg = refused(&p, Some(UUID), RegionFault::InUse);
    assert!(msg.contains("in use"), "{msg}");
    drop(r);
    let msg = refused(&p, Some(OTHER), RegionFault::WrongImage);
    assert!(msg.contains("30313233-3435-3637-3839-616263646566"), "{msg}");
    let e = PmemRegion::open(&p, Some(OTHER), &RegionOptions::default()).unwrap_err();
    assert_eq!(e.to_errno(), libc::EUCLEAN);
}

#[test]
fn corrupt_headers_are_refused() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    drop(create(&p));
    let good = std::fs::read(&p).unwrap();
    let write = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        std::fs::write(&p, &b).unwrap();
    };
    // Every single bit flip anywhere in the header is caught.
    for bit in (0..HEADER_BYTES * 8).step_by(97) {
        write(&|b| b[bit / 8] ^= 1 << (bit % 8));
        let e = PmemRegion::open(&p, Some(UUID), &RegionOptions::default()).unwrap_err();
        assert!(matches!(fault_of(&e), RegionFault::Corrupt | RegionFault::NotRegion), "bit {bit}: {e}");
    }
    write(&|b| b[..4].copy_from_slice(b"LNFS"));
    refused(&p, Some(UUID), RegionFault::NotRegion);
    // A zero-filled file (never formatted) is not a region.
    write(&|b| b.fill(0));
    refused(&p, Some(UUID), RegionFault::NotRegion);
    // A well-sealed header with an absurd size is refused before anything is mapped.
    for size in [0u64, 4096, u64::MAX, SIZE + 1] {
        let h = RegionHeader { size, uuid: UUID, created: 0 }.encode();
        write(&|b| b[..HEADER_BYTES].copy_from_slice(&h));
        let e = PmemRegion::open(&p, Some(UUID), &RegionOptions::default()).unwrap_err();
        assert!(matches!(fault_of(&e), RegionFault::Corrupt | RegionFault::TooSmall), "size {size}: {e}");
    }
    write(&|_| {});
    PmemRegion::open(&p, Some(UUID), &RegionOptions::default()).unwrap();
}

#[test]
fn truncated_and_overlong_files_are_refused() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    drop(create(&p));
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(SIZE - 4096).unwrap();
    let msg = refused(&p, Some(UUID), RegionFault::Truncated);
    assert!(msg.contains("header says"), "{msg}");
    f.set_len(100).unwrap();
    refused(&p, Some(UUID), RegionFault::Truncated);
    f.set_len(0).unwrap();
    refused(&p, Some(UUID), RegionFault::Truncated);
    drop(create(&d.path().join("s.nvm")));
    let f = OpenOptions::new().write(true).open(d.path().join("s.nvm")).unwrap();
    f.set_len(SIZE + 4096).unwrap();
    refused(&d.path().join("s.nvm"), Some(UUID), RegionFault::Corrupt);
}

#[test]
fn too_small_sizes_are_refused() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    for size in [0, 4096, MIN_REGION_SIZE - 4096] {
        let e = PmemRegion::create(&p, size, UUID, &RegionOptions::default()).unwrap_err();
        assert_eq!(fault_of(&e), RegionFault::TooSmall, "{e}");
        assert!(!p.exists());
    }
    let e = PmemRegion::create(&p, MIN_REGION_SIZE + 1, UUID, &RegionOptions::default()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let r = create(&p);
    r.require(SIZE - HEADER_BYTES as u64, "everything").unwrap();
    let e = r.require(SIZE, "the NAT").unwrap_err();
    assert_eq!(fault_of(&e), RegionFault::TooSmall);
    let msg = e.to_string();
    assert!(msg.contains("the NAT") && msg.contains("--nvm-size 2M"), "{msg}");
}

#[test]
fn accesses_are_bounds_checked() {
    let d = scratch();
    let r = create(&d.path().join("r.nvm"));
    let end = SIZE as usize;
    assert!(r.store_u64(HEADER_BYTES + 4, 1).is_err(), "unaligned");
    assert!(r.store_u64(0, 1).is_err(), "header");
    assert!(r.store_u64(HEADER_BYTES - 8, 1).is_err(), "header");
    assert!(r.store_u64(end, 1).is_err(), "past the end");
    assert!(r.load_u64(end - 4).is_err());
    r.store_u64(end - 8, 7).unwrap();
    assert!(r.write_bytes(end - 3, b"abcd").is_err());
    assert!(r.write_bytes(usize::MAX - 1, b"ab").is_err(), "overflow");
    assert!(r.read_bytes(HEADER_BYTES - 1, &mut [0u8; 2]).is_err());
    assert!(r.persist(0..64).is_err());
    assert!(r.persist(end..end + 1).is_err());
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = HEADER_BYTES + 64..HEADER_BYTES;
    assert!(r.persist(reversed).is_err());
    r.persist(end - 1..end).unwrap();
    r.persist(HEADER_BYTES..HEADER_BYTES).unwrap();
}

#[test]
fn unaligned_byte_writes_keep_their_neighbours() {
    let d = scratch();
    let r = create(&d.path().join("r.nvm"));
    let base = HEADER_BYTES + 64;
    r.write_bytes(base, &[0xAA; 48]).unwrap();
    for (off, len) in [(3usize, 1usize), (5, 11), (16, 8), (7, 25), (40, 3)] {
        let data: Vec<u8> = (0..len).map(|i| (off + i) as u8).collect();
        let mut before = [0u8; 48];
        r.read_bytes(base, &mut before).unwrap();
        r.write_bytes(base + off, &data).unwrap();
        let mut after = [0u8; 48];
        r.read_bytes(base, &mut after).unwrap();
        let mut want = before;
        want[off..off + len].copy_from_slice(&data);
        assert_eq!(after, want, "write at {off}+{len}");
        let mut back = vec![0u8; len];
        r.read_bytes(base + off, &mut back).unwrap();
        assert_eq!(back, data);
    }
}

#[test]
fn every_available_method_persists() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    drop(create(&p));
    let methods = PersistMethod::all_available();
    assert!(methods.contains(&PersistMethod::Msync));
    #[cfg(target_arch = "x86_64")]
    if std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" clwb")) {
        assert!(methods.contains(&PersistMethod::Clwb), "CPUID disagrees with /proc/cpuinfo");
        assert_eq!(PersistMethod::best_cache_flush(), Some(PersistMethod::Clwb));
    }
    for (i, &m) in methods.iter().enumerate() {
        let opts = RegionOptions { persist: Some(m), ..Default::default() };
        let r = PmemRegion::open(&p, Some(UUID), &opts).unwrap();
        assert_eq!(r.persist_method(), m);
        assert!(r.describe().contains(&m.to_string()), "{}", r.describe());
        let off = HEADER_BYTES + 4096 * (i + 1) + 8;
        r.store_u64(off, 0xC0FFEE + i as u64).unwrap();
        r.write_bytes(off + 60, &[i as u8 + 1; 300]).unwrap();
        r.persist(off..off + 360).unwrap();
        drop(r);
        let r = PmemRegion::open(&p, Some(UUID), &RegionOptions::default()).unwrap();
        assert_eq!(r.load_u64(off).unwrap(), 0xC0FFEE + i as u64, "{m}");
        let mut b = [0u8; 300];
        r.read_bytes(off + 60, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == i as u8 + 1), "{m}");
    }
}

#[test]
fn default_method_and_mapping_on_this_machine() {
    let d = scratch();
    let r = create(&d.path().join("r.nvm"));
    let tmpfs = r.describe().contains(" on tmpfs");
    // No DAX here: MAP_SYNC is refused on tmpfs and on page-cache file systems.
    if tmpfs {
        assert_eq!(r.mapping(), Mapping::Shared);
        assert!(r.describe().contains("MAP_SYNC refused"), "{}", r.describe());
        assert!(r.describe().contains("not durable across power loss"), "{}", r.describe());
        let want = PersistMethod::best_cache_flush().unwrap_or(PersistMethod::Msync);
        assert_eq!(r.persist_method(), want);
    }
    if r.mapping() == Mapping::Shared && !tmpfs {
        assert_eq!(r.persist_method(), PersistMethod::Msync, "page cache needs msync");
    }
    drop(r);
    let r = PmemRegion::open(
        &d.path().join("r.nvm"),
        Some(UUID),
        &RegionOptions { try_map_sync: false, ..Default::default() },
    )
    .unwrap();
    assert_eq!(r.mapping(), Mapping::Shared);
    assert!(!r.describe().contains("refused"));
}

#[test]
fn threads_store_disjoint_words_then_reopen_sees_them() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    let r = Arc::new(create(&p));
    const THREADS: usize = 4;
    const WORDS: usize = 2000;
    // Interleaved: neighbouring words (same cache line) belong to different threads.
    let slot = |t: usize, i: usize| HEADER_BYTES + 8 * (i * THREADS + t);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                for i in 0..WORDS {
                    r.store_u64(slot(t, i), ((t as u64) << 32) | i as u64).unwrap();
                }
                // Each thread persists its own words' lines (lines shared with others too).
                r.persist(slot(t, 0)..slot(t, WORDS - 1) + 8).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    drop(Arc::try_unwrap(r).unwrap());
    let r = PmemRegion::open(&p, Some(UUID), &RegionOptions::default()).unwrap();
    for t in 0..THREADS {
        for i in 0..WORDS {
            assert_eq!(r.load_u64(slot(t, i)).unwrap(), ((t as u64) << 32) | i as u64);
        }
    }
}

#[test]
fn crash_model_tracks_unpersisted_words() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    drop(create(&p));
    let opts = RegionOptions { record: true, ..Default::default() };
    let r = PmemRegion::open(&p, Some(UUID), &opts).unwrap();
    let (a, b, c) = (HEADER_BYTES, HEADER_BYTES + 8, HEADER_BYTES + 128);
    r.store_u64(a, 1).unwrap();
    r.persist(a..a + 8).unwrap();
    r.store_u64(b, 2).unwrap();
    r.store_u64(c, 3).unwrap();
    r.store_u64(c, 3).unwrap(); // a repeat is one value
    r.store_u64(c, 4).unwrap();
    let cm = r.crash_model().unwrap();
    assert_eq!(
        cm.pending(),
        &[PendingWord { offset: b, values: vec![2] }, PendingWord { offset: c, values: vec![3, 4] }]
    );
    let word = |img: &[u8], o: usize| u64::from_le_bytes(img[o..o + 8].try_into().unwrap());
    // Every subset of the pending words gives its own image; the persisted word is in all.
    let mut seen = std::collections::BTreeSet::new();
    for mask in 0..4usize {
        let landed: Vec<usize> = (0..2).filter(|i| mask & (1 << i) != 0).collect();
        let img = cm.image_with_subset(&landed);
        assert_eq!(word(&img, a), 1);
        assert_eq!(word(&img, b), if mask & 1 != 0 { 2 } else { 0 });
        assert_eq!(word(&img, c), if mask & 2 != 0 { 4 } else { 0 });
        seen.insert(img);
    }
    assert_eq!(seen.len(), 4);
    // An intermediate value may be what landed.
    let img = cm.image_with(|i, _| (i == 1).then_some(0));
    assert_eq!((word(&img, b), word(&img, c)), (0, 3));
    // Everything landed = the region's current content.
    let mut now = vec![0u8; SIZE as usize];
    now[..HEADER_BYTES].copy_from_slice(&std::fs::read(&p).unwrap()[..HEADER_BYTES]);
    r.read_bytes(HEADER_BYTES, &mut now[HEADER_BYTES..]).unwrap();
    assert_eq!(cm.everything(), now);

    // Persisting a line settles exactly the words in it (b shares a's line; c does not).
    r.persist(b..b + 1).unwrap();
    let cm = r.crash_model().unwrap();
    assert_eq!(cm.pending(), &[PendingWord { offset: c, values: vec![3, 4] }]);
    assert_eq!(word(cm.persisted(), b), 2);

    // A partial-word write records the whole word it changed (torn at 8-byte granularity).
    r.write_bytes(c + 5, &[0xFF; 6]).unwrap();
    let cm = r.crash_model().unwrap();
    let pend: Vec<usize> = cm.pending().iter().map(|w| w.offset).collect();
    assert_eq!(pend, vec![c, c + 8]);
    assert_eq!(*cm.pending()[0].values.last().unwrap(), 4 | 0xFFFF_FF00_0000_0000);

    // Any earlier point can be crashed at: before the first persist, a is pending too.
    let early = r.crash_model_at(1).unwrap();
    assert_eq!(early.pending(), &[PendingWord { offset: a, values: vec![1] }]);
    assert_eq!(r.crash_model_at(0).unwrap().pending(), &[]);
    assert_eq!(r.crash_model_at(r.recorded_events()).unwrap(), cm);

    // A crash image is a region file like any other: what was persisted is all it holds.
    let img = cm.image_with_subset(&[]);
    drop(r);
    std::fs::write(&p, &img).unwrap();
    let r = PmemRegion::open(&p, Some(UUID), &RegionOptions::default()).unwrap();
    assert_eq!((r.load_u64(a).unwrap(), r.load_u64(b).unwrap(), r.load_u64(c).unwrap()), (1, 2, 0));
}

#[test]
fn crash_model_with_threads_keeps_each_words_order() {
    let d = scratch();
    let p = d.path().join("r.nvm");
    drop(create(&p));
    let r = Arc::new(
        PmemRegion::open(&p, Some(UUID), &RegionOptions { record: true, ..Default::default() }).unwrap(),
    );
    let hs: Vec<_> = (0..2)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                for v in 1..=50u64 {
                    r.store_u64(HEADER_BYTES + 8 * t, v).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let cm = r.crash_model().unwrap();
    for w in cm.pending() {
        assert_eq!(w.values, (1..=50).collect::<Vec<u64>>());
    }
}

#[test]
fn persist_bench_measures_every_method() {
    let d = scratch();
    let p = d.path().join("bench.nvm");
    let rs = bench::persist_bench(&p, 256, 200, &[]).unwrap();
    assert_eq!(rs.len(), PersistMethod::all_available().len());
    for r in &rs {
        assert!(r.mean_ns > 0.0 && r.p50_ns <= r.p99_ns, "{r}");
        assert!(!r.to_string().is_empty());
    }
    assert!(bench::persist_bench(&p, 0, 10, &[]).is_err());
}
