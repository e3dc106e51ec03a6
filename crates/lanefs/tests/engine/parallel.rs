//! Threads against one engine: writers to disjoint ranges of one file, creates, unlinks and
//! renames across directories, and a file system filled up (ENOSPC, then space recovered).

use super::*;

#[test]
fn parallel_writers_to_disjoint_ranges_of_one_file() {
    for threads in [2usize, 4, 8] {
        let dev = fresh(128 << 20, 2);
        let fs = Arc::new(mount(&dev, FsOptions::default()));
        let f = fs.create(ROOT, b"shared", 0o644, 0, 0).unwrap();
        let per = 300u64;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        let blk = i * threads as u64 + t as u64;
                        let data = vec![(t as u8) ^ (i as u8); 4096];
                        fs.write_at(f.ino, blk * 4096, &data).unwrap();
                        if i % 50 == 0 {
                            fs.fsync(f.ino, false).unwrap();
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        let fs = Arc::try_unwrap(fs).ok().unwrap();
        fs.unmount().unwrap();
        fsck_clean(&dev);
        let fs = mount(&dev, FsOptions::default());
        let a = fs.getattr(f.ino).unwrap();
        assert_eq!(a.size, per * threads as u64 * 4096);
        let mut buf = vec![0u8; 4096];
        for blk in 0..per * threads as u64 {
            fs.read_at(f.ino, blk * 4096, &mut buf).unwrap();
            let (t, i) = (blk % threads as u64, blk / threads as u64);
            assert!(buf.iter().all(|&b| b == (t as u8) ^ (i as u8)), "block {blk}");
        }
        fs.unmount().unwrap();
    }
}

#[test]
fn parallel_creates_unlinks_and_cross_directory_renames() {
    let dev = fresh(128 << 20, 2);
    let fs = Arc::new(mount(
        &dev,
        FsOptions { checkpoint_interval: Some(std::time::Duration::from_millis(20)), ..Default::default() },
    ));
    let shared = fs.mkdir(ROOT, b"shared", 0o755, 0, 0).unwrap().ino;
    let a = fs.mkdir(ROOT, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(ROOT, b"b", 0o755, 0, 0).unwrap().ino;
    let threads = 8usize;
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut kept = Vec::new();
                for i in 0..400 {
                    let name = format!("t{t}-{i}");
                    fs.create(shared, name.as_bytes(), 0o644, 0, 0).unwrap();
                    if i % 3 == 0 {
                        fs.unlink(shared, name.as_bytes()).unwrap();
                    } else {
                        kept.push(name);
                    }
                    if i % 97 == 0 {
                        fs.fsync(shared, false).unwrap();
                    }
                }
                // Renames between a and b race with fsyncs of either.
                for i in 0..100 {
                    let n = format!("r{t}-{i}");
                    fs.create(a, n.as_bytes(), 0o644, 0, 0).unwrap();
                    fs.rename(a, n.as_bytes(), b, n.as_bytes(), RenameFlags::empty()).unwrap();
                    if i % 10 == 0 {
                        fs.fsync(if t % 2 == 0 { a } else { b }, false).unwrap();
                    }
                }
                kept
            })
        })
        .collect();
    let mut kept: Vec<String> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    kept.sort();
    let fs = Arc::try_unwrap(fs).ok().unwrap();
    fs.unmount().unwrap();
    fsck_clean(&dev);
    let fs = mount(&dev, FsOptions::default());
    let mut names: Vec<String> = fs
        .readdir(shared, 2, 1 << 20)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect();
    names.sort();
    assert_eq!(names, kept, "no lost or extra entry in the shared directory");
    assert_eq!(fs.readdir(a, 2, 1 << 20).unwrap().len(), 0);
    assert_eq!(fs.readdir(b, 2, 1 << 20).unwrap().len(), threads * 100);
    fs.unmount().unwrap();
}

#[test]
fn a_full_file_system_says_enospc_stays_consistent_and_recovers_space() {
    let dev = fresh(96 << 20, 1);
    let fs = mount(&dev, FsOptions { checkpoint_interval: None, ..Default::default() });
    let mut written = Vec::new();
    let chunk = vec![0xA5u8; 256 * 1024];
    let mut full = None;
    'fill: for i in 0..10_000 {
        let name = format!("f{i}");
        let a = match fs.create(ROOT, name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => a,
            Err(e) => {
                full = Some(e);
                break;
            }
        };
        for k in 0..4u64 {
            if let Err(e) = fs.write_at(a.ino, k * chunk.len() as u64, &chunk) {
                full = Some(e);
                break 'fill;
            }
        }
        written.push((name, a.ino));
    }
    let e = full.expect("a 96 MiB image fills up");
    assert_eq!(e.to_errno(), libc::ENOSPC, "{e}");
    assert!(written.len() > 20, "only {} MiB fit", written.len());
    // Full, yet every durable operation still works and the checkpoint lands.
    fs.sync().unwrap();
    fs.unmount().unwrap();
    fsck_clean(&dev);
    let fs = mount(&dev, FsOptions { checkpoint_interval: None, ..Default::default() });
    for (name, _) in written.iter().take(written.len() / 2) {
        fs.unlink(ROOT, name.as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    // The space of the deleted files is usable again.
    let a = fs.create(ROOT, b"after", 0o644, 0, 0).unwrap();
    for k in 0..8u64 {
        fs.write_at(a.ino, k * chunk.len() as u64, &chunk).unwrap();
    }
    let mut buf = vec![0u8; chunk.len()];
    for (name, ino) in written.iter().skip(written.len() / 2) {
        fs.read_at(*ino, 0, &mut buf).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(buf == chunk, "{name} content");
    }
    fs.unmount().unwrap();
    fsck_clean(&dev);
}
