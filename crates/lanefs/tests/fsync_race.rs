//! Concurrent fsyncs of one file. A page written by one thread can be taken by another
//! thread's fsync; the writer's own fsync then finds nothing left to write, and relies on that
//! other transaction, which must therefore be durable before the writer's fsync returns and
//! must replay after every older transaction that holds an older copy of the page. Here a
//! writer rewrites one page and fsyncs, while other threads fsync the same file in a loop (and,
//! in one variant, memory pressure writes pages back); after the writer's last fsync returns,
//! the image (and region) as they are must recover to exactly its last write.

use lanefs::device::{BlockDevice, MemDevice};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// No checkpoint starts in the background (no interval, journal and region far from their
/// bounds, an image with room to spare), so that the device and the region copied after the
/// threads stop form an image a crash could leave: a copy taken while a checkpoint writes
/// would not be one.
/// With a region, small fsyncs log their pages inline (`FsOptions::nvm_inline_pages`).
fn opts(nvm: Option<&Path>, cache_bytes: Option<u64>) -> FsOptions {
    let mut o = FsOptions {
        checkpoint_interval: None,
        journal_blocks_limit: u64::MAX / 4,
        nvm: nvm.map(Path::to_path_buf),
        nvm_inline_pages: Some(4),
        ..Default::default()
    };
    if let Some(c) = cache_bytes {
        o.cache_bytes = c;
    }
    o
}

fn page(v: u32) -> Vec<u8> {
    let mut p = vec![0u8; 4096];
    for (i, w) in p.chunks_mut(4).enumerate() {
        w.copy_from_slice(&(v ^ i as u32).to_le_bytes());
    }
    p
}

/// Runs `rounds` rounds; each: a writer and three fsyncing threads, then a crash image checked.
fn race(with_region: bool, cache_bytes: Option<u64>, rounds: u32) {
    let d = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
    for round in 0..rounds {
        let region = d.path().join(format!("r{round}.nvm"));
        let copy = d.path().join(format!("c{round}.nvm"));
        let mem = Arc::new(MemDevice::new(256 << 20));
        Fs::format(&*mem, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
        let dev: Arc<dyn BlockDevice> = mem.clone();
        let fs = Arc::new(Fs::open(dev, opts(with_region.then_some(region.as_path()), cache_bytes)).unwrap());
        let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        // A second file of many pages keeps the cache under pressure in the writeback variant.
        let g = fs.create(ROOT, b"g", 0o644, 0, 0).unwrap().ino;
        fs.write_at(f, 0, &page(0)).unwrap();
        fs.sync().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let others: Vec<_> = (0..3)
            .map(|_| {
                let (fs, stop) = (fs.clone(), stop.clone());
                std::thread::spawn(move || {
                    // Bounded by the writer, which sets `stop` after its last fsync.
                    while !stop.load(Ordering::Acquire) {
                        fs.fsync(f, false).unwrap();
                    }
                })
            })
            .collect();
        let mut last = 0;
        for v in 1..=2000u32 {
            fs.write_at(f, 0, &page(v)).unwrap();
            if cache_bytes.is_some() {
                fs.write_at(g, (v as u64 % 64) * 4096, &page(v)).unwrap();
            }
            fs.fsync(f, false).unwrap();
            last = v;
        }
        stop.store(true, Ordering::Release);
        others.into_iter().for_each(|h| h.join().unwrap());
        // The crash: the device and region as they are now, no unmount.
        let img = mem.snapshot();
        if with_region {
            std::fs::copy(&region, &copy).unwrap();
        }
        drop(fs);
        let fs =
            Fs::open(Arc::new(MemDevice::from_bytes(img)), opts(with_region.then_some(copy.as_path()), None))
                .unwrap();
        let f = fs.resolve("/f").unwrap().ino;
        let mut got = vec![0u8; 4096];
        assert_eq!(fs.read_at(f, 0, &mut got).unwrap(), 4096);
        let v = u32::from_le_bytes(got[..4].try_into().unwrap());
        assert_eq!(
            got,
            page(last),
            "round {round} (region {with_region}, cache {cache_bytes:?}): the page reads as version {v}, \
             the last fsynced write was {last}"
        );
        drop(fs);
        let _ = std::fs::remove_file(&region);
        let _ = std::fs::remove_file(&copy);
    }
}

#[test]
fn concurrent_fsyncs_of_one_file_keep_the_last_write() {
    race(false, None, 6);
}

#[test]
fn concurrent_fsyncs_of_one_file_keep_the_last_write_with_a_region() {
    race(true, None, 6);
}

#[test]
fn concurrent_fsyncs_and_writeback_keep_the_last_write() {
    race(false, Some(256 << 10), 4);
    race(true, Some(256 << 10), 4);
}
