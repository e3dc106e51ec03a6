//! From an inode back to a name: for the rare callers that must name a file they know only by
//! number (the FUSE adapter, which drops the kernel's entry of a file after a change the
//! kernel would not otherwise see).
//!
//! Every inode keeps the directory of its latest name (`MNode::parent`: set at create, link
//! and rename, and written with the inode). The name itself is found by a scan of that
//! directory, so a call costs O(entries): not for a hot path.

use super::{Fs, Ino};
use crate::error::Result;
use std::sync::atomic::Ordering;

/// Entries read per batch of the scan; bounds the memory of one call.
const SCAN_BATCH: usize = 256;

impl Fs {
    /// A name of `ino` and the directory that holds it: the directory of its latest name, and
    /// the first entry there that links to `ino`. None if it has no name there (unlinked, a
    /// directory's root, or an inode written before lanefs kept a file's directory across
    /// renames). Another hard link's name in another directory is not looked for.
    pub fn name_of(&self, ino: Ino) -> Result<Option<(Ino, Vec<u8>)>> {
        self.engine.disk.check_live()?;
        let _g = self.engine.mem.pass.shared();
        let m = self.engine.mnode(super::ino32(ino)?)?;
        let parent = m.parent.load(Ordering::Acquire);
        if parent == 0 || parent as Ino == ino {
            return Ok(None);
        }
        let Ok(d) = self.engine.dir_mnode(parent) else { return Ok(None) };
        let Some(dir) = d.dir() else { return Ok(None) };
        let mut cookie = 2;
        // Bounded: each batch moves the cookie forward, and a directory holds finitely many.
        loop {
            let batch = dir.map.list_after(cookie, SCAN_BATCH, None);
            if let Some((name, _)) = batch.iter().find(|(_, e)| e.ino as Ino == ino) {
                return Ok(Some((parent as Ino, name.clone())));
            }
            match batch.last() {
                Some((_, e)) if batch.len() == SCAN_BATCH => {
                    debug_assert!(e.cookie > cookie, "the scan moves forward");
                    cookie = e.cookie;
                }
                _ => return Ok(None),
            }
        }
    }
}
