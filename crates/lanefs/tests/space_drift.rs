//! Free space comes back: after many threads write, preallocate, punch and truncate one file
//! under a small cache (writeback and checkpoints all the while), deleting the file gives every
//! block back. A counter that drifts (dirty pages, reservations, claims) would leave statfs short
//! and, in time, refuse writes with ENOSPC on a file system that is nearly empty.

mod nvm_mode;

use lanefs::device::{BlockDevice, MemDevice};
use lanefs::rng::Rng;
use lanefs::FallocMode;
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

#[test]
fn free_space_comes_back_after_concurrent_writes_fallocates_punches_and_truncates() {
    let dev = Arc::new(MemDevice::new(160 * MIB));
    Fs::format(&*dev, &MkfsOptions::default()).unwrap();
    let region = nvm_mode::Region::if_enabled();
    let opts = FsOptions {
        cache_bytes: MIB,
        checkpoint_interval: Some(Duration::from_millis(200)),
        nvm: region.as_ref().map(|r| r.path().to_path_buf()),
        ..Default::default()
    };
    let fs = Arc::new(Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts).unwrap());
    fs.sync().unwrap();
    let before = fs.statfs().bfree;
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let end = Instant::now() + Duration::from_secs(8);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(0xD41F7 + t);
                let base = t * 4 * MIB;
                let mut ops = 0u64;
                while Instant::now() < end {
                    ops += 1;
                    let off = base + rng.below(4 * MIB - 70_000);
                    let len = 1 + rng.below(65_536);
                    let r = match rng.below(10) {
                        0..=5 => fs.write_at(f, off, &vec![t as u8 + 1; len as usize]).map(|_| ()),
                        6 => fs.fallocate(f, FallocMode::KEEP_SIZE, off, len),
                        7 => fs.fallocate(f, FallocMode::PUNCH_HOLE | FallocMode::KEEP_SIZE, off, len),
                        8 => fs.fallocate(f, FallocMode::ZERO_RANGE | FallocMode::KEEP_SIZE, off, len),
                        _ => fs.fsync(f, rng.chance(1, 2)),
                    };
                    r.unwrap_or_else(|e| panic!("thread {t}, op {ops} at {off} +{len}: {e}"));
                }
                ops
            })
        })
        .collect();
    // The tail: truncates and allocations past the end.
    let mut rng = Rng::new(0x7A11);
    while Instant::now() < end {
        let at = 16 * MIB + rng.below(8 * MIB);
        let r = match rng.below(3) {
            0 => fs.truncate(f, at),
            1 => fs.fallocate(f, FallocMode::empty(), at, 1 + rng.below(300_000)),
            _ => fs.fallocate(f, FallocMode::KEEP_SIZE, at, 1 + rng.below(300_000)),
        };
        r.unwrap_or_else(|e| panic!("tail at {at}: {e}"));
    }
    let ops: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    fs.unlink(ROOT, b"f").unwrap();
    fs.sync().unwrap();
    fs.sync().unwrap();
    let after = fs.statfs().bfree;
    assert!(after + 8 >= before, "{ops} ops: free went from {before} to {after} blocks with the file gone");
    eprintln!("{ops} ops: free {before} -> {after}");
}
