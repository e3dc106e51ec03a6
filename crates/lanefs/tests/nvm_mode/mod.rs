//! `LANEFS_TEST_NVM=1`: the switch that runs the engine's test files with a persistent-memory
//! region (`FsOptions::nvm`) on every file system they open, so that both modes pass the same
//! tests (ARCHITECTURE.md, "Persistent-memory mode"). Read only here, by test code; the library never
//! looks at it.
//!
//! A region is bound to one image (by UUID), so it belongs to the image: [`Region`] is a file
//! in a fresh directory in /dev/shm (a tempdir where there is none) that the test keeps next to
//! its device for as long as the device lives; every mount of that device uses it, and dropping
//! it removes the file and its directory.

#![allow(dead_code)]

use lanefs::FsOptions;
use std::path::{Path, PathBuf};

/// Whether `LANEFS_TEST_NVM` asks for regions (`1`, `true` or `yes`).
pub fn enabled() -> bool {
    matches!(std::env::var("LANEFS_TEST_NVM").as_deref(), Ok("1" | "true" | "yes"))
}

/// The region file of one image. Created by the first mount with it; removed (with its
/// directory) when dropped.
pub struct Region {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl Region {
    /// A new, not yet existing region path in /dev/shm (or a tempdir).
    pub fn new() -> Region {
        let dir = tempfile::Builder::new()
            .prefix("lanefs-test-nvm-")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::Builder::new().prefix("lanefs-test-nvm-").tempdir())
            .expect("a directory for the region");
        let path = dir.path().join("region.nvm");
        Region { dir, path }
    }

    /// A region in nvm mode, none otherwise.
    pub fn if_enabled() -> Option<Region> {
        enabled().then(Region::new)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Another path in the region's directory (copies of crash states), removed with it.
    pub fn sibling(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A new region holding a copy of this one's file: after a simulated crash (`mem::forget` of
    /// a mounted `Fs`, which keeps the region mapped and locked), the region as the crash left
    /// it, which the next mount can open.
    pub fn copy(&self) -> Region {
        let r = Region::new();
        if self.path.exists() {
            std::fs::copy(&self.path, &r.path).expect("copy the region");
        }
        r
    }

    /// The region's bytes (empty if no mount has created it yet).
    pub fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap_or_default()
    }
}

/// `opts` with the region (if any) set.
pub fn with_region(opts: FsOptions, region: Option<&Region>) -> FsOptions {
    match region {
        Some(r) => FsOptions { nvm: Some(r.path().to_path_buf()), ..opts },
        None => opts,
    }
}
