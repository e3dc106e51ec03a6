//! O_DIRECT beside buffered I/O through a lanefs mount, with the kernel's writeback cache on:
//! direct opens get FOPEN_DIRECT_IO (writers of one file in parallel), the kernel writes a
//! range's dirty pages back before each direct read or write, and the daemon has the dirty
//! tail written back when a direct read comes back short, since the kernel's size is ahead of
//! the engine's until it does. Each needs root, /dev/fuse and fusermount3.

mod common;

use common::*;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

const PAGE: usize = 4096;

/// The one system call these tests need that neither std nor rustix wraps safely: the only
/// module of the tests that exists for unsafe, and the only one allowed it.
#[allow(unsafe_code)]
mod sys {
    use std::fs::File;
    use std::os::fd::AsRawFd;

    /// A shared read-only mapping of the first `len` bytes of a file, unmapped on drop.
    pub struct Mapping {
        at: *const u8,
        len: usize,
    }

    // SAFETY: the mapping is read only and owned by this value; reading it from another thread
    // is as sound as from this one.
    unsafe impl Send for Mapping {}

    impl Mapping {
        pub fn new(f: &File, len: usize) -> Mapping {
            // SAFETY: a fresh mapping that nothing else refers to, of a descriptor that is open
            // for the call; the mapping outlives the descriptor's use here by design (mmap
            // holds its own reference to the file).
            let a = unsafe {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0)
            };
            assert_ne!(a, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
            Mapping { at: a as *const u8, len }
        }

        /// The byte at `off` (a page fault the first time); `off` must be below the file's size.
        pub fn byte(&self, off: usize) -> u8 {
            assert!(off < self.len);
            // SAFETY: within the mapping (asserted); past the file's end it would raise SIGBUS,
            // which the callers avoid, not read freed memory.
            unsafe { std::ptr::read_volatile(self.at.add(off)) }
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, unmapped once; no reference into it outlives
            // `self` (`byte` returns copies).
            unsafe { libc::munmap(self.at as *mut libc::c_void, self.len) };
        }
    }
}
/// Where the buffered append lands: far past the engine's end of file (0), so that a direct read
/// below it asks about a hole the engine does not know is inside the file yet.
const FAR: u64 = 1 << 20;

fn direct(p: &Path) -> File {
    OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(p).unwrap()
}

/// A buffered write far past the end, still dirty in the kernel; then direct reads of the hole
/// before it, of it, and across the end, and a direct write that buffered reads see.
#[test]
fn direct_reads_see_the_size_and_data_of_dirty_appends() {
    if !fuse_available() {
        return;
    }
    for mode in ["writeback_cache=on", "writeback_cache=off"] {
        let (_dir, img, mp) = scratch_image();
        let m = Mounted::daemon(&img, &mp, &["-o", mode]);
        let p = m.mp.join("f");
        let buffered =
            OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&p).unwrap();
        let tail = data(7, PAGE);
        buffered.write_all_at(&tail, FAR).unwrap();
        let d = direct(&p);
        let mut buf = AlignedBuf::new(2 * PAGE);
        // The hole below the append: all of it, zeros.
        let n = d.read_at(buf.as_mut(), 0).unwrap();
        assert_eq!(n, 2 * PAGE, "{mode}: a direct read of the hole before a dirty append came back short");
        assert!(buf.as_ref().iter().all(|&b| b == 0), "{mode}: the hole reads as zeros");
        // The appended page, then the end of file.
        let n = d.read_at(buf.as_mut(), FAR).unwrap();
        assert_eq!(n, PAGE, "{mode}: a direct read across the end stops at the size");
        assert_eq!(&buf.as_ref()[..PAGE], &tail[..], "{mode}: the appended page");
        assert_eq!(d.metadata().unwrap().len(), FAR + PAGE as u64, "{mode}: size");
        // A direct write over a page the kernel caches: buffered reads see it.
        let mut page = vec![0u8; PAGE];
        buffered.read_exact_at(&mut page, 0).unwrap();
        let new = data(9, PAGE);
        buf.as_mut()[..PAGE].copy_from_slice(&new);
        d.write_all_at(&buf.as_ref()[..PAGE], 0).unwrap();
        buffered.read_exact_at(&mut page, 0).unwrap();
        assert_eq!(page, new, "{mode}: a buffered read after a direct write");
        drop((buffered, d));
        // The kernel may hold the mount until the daemon has answered the RELEASEs.
        umount_settled(m);
        fsck_clean(&img);
    }
}

/// A page fault of a shared mapping of a direct file, in the hole before a dirty append made
/// after the mapping: its READ comes back short and holds the page locked, which a write-back
/// would wait on. The daemon tells it from a direct read (no lock owner) and answers it short,
/// which the kernel zero-fills. A hang fails the test after a minute.
#[test]
fn a_fault_before_a_dirty_append_does_not_hang() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let p = m.mp.join("mapped");
    let buffered = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&p).unwrap();
    let d = direct(&p);
    // Mapped first: mmap of a direct file writes its dirty pages back, so the append comes after.
    let map = sys::Mapping::new(&d, FAR as usize + PAGE);
    let tail = data(3, PAGE);
    buffered.write_all_at(&tail, FAR).unwrap();
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let first = map.byte(0);
        let last = map.byte(FAR as usize);
        let _ = tx.send((first, last));
    });
    let (first, last) = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("a fault in the hole before a dirty append hung for a minute"));
    t.join().unwrap();
    assert_eq!(first, 0, "the hole reads as zeros");
    assert_eq!(last, tail[0], "the appended page through the mapping");
    // The append reaches the engine in the end: a direct read of the hole is then whole.
    let mut buf = AlignedBuf::new(PAGE);
    assert_eq!(d.read_at(buf.as_mut(), 0).unwrap(), PAGE);
    drop((buffered, d));
    // The kernel may hold the mount until the daemon has answered the RELEASEs (the mapping's
    // among them).
    umount_settled(m);
    fsck_clean(&img);
}
