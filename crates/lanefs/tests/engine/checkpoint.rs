//! Checkpoints as the engine takes them: dirty files written back before the exclusive phase,
//! checkpoints asked for by deletions, the pauses measured and bounded, and names found again
//! across renames, remounts and replay.

use super::*;

/// A checkpoint writes a file's many dirty pages back before it takes the gate (batches an
/// fsync can interleave with), and writes only the few left itself; the data is whole after
/// a remount and fsck finds the image consistent.
#[test]
fn checkpoint_writes_large_dirty_files_back_before_its_exclusive_phase() {
    let img = fresh(256 << 20, 2);
    let fs = mount(&img, FsOptions { checkpoint_interval: None, ..Default::default() });
    let big = fs.create(ROOT, b"big", 0o644, 0, 0).unwrap().ino;
    let small = fs.create(ROOT, b"small", 0o644, 0, 0).unwrap().ino;
    let content = |seed: u64, len: usize| -> Vec<u8> {
        let mut rng = Rng::new(seed);
        (0..len).map(|_| rng.below(256) as u8).collect()
    };
    let big_data = content(1, 300 * 4096);
    let small_data = content(2, 3 * 4096);
    fs.write_at(big, 0, &big_data).unwrap();
    fs.write_at(small, 0, &small_data).unwrap();
    let before = fs.io_stats();
    fs.sync().unwrap();
    let after = fs.io_stats();
    let early = after.writeback_bytes - before.writeback_bytes;
    // 300 pages owed: batches of 64 while at least 64 are owed (four), the last 44 and the
    // small file's 3 to the checkpoint itself.
    assert_eq!(early, 256 * 4096, "early writeback");
    assert!(after.checkpoint_bytes - before.checkpoint_bytes >= 47 * 4096);
    fs.unmount().unwrap();
    fsck_clean(&img);
    let fs = mount(&img, FsOptions::default());
    for (ino, want) in [(big, &big_data), (small, &small_data)] {
        let mut buf = vec![0u8; want.len()];
        assert_eq!(fs.read_at(ino, 0, &mut buf).unwrap(), want.len());
        assert!(buf == *want, "inode {ino} differs after remount");
    }
    fs.unmount().unwrap();
    fsck_clean(&img);
}

/// Deleted inodes keep their memory until the checkpoint that deletes them, so deleting many
/// files asks for one even when nothing else would (no interval, journals far from full).
#[test]
fn many_deletions_ask_for_a_checkpoint() {
    let img = fresh(256 << 20, 2);
    let fs = mount(&img, FsOptions { checkpoint_interval: None, ..Default::default() });
    let base = fs.io_stats().checkpoints_durable;
    for i in 0..5000u32 {
        let name = format!("f{i}");
        let f = fs.create(ROOT, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write_at(f, 0, b"x").unwrap();
        fs.unlink(ROOT, name.as_bytes()).unwrap();
    }
    // The background thread takes it; bounded wait.
    let mut waited = 0;
    while fs.io_stats().checkpoints_durable == base {
        assert!(waited < 500, "no checkpoint after 5000 deletions");
        std::thread::sleep(std::time::Duration::from_millis(10));
        waited += 1;
    }
    fs.unmount().unwrap();
    fsck_clean(&img);
}

/// The pauses checkpoints impose are measured: the write phase (fsync and writeback held out)
/// spans the exclusive phase (every operation held out), and the peak a benchmark takes starts
/// afresh after each read while the since-mount figure stays.
#[test]
fn checkpoint_pauses_are_measured() {
    let img = fresh(64 << 20, 2);
    let fs = mount(&img, FsOptions { checkpoint_interval: None, ..Default::default() });
    let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
    fs.write_at(a.ino, 0, &vec![7u8; 1 << 20]).unwrap();
    fs.sync().unwrap();
    let s = fs.io_stats();
    assert!(s.cp_write_phase_us_max > 0, "a checkpoint that wrote 1 MiB took time: {s:?}");
    assert!(s.cp_exclusive_us_max <= s.cp_write_phase_us_max, "{s:?}");
    let peak = fs.take_cp_exclusive_peak_us();
    assert_eq!(peak, s.cp_exclusive_us_max, "the first peak covers the mount");
    assert_eq!(fs.take_cp_exclusive_peak_us(), 0, "no checkpoint since the last read");
    assert_eq!(fs.io_stats().cp_exclusive_us_max, s.cp_exclusive_us_max, "the since-mount figure stays");
    fs.unmount().unwrap();
}

/// The checkpoint's exclusive phase (every operation waits) does no work per dead inode, per
/// directory record or per touched name: dead inodes, directory logs and touched-name sets are
/// handed over in whole lists and shards. A mail spool that creates and deletes 10,000 files
/// (and so logs 20,000 records in one directory) costs each phase what 10 files cost: a few
/// inodes looked at and a bounded number of swaps. The kept files and the emptied names come
/// out right after a remount.
#[test]
fn the_exclusive_phase_is_bounded_by_live_inodes_not_dead_ones_or_log_length() {
    let cpus = lanefs::sync::possible_cpus() as u64;
    for n in [10u32, 10_000] {
        let img = fresh(256 << 20, 2);
        let fs = mount(&img, FsOptions { checkpoint_interval: None, ..Default::default() });
        let spool = fs.mkdir(ROOT, b"spool", 0o755, 0, 0).unwrap().ino;
        fs.sync().unwrap();
        let before = fs.cp_exclusive_work();
        for i in 0..n {
            let name = format!("m{i}");
            let f = fs.create(spool, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write_at(f, 0, name.as_bytes()).unwrap();
            // Every 1000th message stays.
            if i % 1000 != 999 {
                fs.unlink(spool, name.as_bytes()).unwrap();
            }
        }
        fs.sync().unwrap();
        let after = fs.cp_exclusive_work();
        let phases = after.phases - before.phases;
        let inodes = after.inodes - before.inodes;
        let swaps = after.swaps - before.swaps;
        assert!(phases >= 1, "n={n}: the sync took a checkpoint");
        // Deletions may kick background checkpoints on the way; each one finds at most the
        // spool, its parent and the one message being written live, and so does the sync's.
        // The phase looks at no inode: each dirty one is captured after it, by whoever touches
        // it first.
        assert_eq!(inodes, 0, "n={n}: {inodes} inodes looked at in {phases} phases");
        // Per phase: the dirty sets and dead lists, one per CPU each.
        assert_eq!(swaps, phases * 2 * cpus, "n={n}: {swaps} swaps in {phases} phases");
        fs.unmount().unwrap();
        fsck_clean(&img);
        let fs = mount(&img, FsOptions { checkpoint_interval: None, ..Default::default() });
        let mut names: Vec<Vec<u8>> =
            fs.readdir(spool, 2, 1 << 20).unwrap().into_iter().map(|e| e.name).collect();
        let mut want: Vec<Vec<u8>> =
            (0..n).filter(|i| i % 1000 == 999).map(|i| format!("m{i}").into_bytes()).collect();
        names.sort();
        want.sort();
        assert_eq!(names, want, "n={n}: the spool holds the kept messages only");
        for w in &want {
            let ino = fs.lookup(spool, w).unwrap().ino;
            let mut buf = vec![0u8; 64];
            let got = fs.read_at(ino, 0, &mut buf).unwrap();
            assert_eq!(&buf[..got], &w[..], "n={n}: contents of {}", String::from_utf8_lossy(w));
        }
        fs.unmount().unwrap();
    }
}

/// The exclusive phase does the same with 10 live dirty files as with 10,000: it swaps the
/// dirty sets and moves the epoch, and the files are captured after it (by the checkpoint's
/// writer here). Every file is whole after a remount.
#[test]
fn the_exclusive_phase_is_the_same_for_10_or_10000_live_dirty_inodes() {
    let cpus = lanefs::sync::possible_cpus() as u64;
    for n in [10u32, 10_000] {
        let img = fresh(256 << 20, 2);
        let opts = || FsOptions { checkpoint_interval: None, ..Default::default() };
        let fs = mount(&img, opts());
        let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
        let files: Vec<u64> = (0..n)
            .map(|i| {
                let f = fs.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                fs.write_at(f, 0, format!("data {i}").as_bytes()).unwrap();
                f
            })
            .collect();
        let before = fs.cp_exclusive_work();
        fs.sync().unwrap();
        let after = fs.cp_exclusive_work();
        // The sync's checkpoint, and any the creates asked for that ran meanwhile.
        let phases = after.phases - before.phases;
        assert!(phases >= 1, "n={n}: the sync took a checkpoint");
        assert_eq!(after.inodes - before.inodes, 0, "n={n}: the phase looked at no inode");
        assert_eq!(after.swaps - before.swaps, phases * 2 * cpus, "n={n}: the dirty sets and dead lists");
        fs.unmount().unwrap();
        fsck_clean(&img);
        let fs = mount(&img, opts());
        for (i, f) in files.iter().enumerate() {
            let mut buf = vec![0u8; 32];
            let got = fs.read_at(*f, 0, &mut buf).unwrap();
            assert_eq!(&buf[..got], format!("data {i}").as_bytes(), "n={n}: file {i}");
        }
        fs.unmount().unwrap();
    }
}

/// `Fs::name_of` finds an inode's latest name: after a create, a rename into another
/// directory (found past a batch of the scan), a checkpoint and remount (the directory is kept
/// with the inode), a rename replayed from the journal after a crash, and none once unlinked.
#[test]
fn name_of_finds_the_latest_name_across_renames_remounts_and_replay() {
    let mut dev = fresh(64 << 20, 1);
    let opts = || FsOptions { checkpoint_interval: None, ..Default::default() };
    let fs = mount(&dev, opts());
    let a = fs.mkdir(ROOT, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(ROOT, b"b", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(a, b"f", 0o644, 0, 0).unwrap().ino;
    assert_eq!(fs.name_of(f).unwrap(), Some((a, b"f".to_vec())));
    for n in 0..600 {
        fs.create(b, format!("filler{n}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    fs.rename(a, b"f", b, b"g", RenameFlags::empty()).unwrap();
    assert_eq!(fs.name_of(f).unwrap(), Some((b, b"g".to_vec())));
    assert_eq!(fs.name_of(a).unwrap(), Some((ROOT, b"a".to_vec())), "a directory's name");
    assert_eq!(fs.name_of(ROOT).unwrap(), None, "the root has none");
    fs.unmount().unwrap();

    let fs = mount(&dev, opts());
    assert_eq!(fs.name_of(f).unwrap(), Some((b, b"g".to_vec())), "kept across a remount");
    fs.rename(b, b"g", a, b"h", RenameFlags::empty()).unwrap();
    fs.fsync(f, false).unwrap();
    fs.fsync(a, false).unwrap();
    std::mem::forget(fs); // a crash: only the journal has the rename
    dev.crashed();

    let fs = mount(&dev, opts());
    assert_eq!(fs.name_of(f).unwrap(), Some((a, b"h".to_vec())), "replayed");
    fs.link(f, ROOT, b"second").unwrap();
    assert_eq!(fs.name_of(f).unwrap(), Some((ROOT, b"second".to_vec())), "the latest link");
    fs.unlink(ROOT, b"second").unwrap();
    assert_eq!(fs.name_of(f).unwrap(), None, "no name left in its latest directory");
    fs.unmount().unwrap();
    fsck_clean(&dev);
}
