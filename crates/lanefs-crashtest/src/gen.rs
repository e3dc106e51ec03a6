//! Workload generators: CrashMonkey ACE-style bounded sequences, longer random mixes, and
//! multi-threaded mixes.
//!
//! Generators track a simple model of the namespace (which paths exist, files or directories)
//! so that they produce operations whose preconditions hold; the executor still records what
//! really happened, so a generated operation that fails is harmless.

use super::ops::{split, FallocMode, Op};
use super::workload::{Knobs, Setup, Workload};
use lanefs::rng::Rng;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    /// A whiteout a rename left.
    Device,
}

/// What a generator believes exists.
#[derive(Debug, Clone, Default)]
struct Model {
    paths: BTreeMap<String, Kind>,
    xattrs: BTreeSet<(String, String)>,
    /// Paths `open` was called with and `close` was not.
    open: BTreeSet<String>,
}

fn parent(p: &str) -> &str {
    split(p).map_or("/", |(d, _)| d)
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

impl Model {
    fn for_setup(s: Setup) -> Model {
        let mut m = Model::default();
        m.paths.insert("/".into(), Kind::Dir);
        for op in s.ops() {
            m.apply(&op);
        }
        m
    }
    fn kind(&self, p: &str) -> Option<Kind> {
        self.paths.get(p).copied()
    }
    fn is_dir(&self, p: &str) -> bool {
        self.kind(p) == Some(Kind::Dir)
    }
    fn is_file(&self, p: &str) -> bool {
        self.kind(p) == Some(Kind::File)
    }
    fn is_empty_dir(&self, p: &str) -> bool {
        self.is_dir(p) && !self.paths.keys().any(|k| k != p && parent(k) == p)
    }
    fn files(&self) -> Vec<String> {
        self.paths.iter().filter(|(_, k)| **k == Kind::File).map(|(p, _)| p.clone()).collect()
    }
    fn dirs(&self) -> Vec<String> {
        self.paths.iter().filter(|(_, k)| **k == Kind::Dir).map(|(p, _)| p.clone()).collect()
    }
    fn can_create(&self, p: &str) -> bool {
        !self.paths.contains_key(p) && self.is_dir(parent(p))
    }

    /// Moves `from` (and everything below it) to `to`.
    fn move_tree(&mut self, from: &str, to: &str) {
        let prefix = format!("{from}/");
        let moved: Vec<(String, Kind)> = self
            .paths
            .iter()
            .filter(|(k, _)| *k == from || k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        for (k, _) in &moved {
            self.paths.remove(k);
        }
        for (k, v) in moved {
            self.paths.insert(format!("{to}{}", &k[from.len()..]), v);
        }
        let xs: Vec<(String, String)> =
            self.xattrs.iter().filter(|(p, _)| p == from || p.starts_with(&prefix)).cloned().collect();
        for (p, n) in xs {
            self.xattrs.remove(&(p.clone(), n.clone()));
            self.xattrs.insert((format!("{to}{}", &p[from.len()..]), n));
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Create(p) if self.can_create(p) => {
                self.paths.insert(p.clone(), Kind::File);
            }
            Op::Mkdir(p) if self.can_create(p) => {
                self.paths.insert(p.clone(), Kind::Dir);
            }
            Op::Link(a, b) if self.is_file(a) && self.can_create(b) => {
                self.paths.insert(b.clone(), Kind::File);
                // Hard links share xattrs; the model forgets them on the new name (harmless).
            }
            Op::Symlink(_, p) if self.can_create(p) => {
                self.paths.insert(p.clone(), Kind::Symlink);
            }
            Op::Exchange(a, b) if self.is_file(a) && self.is_file(b) => {
                self.xattrs.retain(|(q, _)| q != a && q != b);
            }
            Op::Open(p) => {
                self.open.insert(p.clone());
            }
            Op::Close(p) => {
                self.open.remove(p);
            }
            Op::Unlink(p) if self.kind(p).is_some_and(|k| k != Kind::Dir) => {
                self.paths.remove(p);
                self.xattrs.retain(|(q, _)| q != p);
            }
            Op::Rmdir(p) if self.is_empty_dir(p) && p != "/" => {
                self.paths.remove(p);
            }
            Op::Rename(a, b) | Op::Whiteout(a, b) if self.kind(a).is_some() && a != b => {
                if self.kind(b).is_some() {
                    self.paths.remove(b);
                    self.xattrs.retain(|(q, _)| q != b);
                }
                self.move_tree(a, b);
                if matches!(op, Op::Whiteout(..)) {
                    self.paths.insert(a.clone(), Kind::Device);
                }
            }
            Op::SetXattr { path, name, .. } if self.is_file(path) => {
                self.xattrs.insert((path.clone(), name.clone()));
            }
            Op::RemoveXattr { path, name } => {
                self.xattrs.remove(&(path.clone(), name.clone()));
            }
            _ => {}
        }
    }

    /// Whether rename(a, b) is valid (no loops, kinds agree, target directory empty).
    fn can_rename(&self, a: &str, b: &str) -> bool {
        let Some(ka) = self.kind(a) else { return false };
        if a == "/" || a == b || !self.is_dir(parent(b)) || b.starts_with(&format!("{a}/")) {
            return false;
        }
        match self.kind(b) {
            None => true,
            Some(kb) => kb == ka && (kb == Kind::File || self.is_empty_dir(b)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ACE

const ACE_FILES: [&str; 7] = ["/foo", "/bar", "/A/foo", "/A/bar", "/B/foo", "/B/bar", "/A/C/foo"];
const ACE_DIRS: [&str; 5] = ["/A", "/B", "/A/C", "/D", "/A/D"];

/// Every core operation ACE would generate in state `m`, with the paths it touches.
fn ace_core_ops(m: &Model, tag: u8) -> Vec<(Op, Vec<String>)> {
    let mut out = Vec::new();
    let files: Vec<&str> = ACE_FILES.iter().copied().filter(|f| m.is_file(f)).collect();
    for f in ACE_FILES {
        if m.can_create(f) {
            out.push((Op::Create(f.into()), vec![f.into()]));
        }
    }
    for d in ACE_DIRS {
        if m.can_create(d) {
            out.push((Op::Mkdir(d.into()), vec![d.into()]));
        }
    }
    for &f in &files {
        let p = f.to_string();
        for (off, len) in [(0, 4096), (3000, 5000), (16384, 8192)] {
            out.push((Op::Write { path: p.clone(), off, len, tag }, vec![p.clone()]));
        }
        for (mode, off, len) in [
            (FallocMode::Alloc, 8192, 8192),
            (FallocMode::KeepSize, 16384, 4096),
            (FallocMode::Punch, 4096, 4096),
            (FallocMode::Punch, 1000, 5000),
            (FallocMode::Zero, 3000, 8192),
            (FallocMode::ZeroKeepSize, 12288, 9000),
        ] {
            out.push((Op::Falloc { path: p.clone(), mode, off, len }, vec![p.clone()]));
        }
        for size in [0, 2500, 20000] {
            out.push((Op::Truncate { path: p.clone(), size }, vec![p.clone()]));
        }
        for g in ACE_FILES {
            if m.can_create(g) {
                out.push((Op::Link(p.clone(), g.into()), vec![p.clone(), g.into()]));
            }
            if g != f && m.can_rename(f, g) {
                out.push((Op::Rename(p.clone(), g.into()), vec![g.into(), p.clone()]));
                out.push((Op::Whiteout(p.clone(), g.into()), vec![g.into(), p.clone()]));
            }
        }
        out.push((Op::Unlink(p.clone()), vec![p.clone()]));
        // user.y does not fit an xattr node: setting it moves the set to xattr blocks, and
        // removing it brings the set back inline.
        for (name, len) in [("user.x", 16), ("user.y", 9000)] {
            out.push((Op::SetXattr { path: p.clone(), name: name.into(), len, tag }, vec![p.clone()]));
            if m.xattrs.contains(&(p.clone(), name.into())) {
                out.push((Op::RemoveXattr { path: p.clone(), name: name.into() }, vec![p.clone()]));
            }
        }
    }
    for d in ACE_DIRS {
        if m.is_empty_dir(d) {
            out.push((Op::Rmdir(d.into()), vec![d.into()]));
        }
        for e in ACE_DIRS {
            if m.can_rename(d, e) {
                out.push((Op::Rename(d.into(), e.into()), vec![e.into(), d.into()]));
            }
        }
    }
    out
}

/// Persistence points after an operation that touched `touched` (as the model is after it).
fn ace_persist(m: &Model, touched: &[String], allow_none: bool) -> Vec<Option<Op>> {
    let mut out: Vec<Option<Op>> = Vec::new();
    if allow_none {
        out.push(None);
    }
    let mut seen = BTreeSet::new();
    for p in touched {
        let mut add = |op: Op| {
            if seen.insert(op.to_string()) {
                out.push(Some(op));
            }
        };
        if m.kind(p).is_some() {
            add(Op::Fsync(p.clone()));
        }
        if m.is_file(p) {
            add(Op::Fdatasync(p.clone()));
        }
        let d = parent(p).to_string();
        if m.is_dir(&d) {
            add(Op::Fsync(d));
        }
    }
    out.push(Some(Op::Sync));
    out
}

/// Every seq-1 workload: one core operation followed by one persistence point.
pub fn ace_seq1_all() -> Vec<Vec<Op>> {
    let m = Model::for_setup(Setup::Ace);
    let mut out = Vec::new();
    for (op, touched) in ace_core_ops(&m, 11) {
        let mut after = m.clone();
        after.apply(&op);
        for p in ace_persist(&after, &touched, false).into_iter().flatten() {
            out.push(vec![op.clone(), p]);
        }
    }
    out
}

/// A seq-`n` workload drawn at random: `n` core operations, each followed by a persistence
/// point (or none, except after the last).
pub fn ace_seq(n: usize, rng: &mut Rng) -> Vec<Op> {
    let mut m = Model::for_setup(Setup::Ace);
    let mut ops = Vec::new();
    for i in 0..n {
        let cands = ace_core_ops(&m, 11 + i as u8);
        if cands.is_empty() {
            break;
        }
        let (op, touched) = cands[rng.index(cands.len())].clone();
        m.apply(&op);
        ops.push(op);
        let ps = ace_persist(&m, &touched, i + 1 < n);
        if let Some(p) = ps[rng.index(ps.len())].clone() {
            ops.push(p);
        }
    }
    ops
}

/// A one-thread workload on the ACE file set from a given list of operations.
pub fn ace_workload(id: String, ops: Vec<Op>) -> Workload {
    Workload { id, setup: Setup::Ace, threads: vec![ops], knobs: Knobs::default(), fault: None }
}

// ---------------------------------------------------------------------------------------------
// Random mixes

/// What a random mix draws from: the model's files and directories under `root`.
struct Pool<'a> {
    m: &'a Model,
    root: &'a str,
    files: Vec<String>,
    dirs: Vec<String>,
}

impl<'a> Pool<'a> {
    fn new(m: &'a Model, root: &'a str) -> Pool<'a> {
        let mut p = Pool { m, root, files: Vec::new(), dirs: Vec::new() };
        p.files = m.files().into_iter().filter(|f| p.in_root(f)).collect();
        p.dirs = m.dirs().into_iter().filter(|d| p.in_root(d)).collect();
        p
    }

    fn in_root(&self, p: &str) -> bool {
        p == self.root || p.starts_with(&format!("{}/", self.root.trim_end_matches('/')))
    }

    /// A name `prefix` + a number below `n` in a random directory.
    fn new_name(&self, rng: &mut Rng, prefix: &str, n: u64) -> String {
        let d = rng.pick(&self.dirs).clone();
        join(&d, &format!("{prefix}{}", rng.below(n)))
    }

    fn file(&self, rng: &mut Rng) -> Option<String> {
        (!self.files.is_empty()).then(|| rng.pick(&self.files).clone())
    }

    fn rmdir(&self, rng: &mut Rng) -> Option<Op> {
        let empty: Vec<String> =
            self.dirs.iter().filter(|d| *d != self.root && self.m.is_empty_dir(d)).cloned().collect();
        if empty.is_empty() {
            return None;
        }
        Some(Op::Rmdir(rng.pick(&empty).clone()))
    }

    /// A rename (now and then leaving a whiteout) of a file or, one time in four, a directory,
    /// over another file or to a new name.
    fn rename(&self, rng: &mut Rng) -> Option<Op> {
        let src = if rng.chance(1, 4) {
            let ds: Vec<String> = self.dirs.iter().filter(|d| *d != self.root).cloned().collect();
            if ds.is_empty() {
                return None;
            }
            rng.pick(&ds).clone()
        } else {
            self.file(rng)?
        };
        let dst = if self.m.is_file(&src) && self.files.len() > 1 && rng.chance(1, 3) {
            rng.pick(&self.files).clone()
        } else {
            self.new_name(rng, if self.m.is_dir(&src) { "d" } else { "f" }, 8)
        };
        if !self.m.can_rename(&src, &dst) {
            return None;
        }
        Some(if rng.chance(1, 5) { Op::Whiteout(src, dst) } else { Op::Rename(src, dst) })
    }

    fn remove_xattr(&self, rng: &mut Rng) -> Option<Op> {
        let xs: Vec<&(String, String)> = self.m.xattrs.iter().filter(|(p, _)| self.in_root(p)).collect();
        if xs.is_empty() {
            return None;
        }
        let (path, name) = (*rng.pick(&xs)).clone();
        Some(Op::RemoveXattr { path, name })
    }

    fn exchange(&self, rng: &mut Rng) -> Option<Op> {
        if self.files.len() < 2 {
            return None;
        }
        let a = rng.pick(&self.files).clone();
        let b = rng.pick(&self.files).clone();
        if a == b {
            return None;
        }
        Some(Op::Exchange(a, b))
    }

    fn open(&self, rng: &mut Rng) -> Option<Op> {
        let path = self.file(rng)?;
        if self.m.open.contains(&path) {
            return None;
        }
        Some(Op::Open(path))
    }

    fn close(&self, rng: &mut Rng) -> Option<Op> {
        let open: Vec<&String> = self.m.open.iter().filter(|p| self.in_root(p)).collect();
        if open.is_empty() {
            return None;
        }
        Some(Op::Close((*rng.pick(&open)).clone()))
    }
}

/// A write to `path`: mostly small and near the start, one in forty past 4 MiB.
fn random_write(rng: &mut Rng, path: String, tag: u8) -> Op {
    let big = rng.chance(1, 40);
    let off = if big { (4 << 20) + rng.below(64 << 10) } else { rng.below(40 << 10) };
    let len = 1 + if rng.chance(1, 3) { rng.below(4096) } else { rng.below(20 << 10) };
    Op::Write { path, off, len, tag }
}

/// One random operation on what `m` holds under `root` (`None`: the roll found nothing to act
/// on). The rolls' weights set the mix; their order of draws is what a seed reproduces.
fn random_op(m: &Model, rng: &mut Rng, root: &str, tag: u8) -> Option<Op> {
    let p = Pool::new(m, root);
    let roll = rng.below(108);
    let op = match roll {
        0..=11 => Op::Create(p.new_name(rng, "f", 8)),
        12..=15 => {
            if p.dirs.len() > 6 {
                return None;
            }
            Op::Mkdir(p.new_name(rng, "d", 3))
        }
        16..=35 => {
            let path = p.file(rng)?;
            random_write(rng, path, tag)
        }
        36..=40 => Op::Truncate { path: p.file(rng)?, size: rng.below(30 << 10) },
        41..=44 => {
            let mode = *rng.pick(&[
                FallocMode::Alloc,
                FallocMode::KeepSize,
                FallocMode::Punch,
                FallocMode::Zero,
                FallocMode::ZeroKeepSize,
            ]);
            Op::Falloc { path: p.file(rng)?, mode, off: rng.below(24 << 10), len: 1 + rng.below(16 << 10) }
        }
        45..=48 => Op::Link(p.file(rng)?, p.new_name(rng, "l", 4)),
        49..=54 => Op::Unlink(p.file(rng)?),
        55..=56 => p.rmdir(rng)?,
        57..=64 => p.rename(rng)?,
        65..=67 => Op::SetXattr {
            path: p.file(rng)?,
            name: format!("user.{}", rng.below(3)),
            // Now and then a value too large for an xattr node, up to XATTR_SIZE_MAX: the set
            // goes to xattr blocks.
            len: if rng.below(6) == 0 { 4000 + rng.below(61_537) as u32 } else { 1 + rng.below(300) as u32 },
            tag,
        },
        68 => p.remove_xattr(rng)?,
        69..=70 => Op::Chmod { path: p.file(rng)?, mode: *rng.pick(&[0o600, 0o644, 0o755, 0o400]) },
        71..=84 => Op::Fsync(p.file(rng)?),
        85..=87 => Op::Fdatasync(p.file(rng)?),
        88..=96 => Op::Fsync(rng.pick(&p.dirs).clone()),
        97..=99 => Op::Sync,
        100 | 101 => Op::Symlink(format!("../t{}", rng.below(100)), p.new_name(rng, "s", 4)),
        102 | 103 => p.exchange(rng)?,
        104 | 105 => p.open(rng)?,
        _ => p.close(rng)?,
    };
    Some(op)
}

/// `n` random operations under `root` (which must exist in `m`).
fn random_ops(m: &mut Model, rng: &mut Rng, root: &str, n: usize, allow_sync: bool) -> Vec<Op> {
    let mut ops = Vec::with_capacity(n);
    let mut tries = 0;
    // Bounded: a generator that keeps producing nothing valid gives up.
    while ops.len() < n && tries < n * 20 {
        tries += 1;
        let tag = (ops.len() % 251) as u8 + 1;
        if let Some(op) = random_op(m, rng, root, tag) {
            if op == Op::Sync && !allow_sync {
                continue;
            }
            m.apply(&op);
            ops.push(op);
        }
    }
    ops
}

/// A longer random mix (20 to 60 operations), sometimes with a small cache (writeback runs) or
/// a small journal limit (background checkpoints run during the workload).
pub fn random_workload(id: String, rng: &mut Rng) -> Workload {
    let setup = if rng.chance(1, 2) { Setup::Ace } else { Setup::Empty };
    let mut m = Model::for_setup(setup);
    let n = 20 + rng.index(41);
    let mut ops = random_ops(&mut m, rng, "/", n, true);
    // End with a persistence point, so that the last operations are checked too.
    if let Some(f) = m.files().first() {
        ops.push(Op::Fsync(f.clone()));
    }
    let mut knobs = Knobs::default();
    if rng.chance(1, 4) {
        knobs.cache_bytes = 96 << 10;
    }
    if rng.chance(1, 3) {
        knobs.journal_blocks_limit = 4 + rng.below(28);
    }
    Workload { id, setup, threads: vec![ops], knobs, fault: None }
}

/// A random mix without background checkpoints, for fault injection (so that every device
/// error surfaces in the operation that caused it).
pub fn fault_base(id: String, rng: &mut Rng) -> Workload {
    let setup = if rng.chance(1, 2) { Setup::Ace } else { Setup::Empty };
    let mut m = Model::for_setup(setup);
    let n = 10 + rng.index(21);
    let mut ops = random_ops(&mut m, rng, "/", n, true);
    if let Some(f) = m.files().first() {
        ops.push(Op::Fsync(f.clone()));
    }
    Workload { id, setup, threads: vec![ops], knobs: Knobs::default(), fault: None }
}

// ---------------------------------------------------------------------------------------------
// Multi-threaded mixes

/// Two threads, each in its own directory (created first), fsyncing concurrently.
pub fn mt_lanes_workload(id: String, rng: &mut Rng) -> Workload {
    let mut threads = Vec::new();
    for t in 0..2 {
        let root = format!("/T{t}");
        let mut m = Model::for_setup(Setup::Ace);
        let mut ops = vec![Op::Mkdir(root.clone())];
        m.apply(&ops[0]);
        ops.push(Op::Fsync(root.clone()));
        let n = 20 + rng.index(21);
        ops.extend(random_ops(&mut m, rng, &root, n, false));
        if let Some(f) = m.files().into_iter().find(|f| f.starts_with(&format!("{root}/"))) {
            ops.push(Op::Fsync(f));
        }
        threads.push(ops);
    }
    Workload { id, setup: Setup::Ace, threads, knobs: Knobs::default(), fault: None }
}

/// Checkpoints beside fsyncs: two threads as in [`mt_lanes_workload`] (each in its own
/// directory: creates, writes, renames, fsyncs), and a third that takes checkpoints (`sync`)
/// over and over, with pauses of a millisecond or two so that the others' fsyncs land inside
/// the checkpoints' write phases. Half the workloads run with a small page cache (writeback
/// during the write phase too).
pub fn mt_checkpoint_workload(id: String, rng: &mut Rng) -> Workload {
    let mut w = mt_lanes_workload(id, rng);
    let mut cp = Vec::new();
    for _ in 0..4 + rng.index(5) {
        cp.push(Op::Sleep(rng.below(3)));
        cp.push(Op::Sync);
    }
    w.threads.push(cp);
    if rng.chance(1, 2) {
        w.knobs.cache_bytes = 256 << 10;
    }
    w
}

/// Cleaning under crashes: a few files of 1 to 2 MiB (so that data segments fill and close),
/// then overwrites of random ranges, deletes and re-creates, fsyncs, and the cleaner run two or
/// three times in between, so that crash states fall inside the checkpoints that move blocks.
pub fn gc_workload(id: String, rng: &mut Rng) -> Workload {
    let setup = Setup::Ace;
    let mut ops = Vec::new();
    let count = 3 + rng.index(2);
    let mut sizes = Vec::new();
    let mut tag = 0u8;
    let mut next_tag = || {
        tag = tag % 250 + 1;
        tag
    };
    for k in 0..count {
        let p = format!("/g{k}");
        let size = (1 << 20) + rng.below(1 << 20);
        ops.push(Op::Create(p.clone()));
        let mut off = 0;
        while off < size {
            let len = (256 << 10).min(size - off);
            ops.push(Op::Write { path: p.clone(), off, len, tag: next_tag() });
            off += len;
        }
        if rng.chance(1, 2) {
            ops.push(Op::Fsync(p));
        }
        sizes.push(size);
    }
    ops.push(Op::Sync);
    let cleans = 2 + rng.index(2);
    let n = 24 + rng.index(24);
    for i in 0..n {
        let k = rng.index(count);
        let p = format!("/g{k}");
        match rng.below(12) {
            0..=5 => {
                let len = 4096 + rng.below(384 << 10);
                let off = rng.below(sizes[k].saturating_sub(len).max(1));
                ops.push(Op::Write { path: p, off, len, tag: next_tag() });
            }
            6 | 7 => ops.push(Op::Fsync(p)),
            8 => ops.push(Op::Fdatasync(p)),
            9 => {
                // Replace the file: its blocks die and a new one takes their place.
                ops.push(Op::Unlink(p.clone()));
                ops.push(Op::Create(p.clone()));
                let len = 64 << 10 | rng.below(512 << 10);
                ops.push(Op::Write { path: p.clone(), off: 0, len, tag: next_tag() });
                sizes[k] = len;
                if rng.chance(1, 2) {
                    ops.push(Op::Fsync(p));
                }
            }
            10 => ops.push(Op::Fsync("/".into())),
            _ => ops.push(Op::Truncate { path: p, size: rng.below(sizes[k] + 1) }),
        }
        if let Some(Op::Truncate { size, .. }) = ops.last() {
            sizes[k] = (*size).max(4096);
        }
        if i % (n / cleans).max(1) == n / cleans / 2 {
            ops.push(Op::Clean);
        }
    }
    ops.push(Op::Clean);
    ops.push(Op::Fsync(format!("/g{}", rng.index(count))));
    let mut knobs = Knobs::default();
    if rng.chance(1, 3) {
        knobs.cache_bytes = 512 << 10;
    }
    Workload { id, setup, threads: vec![ops], knobs, fault: None }
}

/// Thread 0 renames its files between /A and /B (and writes and fsyncs them now and then);
/// thread 1 fsyncs /A or /B and creates, writes and fsyncs files of its own in both.
pub fn mt_rename_workload(id: String, rng: &mut Rng) -> Workload {
    let mut t0 = Vec::new();
    let mut loc: Vec<&str> = Vec::new();
    let count = 2 + rng.index(3);
    for k in 0..count {
        let d = if rng.chance(1, 2) { "/A" } else { "/B" };
        let p = format!("{d}/r{k}");
        t0.push(Op::Create(p.clone()));
        t0.push(Op::Write { path: p.clone(), off: 0, len: 1 + rng.below(9000), tag: k as u8 + 1 });
        if rng.chance(1, 2) {
            t0.push(Op::Fsync(p));
        }
        loc.push(d);
    }
    let n = 20 + rng.index(21);
    for i in 0..n {
        let k = rng.index(count);
        let from = format!("{}/r{k}", loc[k]);
        let other = if loc[k] == "/A" { "/B" } else { "/A" };
        let to = format!("{other}/r{k}");
        match rng.below(10) {
            0 => {
                t0.push(Op::Write {
                    path: from.clone(),
                    off: rng.below(8192),
                    len: 1 + rng.below(6000),
                    tag: i as u8,
                });
                t0.push(Op::Fsync(from));
            }
            1 => t0.push(Op::Fsync(from)),
            // The whiteout it leaves is replaced by the file's next move back.
            2 => {
                t0.push(Op::Whiteout(from, to));
                loc[k] = other;
            }
            _ => {
                t0.push(Op::Rename(from, to));
                loc[k] = other;
            }
        }
    }
    let mut t1 = Vec::new();
    let mut mine: Vec<String> = Vec::new();
    let n = 20 + rng.index(21);
    for i in 0..n {
        match rng.below(10) {
            0..=5 => t1.push(Op::Fsync(if rng.chance(1, 2) { "/A".into() } else { "/B".into() })),
            6 | 7 => {
                let p = format!("{}/s{i}", if rng.chance(1, 2) { "/A" } else { "/B" });
                t1.push(Op::Create(p.clone()));
                t1.push(Op::Write { path: p.clone(), off: 0, len: 1 + rng.below(5000), tag: i as u8 });
                mine.push(p);
            }
            _ if !mine.is_empty() => t1.push(Op::Fsync(rng.pick(&mine).clone())),
            _ => t1.push(Op::Fsync("/A".into())),
        }
    }
    Workload { id, setup: Setup::Ace, threads: vec![t0, t1], knobs: Knobs::default(), fault: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ace_sets_are_sane() {
        let all = ace_seq1_all();
        assert!(all.len() > 200, "{}", all.len());
        assert!(all.iter().all(|w| w.len() == 2 && w[1].is_persist()));
        let mut rng = Rng::new(3);
        for _ in 0..50 {
            let w = ace_seq(2, &mut rng);
            assert!(w.last().is_some_and(Op::is_persist));
        }
    }

    #[test]
    fn random_generators_end_with_a_persistence_point() {
        let mut rng = Rng::new(9);
        for i in 0..20 {
            let w = random_workload(format!("random:{i}"), &mut rng);
            assert!(!w.threads[0].is_empty());
            let w = mt_rename_workload(format!("mt:{i}"), &mut rng);
            assert_eq!(w.threads.len(), 2);
            let w = mt_lanes_workload(format!("mt:{i}"), &mut rng);
            assert!(w.threads.iter().all(|t| t.len() > 2));
        }
    }
}
