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

use crate::fs::{Attr, DirEntry, FileKind, Fs, Ino, ROOT};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// An inode's identity: number and creation time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id {
    pub ino: Ino,
    pub crtime: (i64, u32),
}

impl Id {
    pub fn of(a: &Attr) -> Id {
        Id { ino: a.ino, crtime: (a.crtime.sec, a.crtime.nsec) }
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "inode {}", self.ino)
    }
}

/// Contents and attributes of a non-directory, as a reader sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    pub kind: FileKind,
    pub size: u64,
    /// Hash of the contents (the first `size` bytes).
    pub hash: u64,
    /// The contents when small (for messages), else empty.
    pub small: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
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
    fn same_data(&self, o: &FileState) -> bool {
        self.size == o.size && self.hash == o.hash
    }
    fn same_meta(&self, o: &FileState) -> bool {
        self.mode == o.mode && self.mtime == o.mtime && self.xattrs == o.xattrs && self.kind == o.kind
    }
    fn describe(&self) -> String {
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
    fn meta_diff(&self, o: &FileState) -> String {
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
    fn first_difference(&self, o: &FileState) -> Option<usize> {
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

/// Reads the state of a non-directory through the API. Errors are returned as text.
pub fn read_file_state(fs: &Fs, a: &Attr) -> Result<FileState, String> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut small = Vec::new();
    if a.kind == FileKind::File {
        let want = a.size.min(READ_CAP);
        let mut buf = vec![0u8; 256 << 10];
        let mut off = 0u64;
        // Bounded: each round advances by at least one byte or stops.
        while off < want {
            let n = (want - off).min(buf.len() as u64) as usize;
            let got = fs
                .read_at(a.ino, off, &mut buf[..n])
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
        let t = fs.readlink(a.ino).map_err(|e| format!("readlink inode {}: {e}", a.ino))?;
        t.hash(&mut hasher);
        small = t;
    }
    let mut xattrs = Vec::new();
    let names = fs.listxattr(a.ino).map_err(|e| format!("listxattr inode {}: {e}", a.ino))?;
    for n in names.into_iter().take(4096) {
        let v = fs.getxattr(a.ino, &n).map_err(|e| format!("getxattr inode {}: {e}", a.ino))?;
        xattrs.push((n, v));
    }
    xattrs.sort();
    Ok(FileState {
        kind: a.kind,
        size: a.size,
        hash: hasher.finish(),
        small,
        mode: a.mode & 0o7777,
        mtime: (a.mtime.sec, a.mtime.nsec),
        xattrs,
    })
}

/// One version of an object.
#[derive(Debug, Clone)]
pub struct Ver<T> {
    /// Write-log length when the operation that made it started.
    pub ev: usize,
    /// From the base image: present in every crash state.
    pub base: bool,
    pub val: T,
}

/// A directory entry: (directory, name).
pub type EntryKey = (Id, Vec<u8>);

/// One thing an acknowledged fsync or sync promised.
#[derive(Debug, Clone)]
pub enum Promise {
    /// The entry is at version `ver` or later.
    Entry { key: EntryKey, ver: usize },
    /// The file's state (`datasync`: contents and size only) is at version `ver` or later.
    File { id: Id, ver: usize, datasync: bool },
    /// The inode is reachable, unless it lost its last name at version `ver` or later.
    Reach { id: Id, ver: usize },
}

/// A persistence operation that returned success.
#[derive(Debug, Clone)]
pub struct Acked {
    /// Write-log length when it returned: its device flush lies below.
    pub ev_end: usize,
    pub op: String,
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
    pub thread: usize,
    pub ev_start: usize,
    pub ev_end: usize,
    pub text: String,
    pub result: Result<(), String>,
}

/// Everything a workload did, as the oracle needs it.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub entries: HashMap<EntryKey, Vec<Ver<Option<Id>>>>,
    /// Every name a directory ever held.
    dir_names: HashMap<Id, BTreeSet<Vec<u8>>>,
    pub files: HashMap<Id, Vec<Ver<Arc<FileState>>>>,
    /// Number of names of each inode, by version.
    pub links: HashMap<Id, Vec<Ver<u32>>>,
    pub kinds: HashMap<Id, FileKind>,
    /// Most names an inode ever had at once.
    max_links: HashMap<Id, u32>,
    /// A path each inode had (for messages).
    paths: HashMap<Id, String>,
    renames: Vec<RenameRec>,
    pub acked: Vec<Acked>,
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

/// A file system as read back through the API after recovery.
#[derive(Debug, Default, Clone)]
pub struct Recovered {
    pub root: Id,
    /// Reachable directories and their entries.
    pub entries: HashMap<Id, BTreeMap<Vec<u8>, Id>>,
    /// Reachable non-directories.
    pub files: HashMap<Id, FileState>,
    pub kinds: HashMap<Id, FileKind>,
    /// Number of names of each reachable inode.
    pub name_count: HashMap<Id, u32>,
    /// A path of each reachable inode.
    pub paths: Vec<(String, Id)>,
    /// Calls that failed or found something impossible.
    pub problems: Vec<String>,
}

/// Limits that keep a walk of a corrupt image bounded.
const MAX_INODES: usize = 200_000;
const MAX_DEPTH: usize = 64;

/// Reads the whole tree through `readdir`, `getattr`, `read_at`, `readlink` and the xattr calls.
/// Every failure is a problem in the result, never a panic of the walker.
pub fn walk(fs: &Fs) -> Recovered {
    let mut rec = Recovered::default();
    let root = match fs.getattr(ROOT) {
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
    rec.root = Id::of(&root);
    rec.kinds.insert(rec.root, FileKind::Dir);
    rec.paths.push(("/".into(), rec.root));
    // Depth-first with an explicit stack; every directory is listed once.
    let mut w = Walker { fs, stack: vec![(rec.root, "/".into(), 0)], visited_dirs: BTreeSet::new(), rec };
    w.visited_dirs.insert(w.rec.root);
    while let Some((dir, path, depth)) = w.stack.pop() {
        let Some(ents) = w.list_dir(dir, &path, depth) else { break };
        w.rec.entries.insert(dir, ents);
    }
    w.rec
}

/// A walk in progress: what it found, the directories still to list (with their path and
/// depth), and those reached so far.
struct Walker<'a> {
    fs: &'a Fs,
    rec: Recovered,
    stack: Vec<(Id, String, usize)>,
    visited_dirs: BTreeSet<Id>,
}

impl Walker<'_> {
    /// The entries of directory `dir` (at `path`, `depth` below the root), read page by page;
    /// `None` when the walk must stop (more inodes than it allows).
    fn list_dir(&mut self, dir: Id, path: &str, depth: usize) -> Option<BTreeMap<Vec<u8>, Id>> {
        let mut ents = BTreeMap::new();
        let mut cookie = 0u64;
        let mut rounds = 0usize;
        loop {
            rounds += 1;
            if rounds > MAX_INODES {
                self.rec.problems.push(format!("readdir {path}: does not end"));
                break;
            }
            let page = match self.fs.readdir(dir.ino, cookie, 64) {
                Ok(p) => p,
                Err(e) => {
                    self.rec.problems.push(format!("readdir {path}: {e}"));
                    break;
                }
            };
            if page.is_empty() {
                break;
            }
            let mut advanced = false;
            for e in page {
                if e.cookie > cookie {
                    advanced = true;
                    cookie = e.cookie;
                }
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                self.visit(&e, path, depth, &mut ents)?;
            }
            if !advanced {
                self.rec.problems.push(format!("readdir {path}: cookie does not advance"));
                break;
            }
        }
        Some(ents)
    }

    /// Entry `e` of the directory at `path`: its name goes to `ents`, a directory to the stack,
    /// a file's state to the result. `None` when the walk must stop.
    fn visit(
        &mut self,
        e: &DirEntry,
        path: &str,
        depth: usize,
        ents: &mut BTreeMap<Vec<u8>, Id>,
    ) -> Option<()> {
        let rec = &mut self.rec;
        let sep = if path.ends_with('/') { "" } else { "/" };
        let child_path = format!("{path}{sep}{}", String::from_utf8_lossy(&e.name));
        let a = match self.fs.getattr(e.ino) {
            Ok(a) => a,
            Err(err) => {
                rec.problems.push(format!("getattr {child_path} (inode {}): {err}", e.ino));
                return Some(());
            }
        };
        if a.kind != e.kind {
            rec.problems.push(format!("{child_path}: readdir says {:?}, getattr says {:?}", e.kind, a.kind));
        }
        let id = Id::of(&a);
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
        if a.kind == FileKind::Dir {
            if !self.visited_dirs.insert(id) {
                rec.problems.push(format!("{child_path}: directory reached twice (loop or second name)"));
            } else if depth + 1 > MAX_DEPTH {
                rec.problems.push(format!("{child_path}: deeper than {MAX_DEPTH}"));
            } else {
                self.stack.push((id, child_path, depth + 1));
            }
        } else if let std::collections::hash_map::Entry::Vacant(slot) = rec.files.entry(id) {
            match read_file_state(self.fs, &a) {
                Ok(st) => {
                    slot.insert(st);
                }
                Err(err) => rec.problems.push(format!("{child_path}: {err}")),
            }
        }
        Some(())
    }
}

/// Which versions of `vs` a crash image may show, given a promise of version `p` (0: none)
/// and the writes below `upper`.
fn allowed<T>(vs: &[Ver<T>], p: usize, upper: usize) -> impl Iterator<Item = usize> + '_ {
    let p = p.min(vs.len().saturating_sub(1));
    (p..vs.len()).filter(move |&i| i == p || vs[i].base || vs[i].ev < upper)
}

/// The newest active promise per object, with the operation that made it.
#[derive(Default)]
struct Active<'a> {
    entries: HashMap<&'a EntryKey, (usize, &'a str)>,
    full: HashMap<Id, (usize, &'a str)>,
    data: HashMap<Id, (usize, &'a str)>,
    reach: HashMap<Id, (usize, &'a str)>,
}

fn raise<'a, K: std::hash::Hash + Eq>(m: &mut HashMap<K, (usize, &'a str)>, k: K, ver: usize, op: &'a str) {
    let e = m.entry(k).or_insert((ver, op));
    if ver > e.0 {
        *e = (ver, op);
    }
}

fn show_id(h: &History, v: Option<Id>) -> String {
    match v {
        None => "absent".into(),
        Some(id) => format!("{id} ({:?})", h.kinds.get(&id).copied().unwrap_or(FileKind::File)),
    }
}

/// Checks a recovered file system. `durable`: length of the log prefix that is durable in the
/// crash image (promises acknowledged within it must hold); `upper`: one past the last log
/// entry the image may contain.
pub fn check(h: &History, rec: &Recovered, durable: usize, upper: usize) -> Vec<String> {
    let mut out: Vec<String> = rec.problems.clone();
    let act = Active::of(h, durable);
    check_entries(h, rec, &act, upper, &mut out);
    check_renames(h, rec, &act, upper, &mut out);
    check_files(h, rec, &act, upper, &mut out);
    check_reach(h, rec, &act, upper, &mut out);
    check_single_names(h, rec, &mut out);
    out
}

impl<'a> Active<'a> {
    /// The promises of the operations acknowledged within the durable prefix `durable`.
    fn of(h: &'a History, durable: usize) -> Active<'a> {
        let mut act = Active::default();
        for a in h.acked.iter().filter(|a| a.ev_end <= durable) {
            for p in &a.promises {
                match p {
                    Promise::Entry { key, ver } => raise(&mut act.entries, key, *ver, &a.op),
                    Promise::File { id, ver, datasync: false } => raise(&mut act.full, *id, *ver, &a.op),
                    Promise::File { id, ver, datasync: true } => raise(&mut act.data, *id, *ver, &a.op),
                    Promise::Reach { id, ver } => raise(&mut act.reach, *id, *ver, &a.op),
                }
            }
        }
        act
    }
}

/// Entries of every reachable directory: each was created, and shows a version allowed.
fn check_entries(h: &History, rec: &Recovered, act: &Active, upper: usize, out: &mut Vec<String>) {
    for (dir, ents) in &rec.entries {
        for (name, id) in ents {
            if !h.entries.contains_key(&(*dir, name.clone())) {
                out.push(format!(
                    "{}: {} exists but was never created",
                    h.key_path(&(*dir, name.clone())),
                    show_id(h, Some(*id))
                ));
            }
        }
    }
    for (key, vs) in &h.entries {
        let Some(ents) = rec.entries.get(&key.0) else { continue };
        let got = ents.get(&key.1).copied();
        let (p, op) = act.entries.get(key).copied().unwrap_or((0, ""));
        if allowed(vs, p, upper).any(|i| vs[i].val == got) {
            continue;
        }
        let want: Vec<String> = allowed(vs, p, upper).map(|i| show_id(h, vs[i].val)).collect();
        let why = if op.is_empty() {
            "never existed before the crash".to_string()
        } else {
            format!("`{op}` promised version {p}")
        };
        out.push(format!(
            "entry {}: found {}, allowed {} ({why})",
            h.key_path(key),
            show_id(h, got),
            want.join(" | ")
        ));
    }
}

/// A rename (and the whiteout or exchanged inode it leaves at the source) is all or nothing:
/// its two entries show it done at both or at neither. Each entry's value may fit several
/// versions (a name can go back to an earlier inode), so only a state that no choice of
/// versions explains is reported.
fn check_renames(h: &History, rec: &Recovered, act: &Active, upper: usize, out: &mut Vec<String>) {
    for r in &h.renames {
        let (Some(sents), Some(dents)) = (rec.entries.get(&r.src.0), rec.entries.get(&r.dst.0)) else {
            continue;
        };
        let (Some(svs), Some(dvs)) = (h.entries.get(&r.src), h.entries.get(&r.dst)) else { continue };
        let (gs, gd) = (sents.get(&r.src.1).copied(), dents.get(&r.dst.1).copied());
        let fits = |vs: &[Ver<Option<Id>>], key: &EntryKey, got: Option<Id>| -> Vec<usize> {
            let p = act.entries.get(key).map_or(0, |x| x.0);
            allowed(vs, p, upper).filter(|&i| vs[i].val == got).collect()
        };
        let (is, id) = (fits(svs, &r.src, gs), fits(dvs, &r.dst, gd));
        if is.is_empty() || id.is_empty() {
            // Already reported as an entry no version allows.
            continue;
        }
        let done = |i: usize, at: usize| i >= at;
        let whole = is.iter().any(|&i| id.iter().any(|&j| done(i, r.src_ver) == done(j, r.dst_ver)));
        if !whole {
            out.push(format!(
                "rename {} -> {} is half done: the source shows {}, the destination {}",
                h.key_path(&r.src),
                h.key_path(&r.dst),
                show_id(h, gs),
                show_id(h, gd)
            ));
        }
    }
}

/// Contents and attributes of every reachable non-directory.
fn check_files(h: &History, rec: &Recovered, act: &Active, upper: usize, out: &mut Vec<String>) {
    for (id, got) in &rec.files {
        let Some(vs) = h.files.get(id) else {
            if h.kinds.contains_key(id) {
                out.push(format!("{}: {id} has contents but was never written as a file", h.path_of(id)));
            } else {
                out.push(format!("{id}: reachable but never created"));
            }
            continue;
        };
        let (pf, opf) = act.full.get(id).copied().unwrap_or((0, ""));
        let (pd, opd) = act.data.get(id).copied().unwrap_or((0, ""));
        let pmax = pf.max(pd);
        let data_ok: Vec<usize> = allowed(vs, pmax, upper).filter(|&i| vs[i].val.same_data(got)).collect();
        if data_ok.is_empty() {
            let op = if pd > pf { opd } else { opf };
            let why =
                if op.is_empty() { String::new() } else { format!(" (`{op}` promised version {pmax})") };
            let expect = &vs[pmax.min(vs.len() - 1)].val;
            let diff = expect
                .first_difference(got)
                .map(|o| format!(", first difference at byte {o}"))
                .unwrap_or_default();
            out.push(format!(
                "{}: contents {} match no allowed version{why}; expected e.g. {}{diff}",
                h.path_of(id),
                got.describe(),
                expect.describe()
            ));
            continue;
        }
        let meta_ok =
            allowed(vs, pf, upper).any(|i| vs[i].val.same_meta(got) && (data_ok.contains(&i) || pd > pf));
        if !meta_ok {
            let why =
                if opf.is_empty() { String::new() } else { format!(" (`{opf}` promised version {pf})") };
            let expect = &vs[*data_ok.last().expect("non-empty")].val;
            out.push(format!(
                "{}: attributes match no allowed version with these contents{why}: {}",
                h.path_of(id),
                expect.meta_diff(got)
            ));
        }
    }
}

/// Promised inodes are reachable (unless they lost every name since).
fn check_reach(h: &History, rec: &Recovered, act: &Active, upper: usize, out: &mut Vec<String>) {
    for (id, (p, op)) in &act.reach {
        if rec.kinds.contains_key(id) {
            continue;
        }
        let Some(vs) = h.links.get(id) else { continue };
        if allowed(vs, *p, upper).any(|i| vs[i].val == 0) {
            continue;
        }
        out.push(format!("{} ({id}) is gone, but `{op}` made it durable", h.path_of(id)));
    }
}

/// A rename is all or nothing: an inode never hard-linked has at most one name.
fn check_single_names(h: &History, rec: &Recovered, out: &mut Vec<String>) {
    for (id, n) in &rec.name_count {
        if *n > 1
            && h.max_links.get(id).copied().unwrap_or(0) <= 1
            && rec.kinds.get(id) != Some(&FileKind::Dir)
        {
            let names: Vec<&str> =
                rec.paths.iter().filter(|(_, i)| i == id).map(|(p, _)| p.as_str()).collect();
            out.push(format!("{id} never had two names but appears as {}", names.join(" and ")));
        }
    }
}

impl History {
    /// Differences between the live file system (walked before the crash) and what the workload
    /// recorded: a harness bug or an in-memory bug, either way worth a report.
    pub fn compare_live(&self, live: &Recovered) -> Vec<String> {
        let mut out = live.problems.iter().map(|p| format!("live walk: {p}")).collect::<Vec<_>>();
        for (dir, ents) in &live.entries {
            let want = self.children.get(dir);
            let empty = BTreeMap::new();
            let want = want.unwrap_or(&empty);
            if want != ents {
                let extra: Vec<String> = ents
                    .keys()
                    .filter(|n| !want.contains_key(*n))
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect();
                let missing: Vec<String> = want
                    .keys()
                    .filter(|n| !ents.contains_key(*n))
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect();
                out.push(format!(
                    "live directory {} differs from the recorded one: extra {extra:?}, missing {missing:?}, or entries point elsewhere",
                    self.path_of(dir)
                ));
            }
        }
        for (id, st) in &live.files {
            match self.files.get(id).and_then(|v| v.last()) {
                Some(v) if v.val.same_data(st) && v.val.same_meta(st) => {}
                Some(v) => out.push(format!(
                    "live file {}: {} but the workload recorded {}",
                    self.path_of(id),
                    st.describe(),
                    v.val.describe()
                )),
                None => out.push(format!("live file {} ({id}) was never recorded", self.path_of(id))),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> Id {
        Id { ino: n, crtime: (n as i64, 0) }
    }

    #[test]
    fn allowed_versions() {
        let vs = vec![
            Ver { ev: 0, base: true, val: 0 },
            Ver { ev: 5, base: false, val: 1 },
            Ver { ev: 9, base: false, val: 2 },
        ];
        assert_eq!(allowed(&vs, 0, 0).collect::<Vec<_>>(), vec![0]);
        assert_eq!(allowed(&vs, 0, 6).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(allowed(&vs, 1, 6).collect::<Vec<_>>(), vec![1]);
        assert_eq!(allowed(&vs, 1, 10).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(allowed(&vs, 7, 10).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn promises_and_checks() {
        let root = id(1);
        let mut rec = Recovered { root, ..Default::default() };
        rec.entries.insert(root, BTreeMap::new());
        rec.kinds.insert(root, FileKind::Dir);
        rec.paths.push(("/".into(), root));
        let mut h = History::from_recovered(&rec);
        let f = id(2);
        h.new_inode(f, FileKind::File);
        h.set_entry(3, root, b"f", Some(f));
        let st = FileState {
            kind: FileKind::File,
            size: 0,
            hash: 1,
            small: vec![],
            mode: 0o644,
            mtime: (0, 0),
            xattrs: vec![],
        };
        h.set_file(3, f, st.clone());
        let ps = h.promise_fsync(f, false);
        assert_eq!(ps.len(), 3);
        h.acked.push(Acked { ev_end: 10, op: "fsync /f".into(), promises: ps });
        // Durable: the file must be there.
        let v = check(&h, &rec, 10, 10);
        assert!(v.iter().any(|m| m.contains("entry /f")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("is gone")), "{v:?}");
        // Not durable yet: absence is fine.
        assert!(check(&h, &rec, 9, 10).is_empty());
        // Present with the right state: fine.
        rec.entries.get_mut(&root).unwrap().insert(b"f".to_vec(), f);
        rec.kinds.insert(f, FileKind::File);
        rec.name_count.insert(f, 1);
        rec.files.insert(f, st.clone());
        assert!(check(&h, &rec, 10, 10).is_empty());
        // Present but never created (log below its creation).
        assert!(!check(&h, &rec, 0, 2).is_empty());
        // Wrong contents.
        rec.files.insert(f, FileState { hash: 2, ..st });
        assert!(check(&h, &rec, 10, 10).iter().any(|m| m.contains("contents")));
    }
}
