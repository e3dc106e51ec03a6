//! A file system read back through a [`Tree`], as the oracle compares it: every reachable
//! directory's entries, every reachable file's state, and a path to each.
//!
//! The walk must finish on any image, corrupt ones included: it is bounded in inodes, depth and
//! bytes read per file, and records what fails or looks impossible as a problem instead of
//! stopping, so a crash state always yields something to check.

use lanefs::{Attr, FileKind, Fs};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use super::tree::{Entry, Stat, Tree};
use super::Id;

/// Contents and attributes of a non-directory, as a reader sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    /// What the inode is.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Hash of the contents (the first `size` bytes).
    pub hash: u64,
    /// The contents when small (for messages), else empty.
    pub small: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, u32),
    /// Sorted (name, value) pairs.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Contents up to this size are kept for messages.
const SMALL: u64 = 64 << 10;
/// Files larger than this are not read whole (a corrupt size must not make the checker allocate
/// without bound); their hash covers a prefix and a marker.
const READ_CAP: u64 = 64 << 20;

impl FileState {
    pub(super) fn same_data(&self, o: &FileState) -> bool {
        self.size == o.size && self.hash == o.hash
    }
    pub(super) fn same_meta(&self, o: &FileState) -> bool {
        self.mode == o.mode && self.mtime == o.mtime && self.xattrs == o.xattrs && self.kind == o.kind
    }
    pub(super) fn describe(&self) -> String {
        format!(
            "{} bytes (hash {:016x}), mode {:o}, mtime {}.{:09}, {} xattrs",
            self.size,
            self.hash,
            self.mode,
            self.mtime.0,
            self.mtime.1,
            self.xattrs.len()
        )
    }
    /// The attributes in which `o` differs from `self`.
    pub(super) fn meta_diff(&self, o: &FileState) -> String {
        let mut d = Vec::new();
        if self.mode != o.mode {
            d.push(format!("mode {:o} not {:o}", o.mode, self.mode));
        }
        if self.mtime != o.mtime {
            d.push(format!("mtime {}.{:09} not {}.{:09}", o.mtime.0, o.mtime.1, self.mtime.0, self.mtime.1));
        }
        if self.xattrs != o.xattrs {
            let names = |x: &[(Vec<u8>, Vec<u8>)]| {
                x.iter()
                    .map(|(n, v)| format!("{}={}B", String::from_utf8_lossy(n), v.len()))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            d.push(format!("xattrs [{}] not [{}]", names(&o.xattrs), names(&self.xattrs)));
        }
        if self.kind != o.kind {
            d.push(format!("type {:?} not {:?}", o.kind, self.kind));
        }
        d.join(", ")
    }

    /// First byte offset where two small contents differ, if both are known.
    pub(super) fn first_difference(&self, o: &FileState) -> Option<usize> {
        if self.small.len() as u64 != self.size || o.small.len() as u64 != o.size {
            return None;
        }
        let n = self.small.len().min(o.small.len());
        (0..n).find(|&i| self.small[i] != o.small[i]).or(if self.small.len() != o.small.len() {
            Some(n)
        } else {
            None
        })
    }
}

/// Reads the state of a non-directory through the library. Errors are returned as text.
pub fn read_file_state(fs: &Fs, a: &Attr) -> Result<FileState, String> {
    read_state(fs, &a.ino, &Stat::of(a))
}

/// Reads the state of the non-directory `node` of `tree`, whose attributes are `a`.
pub fn read_state<T: Tree + ?Sized>(tree: &T, node: &T::Node, a: &Stat) -> Result<FileState, String> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut small = Vec::new();
    if a.kind == FileKind::File {
        let want = a.size.min(READ_CAP);
        let mut buf = vec![0u8; 256 << 10];
        let mut off = 0u64;
        // Bounded: each round advances by at least one byte or stops.
        while off < want {
            let n = (want - off).min(buf.len() as u64) as usize;
            let got = tree
                .read(node, off, &mut buf[..n])
                .map_err(|e| format!("read inode {} at {off}: {e}", a.ino))?;
            if got == 0 {
                return Err(format!("read inode {} at {off}: end of file before its size {}", a.ino, a.size));
            }
            buf[..got].hash(&mut hasher);
            if a.size <= SMALL {
                small.extend_from_slice(&buf[..got]);
            }
            off += got as u64;
        }
        if a.size > READ_CAP {
            "capped".hash(&mut hasher);
        }
    } else if a.kind == FileKind::Symlink {
        let t = tree.readlink(node).map_err(|e| format!("readlink inode {}: {e}", a.ino))?;
        t.hash(&mut hasher);
        small = t;
    }
    let xattrs = tree.xattrs(node, 4096).map_err(|e| format!("inode {}: {e}", a.ino))?;
    Ok(FileState {
        kind: a.kind,
        size: a.size,
        hash: hasher.finish(),
        small,
        mode: a.mode & 0o7777,
        mtime: a.mtime,
        xattrs,
    })
}

/// A file system as read back through the API after recovery.
#[derive(Debug, Default, Clone)]
pub struct Recovered {
    /// The root directory.
    pub root: Id,
    /// Reachable directories and their entries.
    pub entries: HashMap<Id, BTreeMap<Vec<u8>, Id>>,
    /// Reachable non-directories.
    pub files: HashMap<Id, FileState>,
    /// What each reachable inode is.
    pub kinds: HashMap<Id, FileKind>,
    /// Number of names of each reachable inode, as the walk found them.
    pub name_count: HashMap<Id, u32>,
    /// The link count each reachable inode's stat reports.
    pub nlink: HashMap<Id, u64>,
    /// A path of each reachable inode.
    pub paths: Vec<(String, Id)>,
    /// Calls that failed or found something impossible.
    pub problems: Vec<String>,
}

/// Limits that keep a walk of a corrupt image bounded.
const MAX_INODES: usize = 200_000;
const MAX_DEPTH: usize = 64;

/// Reads the whole tree of a library mount through `readdir`, `getattr`, `read_at`, `readlink`
/// and the xattr calls. Every failure is a problem in the result, never a panic of the walker.
pub fn walk(fs: &Fs) -> Recovered {
    walk_tree(fs)
}

/// Reads the whole of `tree` (a library mount, a directory of a kernel mount). Every failure is a
/// problem in the result, never a panic of the walker.
pub fn walk_tree<T: Tree + ?Sized>(tree: &T) -> Recovered {
    let mut rec = Recovered::default();
    let top = tree.root();
    let root = match tree.stat(&top) {
        Ok(a) => a,
        Err(e) => {
            rec.problems.push(format!("getattr of the root: {e}"));
            return rec;
        }
    };
    if root.kind != FileKind::Dir {
        rec.problems.push("the root is not a directory".into());
        return rec;
    }
    rec.root = Id::of_stat(&root);
    rec.kinds.insert(rec.root, FileKind::Dir);
    rec.paths.push(("/".into(), rec.root));
    // Depth-first with an explicit stack; every directory is listed once.
    let mut w =
        Walker { tree, stack: vec![(rec.root, top, "/".into(), 0)], visited_dirs: BTreeSet::new(), rec };
    w.visited_dirs.insert(w.rec.root);
    while let Some((dir, node, path, depth)) = w.stack.pop() {
        let Some(ents) = w.list_dir(&node, &path, depth) else { break };
        w.rec.entries.insert(dir, ents);
    }
    w.rec
}

/// A walk in progress: what it found, the directories still to list (with their node, path and
/// depth), and those reached so far.
struct Walker<'a, T: Tree + ?Sized> {
    tree: &'a T,
    rec: Recovered,
    stack: Vec<(Id, T::Node, String, usize)>,
    visited_dirs: BTreeSet<Id>,
}

impl<T: Tree + ?Sized> Walker<'_, T> {
    /// The entries of directory `dir` (at `path`, `depth` below the root); `None` when the walk
    /// must stop (more inodes than it allows).
    fn list_dir(&mut self, dir: &T::Node, path: &str, depth: usize) -> Option<BTreeMap<Vec<u8>, Id>> {
        let mut ents = BTreeMap::new();
        let mut listed = Vec::new();
        if let Err(e) = self.tree.list(dir, &mut listed) {
            self.rec.problems.push(format!("readdir {path}: {e}"));
        }
        for e in listed {
            self.visit(e, path, depth, &mut ents)?;
        }
        Some(ents)
    }

    /// Entry `e` of the directory at `path`: its name goes to `ents`, a directory to the stack,
    /// a file's state to the result. `None` when the walk must stop.
    fn visit(
        &mut self,
        e: Entry<T::Node>,
        path: &str,
        depth: usize,
        ents: &mut BTreeMap<Vec<u8>, Id>,
    ) -> Option<()> {
        let rec = &mut self.rec;
        let sep = if path.ends_with('/') { "" } else { "/" };
        let child_path = format!("{path}{sep}{}", String::from_utf8_lossy(&e.name));
        let a = match self.tree.stat(&e.node) {
            Ok(a) => a,
            Err(err) => {
                rec.problems.push(format!("getattr {child_path}: {err}"));
                return Some(());
            }
        };
        if a.kind != e.kind {
            rec.problems.push(format!("{child_path}: readdir says {:?}, getattr says {:?}", e.kind, a.kind));
        }
        let id = Id::of_stat(&a);
        if ents.insert(e.name.clone(), id).is_some() {
            rec.problems.push(format!("{child_path}: listed twice"));
        }
        *rec.name_count.entry(id).or_insert(0) += 1;
        if rec.kinds.len() >= MAX_INODES {
            rec.problems.push("more inodes than the walk allows".into());
            return None;
        }
        rec.kinds.insert(id, a.kind);
        rec.paths.push((child_path.clone(), id));
        rec.nlink.insert(id, a.nlink);
        if a.kind == FileKind::Dir {
            if !self.visited_dirs.insert(id) {
                rec.problems.push(format!("{child_path}: directory reached twice (loop or second name)"));
            } else if depth + 1 > MAX_DEPTH {
                rec.problems.push(format!("{child_path}: deeper than {MAX_DEPTH}"));
            } else {
                self.stack.push((id, e.node, child_path, depth + 1));
            }
        } else if let std::collections::hash_map::Entry::Vacant(slot) = rec.files.entry(id) {
            match read_state(self.tree, &e.node, &a) {
                Ok(st) => {
                    slot.insert(st);
                }
                Err(err) => rec.problems.push(format!("{child_path}: {err}")),
            }
        }
        Some(())
    }
}
