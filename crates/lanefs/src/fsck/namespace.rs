//! Phases 6 and 7 of the check: the namespace. The directory tree is reachable from the root,
//! directories have one name and the right parent, entries point at inodes of the type they
//! claim, link counts are exact, and every unreachable inode is an orphan.

use super::{Fsck, NodeInfo};
use crate::checkpoint::read_blocks;
use crate::device::BLOCK_SIZE;
use crate::error::{Result, Structure};
use crate::format::dentry::{dtype_of, DentryBlock};
use crate::format::layout::{Geometry, ROOT_INO};
use crate::format::node::{NEW_ADDR, S_IFMT};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// What the walk of the tree counted: names per inode and subdirectories per directory.
#[derive(Default)]
struct Counts {
    refs: HashMap<u32, u32>,
    subdirs: HashMap<u32, u32>,
}

impl Fsck<'_> {
    /// 6-7. The directory tree from the root, names and parents, entry types, link counts,
    /// and orphans.
    pub(super) fn check_namespace(
        &mut self,
        g: &Geometry,
        nodes: &BTreeMap<u32, NodeInfo>,
        dir_blocks: &HashMap<u32, Vec<u32>>,
        orphans: &[u32],
    ) -> Result<()> {
        let is_dir = |ino: u32| {
            nodes.get(&ino).and_then(|n| n.inode.as_ref()).is_some_and(|i| i.mode & S_IFMT == 0o040000)
        };
        if !is_dir(ROOT_INO) {
            self.problem(Structure::Node, "the root inode is missing or not a directory", false);
            return Ok(());
        }
        let counts = self.walk_names(g, nodes, dir_blocks)?;
        self.check_links(nodes, &counts, orphans);
        Ok(())
    }

    /// Phase 6, breadth-first from the root: every directory's entries are unique, point at inodes
    /// of the type they claim, and each subdirectory has this one name and names it its
    /// parent. Bounded: a directory is queued once (`seen`), so at most once per inode.
    fn walk_names(
        &mut self,
        g: &Geometry,
        nodes: &BTreeMap<u32, NodeInfo>,
        dir_blocks: &HashMap<u32, Vec<u32>>,
    ) -> Result<Counts> {
        let mut counts = Counts::default();
        let mut seen: HashSet<u32> = HashSet::from([ROOT_INO]);
        let mut queue: VecDeque<u32> = VecDeque::from([ROOT_INO]);
        let mut dirs = 0u64;
        while let Some(dir) = queue.pop_front() {
            dirs += 1;
            if dirs.is_multiple_of(256) {
                (self.progress)("directories", dirs, seen.len() as u64);
            }
            let blocks = dir_blocks.get(&dir).cloned().unwrap_or_default();
            if blocks.contains(&NEW_ADDR) {
                self.problem(Structure::Dentry, format!("directory {dir} has an unwritten block"), false);
                continue;
            }
            let bufs = read_blocks(self.dev, &blocks.iter().map(|&a| a as u64).collect::<Vec<_>>())?;
            let mut names: HashSet<Vec<u8>> = HashSet::new();
            for (&addr, b) in blocks.iter().zip(bufs.chunks(BLOCK_SIZE)) {
                let db = match DentryBlock::decode(b, dir, g.max_nid, Some(addr as u64)) {
                    Ok(d) => d,
                    Err(e) => {
                        self.problem(Structure::Dentry, format!("directory {dir}: {e}"), false);
                        continue;
                    }
                };
                for d in db.entries {
                    if !names.insert(d.name.clone()) {
                        let shown = String::from_utf8_lossy(&d.name);
                        self.problem(
                            Structure::Dentry,
                            format!("directory {dir} holds '{shown}' twice"),
                            false,
                        );
                        continue;
                    }
                    if !self.check_entry(nodes, dir, &d, &mut counts) {
                        continue;
                    }
                    if seen.insert(d.ino) {
                        queue.push_back(d.ino);
                    } else {
                        self.problem(
                            Structure::Dentry,
                            format!("directory {} has more than one name (loop or hard link)", d.ino),
                            false,
                        );
                    }
                }
            }
        }
        debug_assert!(dirs as usize <= nodes.len().max(1));
        self.report.stats.directories = dirs;
        Ok(counts)
    }

    /// One entry `d` of directory `dir`: its inode exists with the type it claims; a
    /// subdirectory names `dir` as its parent. Counts the name. Returns whether `d` names a
    /// directory (which the caller queues once).
    fn check_entry(
        &mut self,
        nodes: &BTreeMap<u32, NodeInfo>,
        dir: u32,
        d: &crate::format::Dentry,
        counts: &mut Counts,
    ) -> bool {
        let shown = String::from_utf8_lossy(&d.name);
        let Some(child) = nodes.get(&d.ino).and_then(|n| n.inode.as_ref()) else {
            self.problem(
                Structure::Dentry,
                format!("'{shown}' in directory {dir} points to inode {}, which does not exist", d.ino),
                false,
            );
            return false;
        };
        if dtype_of(child.mode) != d.file_type {
            self.problem(
                Structure::Dentry,
                format!(
                    "'{shown}' in directory {dir} has type {} but inode {} is mode {:o}",
                    d.file_type, d.ino, child.mode
                ),
                false,
            );
        }
        *counts.refs.entry(d.ino).or_default() += 1;
        if child.mode & S_IFMT != 0o040000 {
            return false;
        }
        *counts.subdirs.entry(dir).or_default() += 1;
        if child.parent != dir {
            self.problem(
                Structure::Node,
                format!("directory {} is in directory {dir} but names {} as its parent", d.ino, child.parent),
                false,
            );
        }
        true
    }

    /// Phase 7: link counts against the names the walk found, and orphans: an inode no name reaches
    /// is on the orphan list with no names and nlink 0, and the list names only inodes.
    fn check_links(&mut self, nodes: &BTreeMap<u32, NodeInfo>, counts: &Counts, orphans: &[u32]) {
        let orphan_set: HashSet<u32> = orphans.iter().copied().collect();
        for (&ino, n) in nodes {
            let Some(i) = &n.inode else { continue };
            let is_dir = i.mode & S_IFMT == 0o040000;
            let names = counts.refs.get(&ino).copied().unwrap_or(0) + u32::from(ino == ROOT_INO);
            if orphan_set.contains(&ino) {
                if names != 0 || i.nlink != 0 {
                    self.problem(
                        Structure::Checkpoint,
                        format!("orphan inode {ino} still has {names} names and nlink {}", i.nlink),
                        false,
                    );
                }
                continue;
            }
            if names == 0 {
                self.problem(
                    Structure::Node,
                    format!("inode {ino} is not reachable from the root and is not an orphan"),
                    false,
                );
                continue;
            }
            let want = if is_dir { 2 + counts.subdirs.get(&ino).copied().unwrap_or(0) } else { names };
            if i.nlink != want {
                self.problem(
                    Structure::Node,
                    format!("inode {ino} has link count {}, the tree gives {want}", i.nlink),
                    false,
                );
            }
        }
        for &o in orphans {
            if nodes.get(&o).and_then(|n| n.inode.as_ref()).is_none() {
                self.problem(
                    Structure::Checkpoint,
                    format!("orphan list names inode {o}, which does not exist"),
                    false,
                );
            }
        }
    }
}
