//! `-o idle_poll`: while a mount serves requests its daemon holds a 0 µs CPU latency request
//! (the PM QoS device), and it gives it back once the mount is quiet; `idle_poll=off` never
//! takes it. Read through the device itself, which reports the bound in force. One test in its
//! own binary: another mount running beside it would hold the request too. Needs root,
//! /dev/fuse and fusermount3, as every FUSE test.

mod common;

use common::*;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const QOS: &str = "/dev/cpu_dma_latency";

/// The CPU latency bound in force, in µs.
fn bound() -> i32 {
    let mut b = [0u8; 4];
    std::fs::File::open(QOS).and_then(|mut f| f.read_exact(&mut b)).unwrap_or_else(|e| panic!("{QOS}: {e}"));
    i32::from_ne_bytes(b)
}

/// Waits (at most `limit`) for the bound to be `want`; returns the last bound read.
fn wait_bound(want: i32, limit: Duration) -> i32 {
    let start = Instant::now();
    loop {
        let b = bound();
        if b == want || start.elapsed() > limit {
            return b;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `f` with a thread making requests (an uncached xattr of the root) until it returns.
fn while_busy<T>(mp: &Path, f: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = rustix::fs::getxattr(mp, "user.lanefs.test", &mut [0u8; 8][..]);
            }
        });
        let r = f();
        stop.store(true, Ordering::Relaxed);
        r
    })
}

#[test]
fn a_busy_mount_holds_idle_cpus_polling_and_a_quiet_one_lets_them_sleep() {
    if !fuse_available() {
        return;
    }
    let before = bound();
    assert_ne!(before, 0, "another process holds a 0 µs CPU latency request: this test cannot tell ours");
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let busy = while_busy(&m.mp, || wait_bound(0, Duration::from_secs(5)));
    assert_eq!(busy, 0, "the daemon took no latency request while serving requests");
    assert_eq!(
        wait_bound(before, Duration::from_secs(5)),
        before,
        "the request was kept after the mount went quiet"
    );
    // Busy again: taken again.
    assert_eq!(while_busy(&m.mp, || wait_bound(0, Duration::from_secs(5))), 0);
    m.umount();
    assert_eq!(wait_bound(before, Duration::from_secs(5)), before, "the request outlived the mount");

    let m = Mounted::daemon(&img, &mp, &["-o", "idle_poll=off"]);
    // Half a second of requests is 50 ticks of the daemon's watch: ample to take it.
    let seen = while_busy(&m.mp, || {
        let start = Instant::now();
        let mut lowest = bound();
        while start.elapsed() < Duration::from_millis(500) {
            lowest = lowest.min(bound());
            std::thread::sleep(Duration::from_millis(5));
        }
        lowest
    });
    assert_eq!(seen, before, "idle_poll=off took a latency request");
    m.umount();
}
