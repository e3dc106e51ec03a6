//! The model: from the writers' logs, what may be found after a crash (the durability
//! contract), and the check of a remounted tree against it.
//!
//! The rules for one object are the crash harness's oracle's: what a name may hold is an
//! `oracle::Versions` (its durable value or any later one), what a file may hold an
//! `oracle::FileModel` (any mix of the bytes written since its last fsync, a size, mode and
//! mtime within the bounds of the contract). This file keeps the namespace around them: which
//! directory holds which names, what an fsync of a file or directory makes durable, which
//! files and directories must be found somewhere, and the walk of the mount.

use super::*;
use lanefs::FileKind;
use lanefs_crashtest::oracle::{DirTree, FileModel, Tree, Versions};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Val {
    File(usize),
    Dir(usize),
}

/// One name in one directory: the values it held, each with the sequence number of the operation
/// that set it; those from the durable one on may be found after a crash (the oracle's rule).
pub(crate) type Name = Versions<Option<Val>>;

/// The values a name may hold after a crash: every operation the logs show may have been made.
pub(crate) fn allowed(n: &Name) -> impl Iterator<Item = Option<Val>> + '_ {
    n.allowed(usize::MAX).copied()
}

#[derive(Debug, Default)]
pub(crate) struct DirM {
    /// Last path the writer gave it (for messages).
    pub(crate) path: String,
    /// A name of it has been durable, and it was not removed since: it must be found.
    pub(crate) named: bool,
    pub(crate) gone: bool,
    pub(crate) names: BTreeMap<String, Name>,
    /// Renames into or out of this directory since its last fsync: (writer thread, sequence,
    /// other directory, name there). An fsync of this directory makes the other side durable too.
    pub(crate) renames: Vec<(usize, usize, usize, String)>,
}

/// One file: where it is, whether it must be found, and what it may hold (the oracle's model of
/// a file's content, size, mode and mtime after a crash, its writes by generation of
/// `pat_byte`).
#[derive(Debug)]
pub(crate) struct FileM {
    /// Last path the writer gave it (for messages).
    pub(crate) path: String,
    /// A name of it has been durable, and it was not unlinked or renamed over since: it must be
    /// found (a rename never loses a file).
    pub(crate) named: bool,
    pub(crate) gone: bool,
    pub(crate) state: FileModel,
}

impl FileM {
    pub(crate) fn new(path: &str, content: Vec<u8>, mode: u32, mtime: Option<(i64, u32)>) -> FileM {
        FileM {
            path: path.to_string(),
            named: false,
            gone: false,
            state: FileModel::new(content, mode, mtime, pat_byte),
        }
    }
}

/// What a check has met: directories (with their paths), inodes, files that fit.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) dirs: HashMap<usize, String>,
    pub(crate) inos: HashMap<u64, String>,
    pub(crate) files: HashSet<usize>,
}

#[derive(Debug, Default)]
pub(crate) struct Model {
    pub(crate) dirs: Vec<DirM>,
    pub(crate) files: Vec<FileM>,
    pub(crate) seq: usize,
}

/// What a walk of the mount found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Obs {
    Dir(BTreeMap<String, Obs>),
    File { ino: u64, nlink: u64, mode: u32, mtime: (i64, u32), content: Vec<u8> },
    Other(u32),
}

/// The first path at which two walks differ, if any.
pub(crate) fn first_difference(
    path: &str,
    a: &BTreeMap<String, Obs>,
    b: &BTreeMap<String, Obs>,
) -> Option<String> {
    for name in a.keys().chain(b.keys()) {
        let p = format!("{path}/{name}");
        match (a.get(name), b.get(name)) {
            (Some(Obs::Dir(x)), Some(Obs::Dir(y))) => {
                if let Some(d) = first_difference(&p, x, y) {
                    return Some(d);
                }
            }
            (Some(Obs::File { content: c1, .. }), Some(Obs::File { content: c2, .. })) if c1 != c2 => {
                return Some(format!("{p}: content differs ({} and {} bytes)", c1.len(), c2.len()))
            }
            (x, y) if x != y => {
                let brief = |o: Option<&Obs>| match o {
                    None => "absent".to_string(),
                    Some(Obs::Dir(_)) => "a directory".to_string(),
                    Some(Obs::File { ino, nlink, mode, mtime, content }) => {
                        format!(
                            "file ino {ino} nlink {nlink} mode {mode:o} mtime {mtime:?}, {} bytes",
                            content.len()
                        )
                    }
                    Some(Obs::Other(m)) => format!("type {m:o}"),
                };
                return Some(format!("{p}: {} and {}", brief(x), brief(y)));
            }
            _ => {}
        }
    }
    None
}

/// Reads the tree below `dir` through the crash harness's `Tree` calls on a directory of the
/// mount (the calls its oracle's walk makes), every file's content whole: the model checks it
/// byte by byte.
pub(crate) fn observe(dir: &Path) -> io::Result<BTreeMap<String, Obs>> {
    let tree = DirTree { root: dir.to_path_buf() };
    observe_node(&tree, &tree.root())
}

/// The largest file read back whole (the writer's are 512 KiB at most); a bound, so that a
/// corrupt size cannot make the walk allocate without end.
const READ_MAX: u64 = 64 << 20;

fn observe_node(tree: &DirTree, dir: &PathBuf) -> io::Result<BTreeMap<String, Obs>> {
    let mut entries = Vec::new();
    tree.list(dir, &mut entries).map_err(io::Error::other)?;
    let mut out = BTreeMap::new();
    for e in entries {
        let md = tree.stat(&e.node).map_err(io::Error::other)?;
        let o = match md.kind {
            FileKind::Dir => Obs::Dir(observe_node(tree, &e.node)?),
            FileKind::File => {
                // Read to the end, not to the size stat reports: the two must agree.
                let mut content = Vec::new();
                let mut buf = vec![0u8; 256 << 10];
                loop {
                    let n = tree.read(&e.node, content.len() as u64, &mut buf).map_err(io::Error::other)?;
                    if n == 0 || content.len() as u64 > READ_MAX {
                        break;
                    }
                    content.extend_from_slice(&buf[..n]);
                }
                if content.len() as u64 != md.size {
                    return Err(io::Error::other(format!(
                        "{}: stat says {} bytes, read gave {}",
                        e.node.display(),
                        md.size,
                        content.len()
                    )));
                }
                Obs::File { ino: md.ino, nlink: md.nlink, mode: md.mode & 0o7777, mtime: md.mtime, content }
            }
            _ => Obs::Other(md.mode),
        };
        out.insert(String::from_utf8_lossy(&e.name).into_owned(), o);
    }
    Ok(out)
}

impl Model {
    /// The observed tree, all of it durable.
    pub(crate) fn baseline(root: &BTreeMap<String, Obs>) -> Model {
        let mut m = Model::default();
        m.dirs.push(DirM { named: true, ..DirM::default() });
        m.add_baseline(0, "", root);
        m
    }

    pub(crate) fn add_baseline(&mut self, d: usize, path: &str, obs: &BTreeMap<String, Obs>) {
        for (name, o) in obs {
            let p = if path.is_empty() { name.clone() } else { format!("{path}/{name}") };
            let v = match o {
                Obs::Dir(sub) => {
                    let x = self.dirs.len();
                    self.dirs.push(DirM { path: p.clone(), named: true, ..DirM::default() });
                    self.add_baseline(x, &p, sub);
                    Val::Dir(x)
                }
                Obs::File { content, mode, mtime, .. } => {
                    let mut f = FileM::new(&p, content.clone(), *mode, Some(*mtime));
                    f.named = true;
                    self.files.push(f);
                    Val::File(self.files.len() - 1)
                }
                Obs::Other(mode) => panic!("{name}: unexpected file type {mode:o}"),
            };
            self.dirs[d].names.insert(name.clone(), Versions::new(Some(v)));
        }
    }

    pub(crate) fn set(&mut self, d: usize, name: &str, v: Option<Val>) {
        self.seq += 1;
        let seq = self.seq;
        self.dirs[d].names.entry(name.to_string()).or_insert_with(|| Versions::new(None)).set(seq, v);
    }

    /// (parent directory, last component, current value) of a path the writer logged.
    pub(crate) fn lookup(&self, path: &str) -> (usize, String, Option<Val>) {
        let comps: Vec<&str> = path.split('/').collect();
        let mut d = 0;
        for c in &comps[..comps.len() - 1] {
            match self.dirs[d].names.get(*c).and_then(|n| *n.current()) {
                Some(Val::Dir(x)) => d = x,
                other => panic!("the writer logged {path}, but {c} is {other:?} in the model"),
            }
        }
        let last = comps[comps.len() - 1];
        (d, last.to_string(), self.dirs[d].names.get(last).and_then(|n| *n.current()))
    }

    pub(crate) fn file(&self, path: &str) -> usize {
        match self.lookup(path).2 {
            Some(Val::File(f)) => f,
            other => panic!("the writer logged a file {path}, but the model has {other:?}"),
        }
    }

    pub(crate) fn durable_now(&mut self, d: usize, name: &str) {
        self.dirs[d].names.get_mut(name).expect("a name the model has").make_durable();
        self.mark_named(d, name);
    }

    pub(crate) fn durable_at(&mut self, d: usize, name: &str, seq: usize) {
        if let Some(n) = self.dirs[d].names.get_mut(name) {
            n.make_durable_at(seq);
            self.mark_named(d, name);
        }
    }

    /// What a name durably holds must be found after a crash, wherever renames took it.
    pub(crate) fn mark_named(&mut self, d: usize, name: &str) {
        match *self.dirs[d].names[name].durable_value() {
            Some(Val::File(f)) => self.files[f].named = true,
            Some(Val::Dir(x)) => self.dirs[x].named = true,
            None => {}
        }
    }

    /// Applies one line of writer thread `t`'s log.
    pub(crate) fn apply(&mut self, t: usize, line: &str) {
        let w: Vec<&str> = line.splitn(3, ' ').collect();
        let num = |i: usize| -> u64 { w[i].parse().unwrap_or_else(|_| panic!("bad log line {line:?}")) };
        match w[0] {
            "C" => {
                let (d, n, _) = self.lookup(w[1]);
                self.files.push(FileM::new(w[1], Vec::new(), 0o644, None));
                self.set(d, &n, Some(Val::File(self.files.len() - 1)));
            }
            "W" => {
                let w: Vec<&str> = line.split(' ').collect();
                let f = self.file(w[1]);
                let p = |i: usize| -> u64 { w[i].parse().unwrap() };
                self.files[f].state.write(p(2), p(3), p(4));
            }
            "T" => {
                let f = self.file(w[1]);
                self.files[f].state.truncate(num(2));
            }
            "s" => {
                let (d, n, _) = self.lookup(w[1]);
                let f = self.file(w[1]);
                self.files[f].state.fsync();
                self.durable_now(d, &n);
            }
            "m" => {
                let w: Vec<&str> = line.split(' ').collect();
                let f = self.file(w[1]);
                self.files[f].state.fsynced_mtime((w[2].parse().unwrap(), w[3].parse().unwrap()));
            }
            "P" => {
                let f = self.file(w[1]);
                self.files[f].state.set_mode(num(2) as u32);
            }
            "d" => {
                let f = self.file(w[1]);
                self.files[f].state.fdatasync();
            }
            "M" => {
                let (d, n, _) = self.lookup(w[1]);
                self.dirs.push(DirM { path: w[1].to_string(), ..DirM::default() });
                self.set(d, &n, Some(Val::Dir(self.dirs.len() - 1)));
            }
            "R" => {
                let (sd, sn, v) = self.lookup(w[1]);
                let (dd, dn, over) = self.lookup(w[2]);
                match v {
                    Some(Val::File(f)) => self.files[f].path = w[2].to_string(),
                    Some(Val::Dir(x)) => self.dirs[x].path = w[2].to_string(),
                    None => panic!("rename of {} that the model does not have", w[1]),
                }
                if let Some(Val::File(g)) = over {
                    self.files[g].gone = true;
                }
                self.set(sd, &sn, None);
                self.set(dd, &dn, v);
                let seq = self.seq;
                self.dirs[sd].renames.push((t, seq, dd, dn));
                self.dirs[dd].renames.push((t, seq, sd, sn));
            }
            "U" | "X" => {
                let (d, n, v) = self.lookup(w[1]);
                match v {
                    Some(Val::File(f)) => self.files[f].gone = true,
                    Some(Val::Dir(x)) => self.dirs[x].gone = true,
                    None => panic!("removal of {} that the model does not have", w[1]),
                }
                self.set(d, &n, None);
            }
            "y" => {
                let d = match self.lookup(w[1]).2 {
                    Some(Val::Dir(d)) => d,
                    other => panic!("fsync of directory {} that the model has as {other:?}", w[1]),
                };
                // The changes this thread made before its fsync; the other threads' changes in the
                // shared directory are concurrent with it, and their logs are applied separately.
                let names: Vec<String> =
                    self.dirs[d].names.keys().filter(|n| owner(n) == Some(t)).cloned().collect();
                for n in names {
                    self.durable_now(d, &n);
                }
                let (mine, others): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut self.dirs[d].renames).into_iter().partition(|r| r.0 == t);
                self.dirs[d].renames = others;
                for (_, seq, od, on) in mine {
                    self.durable_at(od, &on, seq);
                }
            }
            "S" | "D" | "Y" | "E" | "Z" => {}
            _ => panic!("bad log line {line:?}"),
        }
    }

    /// Where `v` is now in the writer's namespace (None once removed).
    pub(crate) fn path_of(&self, v: Val) -> Option<String> {
        let mut stack = vec![(0usize, String::new())];
        while let Some((d, path)) = stack.pop() {
            for (name, n) in &self.dirs[d].names {
                let p = if path.is_empty() { name.clone() } else { format!("{path}/{name}") };
                match *n.current() {
                    Some(x) if x == v => return Some(p),
                    Some(Val::Dir(x)) => stack.push((x, p)),
                    _ => {}
                }
            }
        }
        None
    }

    pub(crate) fn describe(&self, n: &Name) -> String {
        n.describe(|v| match v {
            None => "absent".to_string(),
            Some(Val::File(f)) => format!("file#{f}"),
            Some(Val::Dir(d)) => format!("dir#{d}"),
        })
    }

    /// Every way the observed tree breaks what the logs promise.
    pub(crate) fn check(&self, root: &BTreeMap<String, Obs>) -> Vec<String> {
        let mut problems = Vec::new();
        let mut seen = Seen::default();
        self.check_dir(0, "", root, &mut problems, &mut seen);
        for (f, fm) in self.files.iter().enumerate() {
            if fm.named && !fm.gone && !seen.files.contains(&f) {
                problems.push(format!(
                    "file#{f} (/{} before the crash, {} bytes fsynced) is nowhere: its name was durable, \
                     and it was neither unlinked nor renamed over since",
                    self.path_of(Val::File(f)).unwrap_or_else(|| fm.path.clone()),
                    fm.state.durable_len()
                ));
            }
        }
        for (d, dm) in self.dirs.iter().enumerate() {
            if dm.named && !dm.gone && !seen.dirs.contains_key(&d) {
                problems.push(format!(
                    "directory #{d} (/{} before the crash) is nowhere: its name was durable, and it was \
                     not removed since",
                    self.path_of(Val::Dir(d)).unwrap_or_else(|| dm.path.clone())
                ));
            }
        }
        problems
    }

    pub(crate) fn check_dir(
        &self,
        d: usize,
        path: &str,
        obs: &BTreeMap<String, Obs>,
        problems: &mut Vec<String>,
        seen: &mut Seen,
    ) {
        if let Some(prev) = seen.dirs.insert(d, path.to_string()) {
            problems.push(format!("directory #{d} is at both /{prev} and /{path}"));
            return;
        }
        let dm = &self.dirs[d];
        for (name, o) in obs {
            let p = if path.is_empty() { name.clone() } else { format!("{path}/{name}") };
            let Some(n) = dm.names.get(name) else {
                problems.push(format!("/{p}: the writer never made this name"));
                continue;
            };
            match o {
                Obs::Dir(sub) => match allowed(n).find_map(|v| match v {
                    Some(Val::Dir(x)) => Some(x),
                    _ => None,
                }) {
                    Some(x) => self.check_dir(x, &p, sub, problems, seen),
                    None => problems.push(format!("/{p} is a directory; the name was {}", self.describe(n))),
                },
                Obs::File { ino, nlink, mode, mtime, content } => {
                    if *nlink != 1 {
                        problems.push(format!("/{p}: nlink {nlink}, the writer makes no hard links"));
                    }
                    if let Some(prev) = seen.inos.insert(*ino, p.clone()) {
                        problems.push(format!("/{p} and /{prev} are one inode ({ino})"));
                    }
                    let cands: Vec<usize> = allowed(n)
                        .filter_map(|v| match v {
                            Some(Val::File(f)) => Some(f),
                            _ => None,
                        })
                        .collect();
                    if cands.is_empty() {
                        problems.push(format!("/{p} is a file; the name was {}", self.describe(n)));
                        continue;
                    }
                    let mut errs = Vec::new();
                    for &f in &cands {
                        match self.files[f].state.check(content, *mode, *mtime) {
                            Ok(()) => {
                                seen.files.insert(f);
                            }
                            Err(e) => errs.push(format!("as file#{f}: {e}")),
                        }
                    }
                    if errs.len() == cands.len() {
                        problems.push(format!(
                            "/{p}: content fits none of the files the name may hold ({}): {}",
                            self.describe(n),
                            errs.join("; ")
                        ));
                    }
                }
                Obs::Other(mode) => problems.push(format!("/{p}: unexpected file type {mode:o}")),
            }
        }
        for (name, n) in &dm.names {
            if !obs.contains_key(name) && !allowed(n).any(|v| v.is_none()) {
                let p = if path.is_empty() { name.clone() } else { format!("{path}/{name}") };
                problems.push(format!("/{p} is missing; the name was {}", self.describe(n)));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The test.
