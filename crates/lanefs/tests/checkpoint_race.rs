//! A checkpoint writes the pages it took in its exclusive phase, then installs their new blocks
//! in each file's mapping, while writers (which do not wait for the gate) go on. Here a writer
//! truncates and re-fallocates a page between the two steps, with a device that holds the
//! checkpoint's data write until the writer is done: the page is gone, and its mapping holds the
//! same "allocated, never written" placeholder as in the snapshot, so it looks unchanged. The
//! checkpoint must not install the truncated page's block there: the fallocated range reads as
//! zeros, before and after a remount.

use lanefs::device::{BlockDevice, IoMode, MemDevice, ReadReq, WriteReq};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// What the held write is waiting for, and where the test is.
#[derive(Default, PartialEq)]
enum Hold {
    #[default]
    Off,
    /// Hold the first write batch that carries this block.
    Armed(Vec<u8>),
    Holding,
    Released,
}

/// A `MemDevice` that can hold one write batch until the test lets it go (the fault injected:
/// a slow device at the worst moment).
struct HoldingDevice {
    inner: MemDevice,
    hold: Mutex<Hold>,
    cv: Condvar,
}

impl HoldingDevice {
    fn wait_until(&self, want: impl Fn(&Hold) -> bool) {
        let g = self.hold.lock().unwrap();
        let (_g, t) = self.cv.wait_timeout_while(g, Duration::from_secs(30), |h| !want(h)).unwrap();
        assert!(!t.timed_out(), "the checkpoint never wrote the page");
    }

    fn set(&self, h: Hold) {
        *self.hold.lock().unwrap() = h;
        self.cv.notify_all();
    }
}

impl BlockDevice for HoldingDevice {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> std::io::Result<()> {
        self.inner.read_batch(reqs)
    }
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> std::io::Result<()> {
        let mut g = self.hold.lock().unwrap();
        if let Hold::Armed(block) = &*g {
            if reqs.iter().any(|r| r.data.chunks(4096).any(|b| b == &block[..])) {
                *g = Hold::Holding;
                self.cv.notify_all();
                let (_g, t) =
                    self.cv.wait_timeout_while(g, Duration::from_secs(30), |h| *h != Hold::Released).unwrap();
                assert!(!t.timed_out(), "the test never released the write");
            }
        }
        self.inner.write_batch(reqs)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn io_mode(&self) -> IoMode {
        self.inner.io_mode()
    }
}

#[test]
fn page_truncated_and_fallocated_during_a_checkpoint_reads_as_zeros() {
    let dev = Arc::new(HoldingDevice {
        inner: MemDevice::new(64 << 20),
        hold: Mutex::default(),
        cv: Condvar::new(),
    });
    Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    let opts = || FsOptions { checkpoint_interval: None, ..Default::default() };
    let fs = Arc::new(Fs::open(dev.clone(), opts()).unwrap());
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    // The page gets the placeholder mapping, durable in the tree, then data in the cache.
    fs.fallocate(f, lanefs::FallocMode::empty(), 0, 4096).unwrap();
    fs.sync().unwrap();
    let data = vec![0xA5u8; 4096];
    fs.write_at(f, 0, &data).unwrap();

    dev.set(Hold::Armed(data.clone()));
    let cp = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.sync())
    };
    dev.wait_until(|h| *h == Hold::Holding);
    // The checkpoint took the page and is writing it: cut it and allocate it again.
    fs.truncate(f, 0).unwrap();
    fs.fallocate(f, lanefs::FallocMode::empty(), 0, 4096).unwrap();
    dev.set(Hold::Released);
    cp.join().unwrap().unwrap();

    let mut buf = vec![0xFFu8; 4096];
    assert_eq!(fs.read_at(f, 0, &mut buf).unwrap(), 4096);
    assert!(buf.iter().all(|&b| b == 0), "the truncated page's data came back after the checkpoint");

    Arc::into_inner(fs).unwrap().unmount().unwrap();
    let fs = Fs::open(dev.clone(), opts()).unwrap();
    let f = fs.lookup(ROOT, b"f").unwrap().ino;
    let mut buf = vec![0xFFu8; 4096];
    assert_eq!(fs.read_at(f, 0, &mut buf).unwrap(), 4096);
    assert!(buf.iter().all(|&b| b == 0), "the truncated page's data came back after a remount");
    fs.unmount().unwrap();
}
