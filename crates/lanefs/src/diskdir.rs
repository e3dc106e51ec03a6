//! A directory's on-disk layout: which dentry block holds which name.
//!
//! The checkpoint brings a directory's dentry blocks up to date by applying the names its
//! operation log says changed, rewriting only the blocks those names live in (ScaleFS applies
//! logged operations to the on-disk directory the same way). Names removed leave space that
//! later inserts reuse; a block that becomes empty stays (written with no entries), so logical
//! block indexes never shift.

use crate::format::dentry::{Dentry, DentryBlock, DENTRY_SPACE};
use std::collections::HashMap;

struct Blk {
    entries: Vec<Dentry>,
    used: usize,
    dirty: bool,
}

/// The dentry blocks of one directory.
#[derive(Default)]
pub struct DiskDir {
    blocks: Vec<Blk>,
    index: HashMap<Vec<u8>, usize>,
    /// Blocks that gained space since they were last tried, checked before appending a block.
    roomy: Vec<usize>,
}

impl DiskDir {
    /// The layout of blocks read from disk, in logical order.
    pub fn load(blocks: Vec<DentryBlock>) -> DiskDir {
        let mut d = DiskDir::default();
        for (i, b) in blocks.into_iter().enumerate() {
            let used = b.entries.iter().map(Dentry::encoded_len).sum();
            for e in &b.entries {
                d.index.insert(e.name.clone(), i);
            }
            if used < DENTRY_SPACE {
                d.roomy.push(i);
            }
            d.blocks.push(Blk { entries: b.entries, used, dirty: false });
        }
        d
    }

    #[cfg(test)]
    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// Makes `name` map to `to` (None: absent).
    pub fn set(&mut self, name: &[u8], to: Option<(u32, u8)>) {
        if let Some(bi) = self.index.remove(name) {
            let b = &mut self.blocks[bi];
            let pos = b.entries.iter().position(|e| e.name == name).expect("indexed name is in its block");
            let e = b.entries.swap_remove(pos);
            b.used -= e.encoded_len();
            b.dirty = true;
            self.roomy.push(bi);
        }
        let Some((ino, file_type)) = to else { return };
        let d = Dentry { ino, file_type, name: name.to_vec() };
        let need = d.encoded_len();
        // Bounded: each roomy entry is popped once per failed try.
        let mut target = None;
        while let Some(&bi) = self.roomy.last() {
            if self.blocks[bi].used + need <= DENTRY_SPACE {
                target = Some(bi);
                break;
            }
            self.roomy.pop();
        }
        let bi = target.unwrap_or_else(|| {
            self.blocks.push(Blk { entries: Vec::new(), used: 0, dirty: true });
            self.roomy.push(self.blocks.len() - 1);
            self.blocks.len() - 1
        });
        let b = &mut self.blocks[bi];
        b.used += need;
        b.entries.push(d);
        b.dirty = true;
        self.index.insert(name.to_vec(), bi);
    }

    /// Blocks changed since the last call, with their logical indexes; marks them clean.
    pub fn take_dirty(&mut self, dir_ino: u32) -> Vec<(u64, DentryBlock)> {
        self.blocks
            .iter_mut()
            .enumerate()
            .filter(|(_, b)| b.dirty)
            .map(|(i, b)| {
                b.dirty = false;
                (i as u64, DentryBlock { dir_ino, entries: b.entries.clone() })
            })
            .collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_touched_blocks_are_rewritten_and_space_is_reused() {
        let mut d = DiskDir::default();
        for i in 0..1000 {
            d.set(format!("name-{i:04}").as_bytes(), Some((i + 2, 8)));
        }
        let first = d.take_dirty(1);
        let n = first.len();
        assert!(n > 2);
        assert_eq!(first.iter().map(|b| b.1.entries.len()).sum::<usize>(), 1000);
        assert!(d.take_dirty(1).is_empty());
        d.set(b"name-0500", None);
        let changed = d.take_dirty(1);
        assert_eq!(changed.len(), 1);
        d.set(b"a-new-one", Some((9999, 8)));
        assert_eq!(d.block_count(), n, "freed space reused, no new block");
        assert_eq!(d.len(), 1000);
        // Each block encodes within its capacity.
        for (_, b) in d.take_dirty(1) {
            b.encode().unwrap();
        }
    }
}
