//! Page-level reads and writes past the range lock (`mem::page_lock`), against everything that
//! still takes the range lock, on one file of a real image.
//!
//! 8 threads share one file: single-page writes (page-level), multi-page writes, single- and
//! multi-page reads, truncates (down and up) and fallocates, over a body that is never
//! truncated and a tail whose pages come and go. Every write writes whole pages, each filled
//! with one 8-byte word that names the writing thread, its operation and the page, and every
//! truncate is page-aligned, so any page that is not all one word of a write of *that* page
//! (or all zeros) is torn. Readers check every page they read as they go.
//!
//! Afterwards every page must hold what some serial order allows: each operation records a
//! start and end tick of one shared clock, and the page's final contents must come from a
//! write of it that no other write or truncate of it started after (real-time order), or be
//! zeros with no write ever, or zeros after a truncate that no write of the page started after.
//! The size must be page-aligned and in the tail's bounds. Then the image is synced, closed,
//! fsck must find it clean, and the reopened file must hold the same pages and size.

mod nvm_mode;

use lanefs::device::{create_image, BlockDevice, DeviceOptions, FileDevice};
use lanefs::rng::Rng;
use lanefs::FallocMode;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, Ino, MkfsOptions, ROOT};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;
const THREADS: u64 = 8;
const OPS: u64 = 5_000;
/// Pages `0..BODY` exist for the whole run; the size moves within `[BODY, END]` pages.
const BODY: u64 = 48;
const END: u64 = 64;

/// The word every 8 bytes of page `page` hold after write `seq` of thread `t`.
fn word(t: u64, seq: u64, page: u64) -> u64 {
    debug_assert!(seq < 1 << 20 && page < 1 << 20);
    ((t + 1) << 40) | (seq << 20) | page
}

fn page_bytes(w: u64) -> Vec<u8> {
    w.to_le_bytes().repeat(PAGE as usize / 8)
}

/// The word page `page` holds (0 for zeros); panics on a torn page or one written for another.
fn page_word(bytes: &[u8], page: u64, what: &str) -> u64 {
    let w = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    if let Some(i) = bytes.chunks(8).position(|c| u64::from_le_bytes(c.try_into().unwrap()) != w) {
        panic!("{what}: page {page} torn: word 0 is {w:#x}, word {i} differs");
    }
    assert!(w == 0 || w & 0xF_FFFF == page, "{what}: page {page} holds a word of page {}", w & 0xF_FFFF);
    w
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Pages `first..=last` written with thread `t`'s write `seq`.
    Write { t: u64, seq: u64, first: u64, last: u64 },
    /// The size set to `pages` pages.
    Truncate { pages: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Done {
    op: Op,
    start: u64,
    end: u64,
}

fn image(dir: &Path) -> Arc<dyn BlockDevice> {
    Arc::new(FileDevice::open(dir.join("page_lock.img"), DeviceOptions::default()).unwrap())
}

fn mount(dir: &Path, region: Option<&nvm_mode::Region>) -> Fs {
    let opts = FsOptions { cache_bytes: 64 * MIB, ..Default::default() };
    Fs::open(image(dir), nvm_mode::with_region(opts, region)).unwrap()
}

/// Reads pages `first..=last` (those below the size) and checks each; returns their words.
fn read_pages(fs: &Fs, ino: Ino, first: u64, last: u64, what: &str) -> Vec<u64> {
    let mut buf = vec![0u8; ((last - first + 1) * PAGE) as usize];
    let n = fs.read_at(ino, first * PAGE, &mut buf).unwrap();
    assert_eq!(n as u64 % PAGE, 0, "{what}: a read of whole pages returned {n} bytes");
    buf[..n].chunks(PAGE as usize).enumerate().map(|(k, b)| page_word(b, first + k as u64, what)).collect()
}

fn worker(fs: &Fs, ino: Ino, t: u64, clock: &AtomicU64, log: &Mutex<Vec<Done>>) {
    let mut rng = Rng::new(lanefs::rng::derive(0x7061_6765, t));
    let mut done = Vec::new();
    for seq in 0..OPS {
        let roll = rng.below(100);
        let what = format!("thread {t} op {seq}");
        let start = clock.fetch_add(1, SeqCst);
        let op = match roll {
            // Single-page writes: page-level once the file has enabled it.
            0..=69 => {
                let p = rng.below(END);
                fs.write_at(ino, p * PAGE, &page_bytes(word(t, seq, p))).unwrap();
                Some(Op::Write { t, seq, first: p, last: p })
            }
            // Multi-page writes: through the range lock, excluding page-level holders.
            70..=74 => {
                let first = rng.below(END - 1);
                let last = (first + 1 + rng.below(3)).min(END - 1);
                let data: Vec<u8> = (first..=last).flat_map(|p| page_bytes(word(t, seq, p))).collect();
                fs.write_at(ino, first * PAGE, &data).unwrap();
                Some(Op::Write { t, seq, first, last })
            }
            75..=89 => {
                let p = rng.below(END);
                read_pages(fs, ino, p, p, &what);
                None
            }
            90..=93 => {
                let first = rng.below(END - 4);
                read_pages(fs, ino, first, first + 3, &what);
                None
            }
            // Truncate down or up (page-aligned), within the tail.
            94..=97 => {
                let pages = BODY + rng.below(END - BODY + 1);
                fs.truncate(ino, pages * PAGE).unwrap();
                Some(Op::Truncate { pages })
            }
            // fallocate of one page that keeps the size: a listed exclusive request over it.
            _ => {
                let p = rng.below(BODY);
                fs.fallocate(ino, FallocMode::KEEP_SIZE, p * PAGE, PAGE).unwrap();
                None
            }
        };
        let end = clock.fetch_add(1, SeqCst);
        if let Some(op) = op {
            done.push(Done { op, start, end });
        }
    }
    log.lock().unwrap().extend(done);
}

/// Whether page `p` holding `w` (0: zeros) at the end is allowed by some serial order of `log`.
fn allowed(log: &[Done], p: u64, w: u64) -> Result<(), String> {
    let writes_p = |d: &&Done| matches!(d.op, Op::Write { first, last, .. } if first <= p && p <= last);
    let cuts_p = |d: &&Done| matches!(d.op, Op::Truncate { pages } if pages <= p);
    if w == 0 {
        if !log.iter().any(|d| writes_p(&d)) {
            return Ok(());
        }
        // Zeros after a truncate that no write of the page certainly followed.
        return match log
            .iter()
            .filter(cuts_p)
            .find(|tr| !log.iter().filter(writes_p).any(|wr| wr.start > tr.end))
        {
            Some(_) => Ok(()),
            None => Err(format!("page {p} reads zeros, but a write of it followed every truncate")),
        };
    }
    let (t, seq) = ((w >> 40) - 1, (w >> 20) & 0xF_FFFF);
    let me = log
        .iter()
        .find(|d| matches!(d.op, Op::Write { t: t2, seq: s2, .. } if t2 == t && s2 == seq))
        .filter(|d| writes_p(d))
        .ok_or_else(|| format!("page {p} holds thread {t} op {seq}, which did not write it"))?;
    if let Some(later) = log.iter().filter(|d| writes_p(d) || cuts_p(d)).find(|d| d.start > me.end) {
        return Err(format!("page {p} holds {:?}, but {:?} started after it ended", me, later));
    }
    Ok(())
}

/// Whether a final size of `pages` pages, whose last page holds `last_word`, is allowed: the
/// last operation to set the size (a truncate to it, or a write that ends there) must not be
/// followed in real time by a truncate to another size; and if the last page is zeros, it was
/// such a truncate, which no write of that page followed.
fn size_allowed(log: &[Done], pages: u64, last_word: u64) -> Result<(), String> {
    let other_truncate_after = |x: &Done| {
        log.iter().any(|d| matches!(d.op, Op::Truncate { pages: p } if p != pages) && d.start > x.end)
    };
    let write_of_last_after = |x: &Done| {
        log.iter().any(|d| {
            matches!(d.op, Op::Write { first, last, .. } if first < pages && last + 1 >= pages)
                && d.start > x.end
        })
    };
    let ok = log.iter().any(|x| match x.op {
        Op::Truncate { pages: p } => {
            p == pages && !other_truncate_after(x) && (last_word != 0 || !write_of_last_after(x))
        }
        Op::Write { last, .. } => last + 1 == pages && last_word != 0 && !other_truncate_after(x),
    });
    // The size the file started with, if nothing changed it for good.
    let initial = pages == END && !log.iter().any(|d| matches!(d.op, Op::Truncate { pages: p } if p != END));
    if ok || initial {
        Ok(())
    } else {
        Err(format!("size of {pages} pages (last page {last_word:#x}) follows from no serial order"))
    }
}

#[test]
fn page_level_writes_against_range_requests() {
    let dir = tempfile::tempdir().unwrap();
    create_image(dir.path().join("page_lock.img"), 256 * MIB).unwrap();
    Fs::format(&*image(dir.path()), &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    let region = nvm_mode::Region::if_enabled();
    let fs = Arc::new(mount(dir.path(), region.as_ref()));
    let ino = fs.create(ROOT, b"shared", 0o644, 0, 0).unwrap().ino;
    fs.truncate(ino, END * PAGE).unwrap();

    let clock = AtomicU64::new(0);
    let log = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (fs, clock, log) = (&fs, &clock, &log);
            s.spawn(move || worker(fs, ino, t, clock, log));
        }
    });
    let log = log.into_inner().unwrap();
    assert!(log.len() as u64 > THREADS * OPS / 2);

    let size = fs.getattr(ino).unwrap().size;
    assert_eq!(size % PAGE, 0, "size {size} not page-aligned");
    assert!((BODY * PAGE..=END * PAGE).contains(&size), "size {size} outside the tail");
    let pages = size / PAGE;
    let words = read_pages(&fs, ino, 0, END - 1, "after the run");
    assert_eq!(words.len() as u64, pages, "a read of the whole file stops at the size");
    for (p, &w) in words.iter().enumerate() {
        if let Err(e) = allowed(&log, p as u64, w) {
            panic!("after the run: {e}");
        }
    }
    if let Err(e) = size_allowed(&log, pages, *words.last().unwrap()) {
        panic!("after the run: {e}");
    }
    let written = words.iter().filter(|&&w| w != 0).count();
    assert!(written as u64 > BODY / 2, "only {written} pages written");

    fs.sync().unwrap();
    Arc::into_inner(fs).expect("every thread is done").unmount().unwrap();
    let opts = FsckOptions { nvm: region.as_ref().map(|r| r.path().to_path_buf()), ..Default::default() };
    let r = fsck(&*image(dir.path()), &opts).unwrap();
    assert!(r.is_clean(), "fsck: {:#?}", r.problems);

    let fs = mount(dir.path(), region.as_ref());
    assert_eq!(fs.getattr(ino).unwrap().size, size, "size after reopening");
    assert_eq!(read_pages(&fs, ino, 0, END - 1, "after reopening"), words);
    fs.unmount().unwrap();
}
