//! SEEK_DATA and SEEK_HOLE through a lanefs mount, with the kernel's writeback cache holding
//! dirty pages the engine has not seen: the daemon has them written back before it answers
//! (`lanefs_fuse::proto::spares` keeps that from hanging a queue). Each needs root, /dev/fuse
//! and fusermount3.

mod common;

use common::*;
use rustix::fs::SeekFrom;
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

const PAGE: u64 = 4096;

/// Where SEEK_DATA and SEEK_HOLE from `off` land in a file of `size` bytes whose written pages
/// are `pages` (every other byte a hole).
fn model(pages: &BTreeSet<u64>, size: u64, off: u64) -> (Option<u64>, u64) {
    let p = off / PAGE;
    let data = if pages.contains(&p) { Some(off) } else { pages.range(p..).next().map(|q| q * PAGE) };
    let mut end = p;
    while pages.contains(&end) {
        end += 1;
    }
    let hole = if end == p { off } else { (end * PAGE).min(size) };
    (data.filter(|&d| d < size), hole.min(size))
}

fn seeks(f: &File, off: u64) -> (Option<u64>, u64) {
    let data = rustix::fs::seek(f, SeekFrom::Data(off)).ok();
    let hole = rustix::fs::seek(f, SeekFrom::Hole(off)).expect("SEEK_HOLE below the size");
    (data, hole)
}

/// Pages written and never synced: every seek sees them, in both cache modes and transports.
#[test]
fn seek_data_and_hole_see_pages_the_kernel_holds_dirty() {
    if !fuse_available() {
        return;
    }
    for mode in ["writeback_cache=on", "writeback_cache=off"] {
        let (_dir, img, mp) = scratch_image();
        let m = Mounted::daemon(&img, &mp, &["-o", mode]);
        let p = m.mp.join("sparse");
        let w = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&p).unwrap();
        let mut pages = BTreeSet::new();
        let size = 1 << 30;
        w.set_len(size).unwrap();
        for (k, pg) in [3u64, 4, 5, 100, 4000, 262_143].into_iter().enumerate() {
            w.write_all_at(&[k as u8 + 1; PAGE as usize], pg * PAGE).unwrap();
            pages.insert(pg);
            // Another descriptor, as `cp` would have.
            let r = File::open(&p).unwrap();
            for off in
                [0, 3 * PAGE + 17, 6 * PAGE, 99 * PAGE, 100 * PAGE, 101 * PAGE, 4000 * PAGE - 1, size - 1]
            {
                assert_eq!(
                    seeks(&r, off),
                    model(&pages, size, off),
                    "{mode}: from {off} with pages {pages:?}"
                );
            }
        }
        drop(w);
        m.umount();
        fsck_clean(&img);
    }
}

/// Threads on one CPU each write pages of their own sparse file and seek it at once, so that
/// every worker of that CPU's queue can be waiting for the kernel's write-back together: spares
/// must keep the queue served. Also with one /dev/fuse worker (`threads=1`), where every such
/// wait needs a spare. A hang fails the test after a minute.
#[test]
fn many_seekers_on_one_cpu_never_hang() {
    if !fuse_available() {
        return;
    }
    for extra in ["writeback_cache=on", "writeback_cache=on,threads=1"] {
        let (_dir, img, mp) = scratch_image();
        let m = Mounted::daemon(&img, &mp, &["-o", extra]);
        let (done_tx, done_rx) = mpsc::channel();
        const THREADS: usize = 8;
        for t in 0..THREADS {
            let p = m.mp.join(format!("f{t}"));
            let done = done_tx.clone();
            std::thread::spawn(move || {
                let mut set = rustix::thread::CpuSet::new();
                set.set(0);
                rustix::thread::sched_setaffinity(None, &set).unwrap();
                let r = std::panic::catch_unwind(|| seek_loop(&p, t as u64));
                let _ = done.send(r.is_ok());
            });
        }
        for _ in 0..THREADS {
            let ok = done_rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
                panic!("{extra}: a seeker made no progress for a minute: the mount hangs")
            });
            assert!(ok, "{extra}: a seeker saw a wrong answer (its panic is above)");
        }
        m.umount();
        fsck_clean(&img);
    }
}

fn seek_loop(p: &Path, seed: u64) {
    let f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(p).unwrap();
    let size = 64 << 20;
    f.set_len(size).unwrap();
    let mut pages = BTreeSet::new();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for _ in 0..150 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let pg = x % (size / PAGE);
        f.write_all_at(&[7; PAGE as usize], pg * PAGE).unwrap();
        pages.insert(pg);
        let off = (x >> 20) % size;
        assert_eq!(seeks(&f, off), model(&pages, size, off), "{}: from {off}", p.display());
    }
}
