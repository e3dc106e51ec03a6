//! Set-up shared by the tests of the persistent-memory region (`nvm.rs`, `nvm_journal.rs`,
//! `tmpfile.rs`):
//! scratch directories in /dev/shm, mount options with a small region, a fresh image, and file
//! contents derived from a seed.

#![allow(dead_code)]

use lanefs::device::MemDevice;
use lanefs::testing::pmem::MIN_REGION_SIZE;
use lanefs::{Fs, FsOptions, MkfsOptions};
use std::path::Path;

/// A directory for region files: /dev/shm where there is one.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap()
}

/// No background checkpoints; the smallest region, at `nvm` (None: no region).
pub fn opts(nvm: Option<&Path>) -> FsOptions {
    FsOptions {
        checkpoint_interval: None,
        nvm: nvm.map(Path::to_path_buf),
        nvm_size: Some(MIN_REGION_SIZE),
        ..Default::default()
    }
}

/// A freshly formatted 64 MiB image with two lanes.
pub fn image() -> MemDevice {
    let dev = MemDevice::new(64 << 20);
    Fs::format(&dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    dev
}

/// `len` bytes that depend on `seed`.
pub fn data(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}
