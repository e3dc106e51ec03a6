//! The oracle: what a workload did, what each acknowledged fsync promised, and the check of a
//! recovered file system against both.
//!
//! Every object — a directory entry `(directory, name)`, a file's state (contents, size, mode,
//! mtime, xattrs), an inode's number of names — has a list of versions, each tagged with the
//! length of the device's write log when the operation that made it started. An operation can
//! only have reached the disk through writes logged after it started, so in a crash image that
//! holds writes below index `U`, an object may show any version made before `U`.
//!
//! An acknowledged fsync (or sync) records promises: "object X is at version v or later". A
//! promise holds in every crash image that contains the fsync's device flush, i.e. whose durable
//! prefix covers the log length at the moment the fsync returned. The allowed states of a
//! promised object are then its promised version and every later version made before `U` (a
//! checkpoint or another fsync may have made later changes durable too).
//!
//! What the promises are (ARCHITECTURE.md, durability contract):
//! - fsync/fdatasync of a file: its state (fdatasync: contents and size only); that it is
//!   reachable; and, when it has exactly one name, that name (contract 1).
//! - fsync of a directory: every name the directory ever held, at its current value (present
//!   or absent); that the directory is reachable; and the other side of every rename into or
//!   out of it (contract 2: a rename is never half durable).
//! - sync and unmount: everything (contract 3).
//!
//! Inodes are identified by number and creation time ([`Id`]), so a reused inode number is not
//! mistaken for the file that held it before.
//!
//! This file keeps the history (what the workload did and what its fsyncs promised); reading a
//! file system back is `recovered`, through the calls of `tree` (a library mount or a directory
//! of a kernel mount), and the check of what was read against the history is `check`. The
//! rules for one object are `rules`: the versions a promised object may show ([`Versions`],
//! the rule `check` applies to every entry, file and name count), and what a file may show when
//! the writes since its last fsync may have landed in any part and order ([`FileModel`]: any
//! mix of their bytes, a size between the smallest and largest since, a mode given since, an
//! mtime from the fsynced one on), as a test that kills the process serving a mount checks it.

mod check;
mod recovered;
mod rules;
mod tree;

pub use check::check;
pub use recovered::{read_file_state, read_state, walk, walk_tree, FileState, Recovered};
pub use rules::{FileModel, Pattern, Versions};
pub use tree::{DirTree, Entry, Stat, Tree, Xattrs};

use lanefs::{Attr, FileKind, Ino};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Arc;

/// An inode's identity: number and creation time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id {
    /// The inode number.
    pub ino: Ino,
    /// Its creation time (seconds, nanoseconds): tells a reused number apart.
    pub crtime: (i64, u32),
}

impl Id {
    /// The identity of the inode `a` describes.
    pub fn of(a: &Attr) -> Id {
        Id { ino: a.ino, crtime: (a.crtime.sec, a.crtime.nsec) }
    }

    /// The identity of the inode a tree's `stat` describes.
    pub fn of_stat(a: &Stat) -> Id {
        Id { ino: a.ino, crtime: a.crtime }
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "inode {}", self.ino)
    }
}

/// One version of an object.
#[derive(Debug, Clone)]
pub struct Ver<T> {
    /// Write-log length when the operation that made it started.
    pub ev: usize,
    /// From the base image: present in every crash state.
    pub base: bool,
    /// The object's value in this version.
    pub val: T,
}

/// A directory entry: (directory, name).
pub type EntryKey = (Id, Vec<u8>);

/// One thing an acknowledged fsync or sync promised.
#[derive(Debug, Clone)]
pub enum Promise {
    /// The entry is at version `ver` or later.
    Entry {
        /// The entry: (directory, name).
        key: EntryKey,
        /// The version it is at least at.
        ver: usize,
    },
    /// The file's state (`datasync`: contents and size only) is at version `ver` or later.
    File {
        /// The file.
        id: Id,
        /// The version it is at least at.
        ver: usize,
        /// Whether only contents and size were promised (fdatasync).
        datasync: bool,
    },
    /// The inode is reachable, unless it lost its last name at version `ver` or later.
    Reach {
        /// The inode.
        id: Id,
        /// The version from which losing its last name excuses it.
        ver: usize,
    },
}

/// A persistence operation that returned success.
#[derive(Debug, Clone)]
pub struct Acked {
    /// Write-log length when it returned: its device flush lies below.
    pub ev_end: usize,
    /// The operation, as text.
    pub op: String,
    /// What it promised.
    pub promises: Vec<Promise>,
}

/// A rename, for the promises of directory fsyncs.
#[derive(Debug, Clone)]
struct RenameRec {
    src: EntryKey,
    src_ver: usize,
    dst: EntryKey,
    dst_ver: usize,
}

/// One executed operation.
#[derive(Debug, Clone)]
pub struct OpRecord {
    /// The thread that ran it.
    pub thread: usize,
    /// Write-log length when it started.
    pub ev_start: usize,
    /// Write-log length when it returned.
    pub ev_end: usize,
    /// The operation, as text.
    pub text: String,
    /// What it returned.
    pub result: Result<(), String>,
}

/// Everything a workload did, as the oracle needs it.
#[derive(Debug, Default, Clone)]
pub struct History {
    /// Every version of every directory entry (`None`: no entry).
    pub entries: HashMap<EntryKey, Vec<Ver<Option<Id>>>>,
    /// Every name a directory ever held.
    dir_names: HashMap<Id, BTreeSet<Vec<u8>>>,
    /// Every version of every file's contents and attributes.
    pub files: HashMap<Id, Vec<Ver<Arc<FileState>>>>,
    /// Number of names of each inode, by version.
    pub links: HashMap<Id, Vec<Ver<u32>>>,
    /// What each inode is.
    pub kinds: HashMap<Id, FileKind>,
    /// Most names an inode ever had at once.
    max_links: HashMap<Id, u32>,
    /// A path each inode had (for messages).
    paths: HashMap<Id, String>,
    renames: Vec<RenameRec>,
    /// Persistence operations that returned success, with their promises.
    pub acked: Vec<Acked>,
    /// Every operation run, in the order they returned.
    pub log: Vec<OpRecord>,
    /// Live namespace: directory -> entries, inode -> names.
    children: HashMap<Id, BTreeMap<Vec<u8>, Id>>,
    names: HashMap<Id, BTreeSet<EntryKey>>,
}

impl History {
    /// The history of a base image: one base version of everything found in `rec`.
    pub fn from_recovered(rec: &Recovered) -> History {
        let mut h = History::default();
        for (id, kind) in &rec.kinds {
            h.kinds.insert(*id, *kind);
        }
        for (path, id) in &rec.paths {
            h.paths.entry(*id).or_insert_with(|| path.clone());
        }
        for (dir, ents) in &rec.entries {
            h.children.insert(*dir, BTreeMap::new());
            for (name, id) in ents {
                let key = (*dir, name.clone());
                h.entries.insert(key.clone(), vec![Ver { ev: 0, base: true, val: Some(*id) }]);
                h.dir_names.entry(*dir).or_default().insert(name.clone());
                h.children.entry(*dir).or_default().insert(name.clone(), *id);
                h.names.entry(*id).or_default().insert(key);
            }
        }
        for (id, names) in &h.names {
            let n = names.len() as u32;
            h.links.insert(*id, vec![Ver { ev: 0, base: true, val: n }]);
            h.max_links.insert(*id, n);
        }
        h.links.insert(rec.root, vec![Ver { ev: 0, base: true, val: 1 }]);
        for (id, st) in &rec.files {
            h.files.insert(*id, vec![Ver { ev: 0, base: true, val: Arc::new(st.clone()) }]);
        }
        h
    }

    /// A path the inode had, for messages.
    pub fn path_of(&self, id: &Id) -> String {
        self.paths.get(id).cloned().unwrap_or_else(|| format!("<{id}>"))
    }

    fn key_path(&self, key: &EntryKey) -> String {
        let d = self.path_of(&key.0);
        let sep = if d.ends_with('/') { "" } else { "/" };
        format!("{d}{sep}{}", String::from_utf8_lossy(&key.1))
    }

    /// The inode named `name` in `dir` now (live model).
    pub fn child(&self, dir: &Id, name: &[u8]) -> Option<Id> {
        self.children.get(dir).and_then(|c| c.get(name)).copied()
    }

    /// Notes a new inode.
    pub fn new_inode(&mut self, id: Id, kind: FileKind) {
        self.kinds.insert(id, kind);
        if kind == FileKind::Dir {
            self.children.entry(id).or_default();
        }
    }

    /// Sets entry `(dir, name)` to `val` by an operation that started at log length `ev`;
    /// returns the index of the new version.
    pub fn set_entry(&mut self, ev: usize, dir: Id, name: &[u8], val: Option<Id>) -> usize {
        self.set_entries(ev, &[(dir, name, val)])[0]
    }

    /// Sets several entries as one operation (a rename): inodes' name counts change once, so
    /// no version shows a renamed inode without a name. Returns the new versions' indices.
    pub fn set_entries(&mut self, ev: usize, changes: &[(Id, &[u8], Option<Id>)]) -> Vec<usize> {
        let mut idx = Vec::with_capacity(changes.len());
        let mut touched: Vec<Id> = Vec::new();
        for &(dir, name, val) in changes {
            let key: EntryKey = (dir, name.to_vec());
            let vs =
                self.entries.entry(key.clone()).or_insert_with(|| vec![Ver { ev: 0, base: true, val: None }]);
            let old = vs.last().and_then(|v| v.val);
            vs.push(Ver { ev, base: false, val });
            idx.push(vs.len() - 1);
            self.dir_names.entry(dir).or_default().insert(name.to_vec());
            let kids = self.children.entry(dir).or_default();
            match val {
                Some(id) => {
                    kids.insert(name.to_vec(), id);
                }
                None => {
                    kids.remove(name);
                }
            }
            if let Some(o) = old.filter(|&o| Some(o) != val) {
                self.names.entry(o).or_default().remove(&key);
                touched.push(o);
            }
            if let Some(n) = val.filter(|&n| Some(n) != old) {
                self.names.entry(n).or_default().insert(key.clone());
                touched.push(n);
                let p = self.key_path(&key);
                self.paths.insert(n, p);
            }
        }
        touched.sort();
        touched.dedup();
        for id in touched {
            self.push_links(ev, id);
        }
        idx
    }

    fn push_links(&mut self, ev: usize, id: Id) {
        let n = self.names.get(&id).map_or(0, |s| s.len()) as u32;
        self.links.entry(id).or_default().push(Ver { ev, base: false, val: n });
        let m = self.max_links.entry(id).or_insert(0);
        *m = (*m).max(n);
    }

    /// Records a new state of a non-directory (if it changed).
    pub fn set_file(&mut self, ev: usize, id: Id, st: FileState) {
        let vs = self.files.entry(id).or_default();
        if vs.last().is_some_and(|v| *v.val == st) {
            return;
        }
        vs.push(Ver { ev, base: false, val: Arc::new(st) });
    }

    /// Records a rename (after both entries were set).
    pub fn note_rename(&mut self, src: EntryKey, src_ver: usize, dst: EntryKey, dst_ver: usize) {
        self.renames.push(RenameRec { src, src_ver, dst, dst_ver });
    }

    fn latest<T>(vs: Option<&Vec<Ver<T>>>) -> usize {
        vs.map_or(0, |v| v.len().saturating_sub(1))
    }

    /// What an fsync of `id` promises, taken when the fsync starts.
    pub fn promise_fsync(&self, id: Id, datasync: bool) -> Vec<Promise> {
        let mut out = vec![Promise::Reach { id, ver: Self::latest(self.links.get(&id)) }];
        if self.kinds.get(&id) == Some(&FileKind::Dir) {
            for name in self.dir_names.get(&id).into_iter().flatten() {
                let key = (id, name.clone());
                out.push(Promise::Entry { ver: Self::latest(self.entries.get(&key)), key });
            }
            for r in &self.renames {
                if r.src.0 == id {
                    out.push(Promise::Entry { key: r.dst.clone(), ver: r.dst_ver });
                }
                if r.dst.0 == id {
                    out.push(Promise::Entry { key: r.src.clone(), ver: r.src_ver });
                }
            }
        } else {
            out.push(Promise::File { id, ver: Self::latest(self.files.get(&id)), datasync });
            if let Some(names) = self.names.get(&id) {
                if names.len() == 1 {
                    let key = names.iter().next().expect("one name").clone();
                    out.push(Promise::Entry { ver: Self::latest(self.entries.get(&key)), key });
                }
            }
        }
        out
    }

    /// What sync (or unmount) promises: everything as it is now.
    pub fn promise_all(&self) -> Vec<Promise> {
        let mut out = Vec::new();
        for (key, vs) in &self.entries {
            out.push(Promise::Entry { key: key.clone(), ver: vs.len() - 1 });
        }
        for (id, vs) in &self.files {
            out.push(Promise::File { id: *id, ver: vs.len() - 1, datasync: false });
        }
        for (id, vs) in &self.links {
            out.push(Promise::Reach { id: *id, ver: vs.len() - 1 });
        }
        out
    }

    /// Every recorded version of every file (for replays).
    pub fn file_listing(&self) -> String {
        let mut ids: Vec<&Id> = self.files.keys().collect();
        ids.sort_by_key(|id| (self.path_of(id), **id));
        let mut s = String::new();
        for id in ids {
            s.push_str(&format!("  {} ({id}):\n", self.path_of(id)));
            for (i, v) in self.files[id].iter().enumerate() {
                s.push_str(&format!(
                    "    v{i} log {}{}: {}\n",
                    v.ev,
                    if v.base { " (base)" } else { "" },
                    v.val.describe()
                ));
            }
        }
        s
    }

    /// The operations as a numbered listing (for reports).
    pub fn listing(&self) -> String {
        let mut s = String::new();
        for (i, r) in self.log.iter().enumerate() {
            let res = match &r.result {
                Ok(()) => String::new(),
                Err(e) => format!("  -> error: {e}"),
            };
            s.push_str(&format!(
                "  #{i:<3} t{} log {}..{}  {}{res}\n",
                r.thread, r.ev_start, r.ev_end, r.text
            ));
        }
        s
    }
}
