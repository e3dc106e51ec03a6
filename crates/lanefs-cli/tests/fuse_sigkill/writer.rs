//! The writer process: two threads making random operations on the mount, each logged to a
//! file outside the mount before it is made (and its fsync after it returns).

use super::*;

pub(crate) use lanefs::rng::{splitmix64 as splitmix, Rng};

pub(crate) fn mix(a: u64, b: u64) -> u64 {
    splitmix(a ^ splitmix(b))
}

/// The byte that write `generation` puts at file offset `pos`: it depends on both, so a block
/// landing at the wrong offset or from another write is caught. Generation 0 is zeros (holes,
/// truncation).
pub(crate) fn pat_byte(generation: u64, pos: u64) -> u8 {
    if generation == 0 {
        return 0;
    }
    (splitmix(generation ^ splitmix(pos >> 3)) >> ((pos & 7) * 8)) as u8
}

pub(crate) fn pattern(generation: u64, off: u64, len: u64) -> Vec<u8> {
    (off..off + len).map(|p| pat_byte(generation, p)).collect()
}

// ---------------------------------------------------------------------------------------------
// The writer process.

/// The writer's log of one thread: one line per operation, written before the operation;
/// the lines after a returned fsync (`s`, `d`, `y`) are fsynced.
pub(crate) struct Log {
    pub(crate) f: File,
}

/// Wall-clock microseconds: the writer and the test compare when a writer stopped with when the
/// daemon was killed.
pub(crate) fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64
}

impl Log {
    pub(crate) fn line(&mut self, s: &str) {
        self.f.write_all(format!("{s}\n").as_bytes()).expect("writer log");
    }
    pub(crate) fn durable(&mut self, s: &str) {
        self.line(s);
        self.f.sync_data().expect("writer log fsync");
    }
    /// The thread stops: `E errno time message` (time: `now_us`).
    pub(crate) fn stop(&mut self, e: &io::Error) {
        let msg = e.to_string().replace('\n', " ");
        self.durable(&format!("E {} {} {msg}", e.raw_os_error().unwrap_or(0), now_us()));
    }
}

/// What the writer knows of its subtree: directories and files (relative to the mount) and sizes.
pub(crate) struct View {
    pub(crate) dirs: Vec<String>,
    pub(crate) files: BTreeMap<String, u64>,
}

/// The writer thread that made a name (`f<round>x<thread>n<k>`, `d...`).
pub(crate) fn owner(name: &str) -> Option<usize> {
    let (_, rest) = name.get(1..)?.split_once('x')?;
    rest.split_once('n')?.0.parse().ok()
}

/// Thread `t`'s files and directories: its subtree and its names in the shared directory.
pub(crate) fn scan(root: &Path, t: usize) -> io::Result<View> {
    let sub = format!("t{t}");
    let mut v = View { dirs: vec![sub.clone()], files: BTreeMap::new() };
    let mut stack = vec![sub, SHARED.to_string()];
    while let Some(d) = stack.pop() {
        let mut names: Vec<String> = fs::read_dir(root.join(&d))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<_>>()?;
        names.sort();
        for n in names {
            if d == SHARED && owner(&n) != Some(t) {
                continue;
            }
            let rel = format!("{d}/{n}");
            let md = fs::symlink_metadata(root.join(&rel))?;
            if md.is_dir() {
                v.dirs.push(rel.clone());
                stack.push(rel);
            } else {
                v.files.insert(rel, md.len());
            }
        }
    }
    v.dirs.sort();
    Ok(v)
}

pub(crate) fn parent_of(rel: &str) -> &str {
    &rel[..rel.rfind('/').expect("a path below a subtree")]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Create,
    Append,
    Overwrite,
    Direct,
    Truncate,
    Fsync,
    Fdatasync,
    RenameFile,
    Unlink,
    Mkdir,
    RenameDir,
    Rmdir,
    FsyncDir,
    Replace,
    Chmod,
}

impl Op {
    /// Its name in LANEFS_SIGKILL_AVOID.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Append => "append",
            Op::Overwrite => "overwrite",
            Op::Direct => "direct",
            Op::Truncate => "truncate",
            Op::Fsync => "fsync",
            Op::Fdatasync => "fdatasync",
            Op::RenameFile => "rename",
            Op::Unlink => "unlink",
            Op::Mkdir => "mkdir",
            Op::RenameDir => "dir-rename",
            Op::Rmdir => "rmdir",
            Op::FsyncDir => "fsync-dir",
            Op::Replace => "replace",
            Op::Chmod => "chmod",
        }
    }
}

/// Operation kinds left out (LANEFS_SIGKILL_AVOID, comma-separated names of `Op::name`, and
/// `dir-move`: directory renames stay in their parent), to look past a known bug.
pub(crate) fn avoided() -> Vec<String> {
    std::env::var(AVOID_ENV)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// One writer thread.
pub(crate) struct Writer<'a> {
    pub(crate) root: &'a Path,
    pub(crate) sub: String,
    pub(crate) view: View,
    pub(crate) rng: Rng,
    pub(crate) log: Log,
    pub(crate) tag: String,
    pub(crate) names: u64,
    pub(crate) gen_base: u64,
    pub(crate) gens: u64,
    pub(crate) avoid: Vec<String>,
}

impl Writer<'_> {
    pub(crate) fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub(crate) fn new_name(&mut self, dir: &str, prefix: char) -> String {
        self.names += 1;
        format!("{dir}/{prefix}{}n{}", self.tag, self.names)
    }

    pub(crate) fn any_file(&mut self) -> String {
        let i = self.rng.below(self.view.files.len() as u64) as usize;
        self.view.files.keys().nth(i).expect("a file").clone()
    }

    pub(crate) fn any_dir(&mut self) -> String {
        let i = self.rng.below(self.view.dirs.len() as u64) as usize;
        self.view.dirs[i].clone()
    }

    /// A directory for a file: one of the thread's own, or the shared one.
    pub(crate) fn file_dir(&mut self) -> String {
        if self.rng.chance(25, 100) {
            SHARED.to_string()
        } else {
            self.any_dir()
        }
    }

    pub(crate) fn draw_len(&mut self) -> u64 {
        match self.rng.below(100) {
            0..=59 => self.rng.range(1, 6000),
            60..=84 => 4096 * self.rng.range(1, 16),
            _ => self.rng.range(64 << 10, 256 << 10),
        }
    }

    pub(crate) fn write(&mut self, rel: &str, off: u64, len: u64, direct: bool) -> io::Result<()> {
        self.gens += 1;
        let generation = mix(self.gen_base, self.gens) | 1;
        self.log.line(&format!("W {rel} {off} {len} {generation}"));
        let data = pattern(generation, off, len);
        if direct {
            let f = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(self.p(rel))?;
            let mut b = AlignedBuf::new(len as usize);
            b.as_mut().copy_from_slice(&data);
            f.write_all_at(b.as_ref(), off)?;
        } else {
            let f = OpenOptions::new().write(true).open(self.p(rel))?;
            f.write_all_at(&data, off)?;
        }
        let size = self.view.files.get_mut(rel).expect("known file");
        *size = (*size).max(off + len);
        Ok(())
    }

    pub(crate) fn fsync_file(&mut self, rel: &str, data_only: bool) -> io::Result<()> {
        self.log.line(&format!("{} {rel}", if data_only { 'D' } else { 'S' }));
        let f = File::open(self.p(rel))?;
        if data_only {
            f.sync_data()?;
        } else {
            f.sync_all()?;
        }
        self.log.durable(&format!("{} {rel}", if data_only { 'd' } else { 's' }));
        if !data_only {
            // The mtime that fsync made durable (nothing has changed the file since).
            let md = f.metadata()?;
            self.log.durable(&format!("m {rel} {} {}", md.mtime(), md.mtime_nsec()));
        }
        Ok(())
    }

    pub(crate) fn fsync_dir(&mut self, rel: &str) -> io::Result<()> {
        self.log.line(&format!("Y {rel}"));
        File::open(self.p(rel))?.sync_all()?;
        self.log.durable(&format!("y {rel}"));
        Ok(())
    }

    pub(crate) fn create(&mut self, rel: &str) -> io::Result<()> {
        self.log.line(&format!("C {rel}"));
        OpenOptions::new().write(true).create_new(true).mode(0o644).open(self.p(rel))?;
        self.view.files.insert(rel.to_string(), 0);
        Ok(())
    }

    pub(crate) fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.log.line(&format!("R {from} {to}"));
        fs::rename(self.p(from), self.p(to))
    }

    pub(crate) fn choose(&mut self) -> Op {
        let nf = self.view.files.len();
        let nd = self.view.dirs.len();
        let f = |w: u64| if nf > 0 { w } else { 0 };
        let full = nf >= MAX_FILES;
        let table = [
            (Op::Create, if full { 0 } else { 10 }),
            (Op::Append, f(25)),
            (Op::Overwrite, f(12)),
            (Op::Direct, f(4)),
            (Op::Truncate, f(3)),
            (Op::Fsync, f(15)),
            (Op::Fdatasync, f(5)),
            (Op::RenameFile, f(8)),
            (Op::Unlink, f(if full { 15 } else { 4 })),
            (Op::Mkdir, if nd < MAX_DIRS { 3 } else { 0 }),
            (Op::RenameDir, if nd > 1 { 2 } else { 0 }),
            (Op::Rmdir, if nd > 1 { 2 } else { 0 }),
            (Op::FsyncDir, 6),
            (Op::Replace, f(4)),
            (Op::Chmod, f(3)),
        ];
        let table = table.map(|(op, w)| (op, if self.avoid.iter().any(|a| a == op.name()) { 0 } else { w }));
        let total: u64 = table.iter().map(|t| t.1).sum();
        let mut x = self.rng.below(total);
        for (op, w) in table {
            if x < w {
                return op;
            }
            x -= w;
        }
        unreachable!()
    }

    pub(crate) fn step(&mut self) -> io::Result<()> {
        match self.choose() {
            Op::Create => {
                let dir = self.file_dir();
                let rel = self.new_name(&dir, 'f');
                self.create(&rel)?;
                if self.rng.chance(80, 100) {
                    let len = self.draw_len();
                    self.write(&rel, 0, len, false)?;
                }
                if self.rng.chance(40, 100) {
                    self.fsync_file(&rel, false)?;
                }
            }
            Op::Append => {
                let rel = self.any_file();
                let size = self.view.files[&rel];
                if size + 4096 > MAX_FILE {
                    self.log.line(&format!("T {rel} {}", size / 4));
                    OpenOptions::new().write(true).open(self.p(&rel))?.set_len(size / 4)?;
                    self.view.files.insert(rel, size / 4);
                } else {
                    let len = self.draw_len().min(MAX_FILE - size);
                    self.write(&rel, size, len, false)?;
                }
            }
            Op::Overwrite => {
                let rel = self.any_file();
                let size = self.view.files[&rel];
                let off = self.rng.below(size + 1).min(MAX_FILE - 1);
                let len = self.draw_len().min(MAX_FILE - off);
                self.write(&rel, off, len, false)?;
            }
            Op::Direct => {
                let rel = self.any_file();
                let size = self.view.files[&rel];
                let off = (self.rng.below(size + 1) & !4095).min(MAX_FILE - 8 * 4096);
                let len = 4096 * self.rng.range(1, 8);
                self.write(&rel, off, len, true)?;
            }
            Op::Truncate => {
                let rel = self.any_file();
                let size = self.view.files[&rel];
                let len = if self.rng.chance(70, 100) {
                    self.rng.below(size + 1)
                } else {
                    (size + self.rng.range(1, 20_000)).min(MAX_FILE)
                };
                self.log.line(&format!("T {rel} {len}"));
                OpenOptions::new().write(true).open(self.p(&rel))?.set_len(len)?;
                self.view.files.insert(rel, len);
            }
            Op::Fsync => {
                let rel = self.any_file();
                self.fsync_file(&rel, false)?;
            }
            Op::Fdatasync => {
                let rel = self.any_file();
                self.fsync_file(&rel, true)?;
            }
            Op::RenameFile => {
                let from = self.any_file();
                let to = if self.view.files.len() > 1 && self.rng.chance(30, 100) {
                    // Over another file: the target's inode goes.
                    loop {
                        let t = self.any_file();
                        if t != from {
                            break t;
                        }
                    }
                } else {
                    let dir = self.file_dir();
                    self.new_name(&dir, 'f')
                };
                self.rename(&from, &to)?;
                let size = self.view.files.remove(&from).expect("known file");
                self.view.files.insert(to, size);
            }
            Op::Unlink => {
                let rel = self.any_file();
                self.log.line(&format!("U {rel}"));
                fs::remove_file(self.p(&rel))?;
                self.view.files.remove(&rel);
            }
            Op::Mkdir => {
                let parent = self.any_dir();
                let rel = self.new_name(&parent, 'd');
                self.log.line(&format!("M {rel}"));
                fs::create_dir(self.p(&rel))?;
                self.view.dirs.push(rel);
                if self.rng.chance(70, 100) {
                    self.fsync_dir(&parent)?;
                }
            }
            Op::RenameDir => {
                let from = loop {
                    let d = self.any_dir();
                    if d != self.sub {
                        break d;
                    }
                };
                let inside = format!("{from}/");
                let targets: Vec<String> = if self.avoid.iter().any(|a| a == "dir-move") {
                    vec![parent_of(&from).to_string()]
                } else {
                    self.view
                        .dirs
                        .iter()
                        .filter(|d| **d != from && !d.starts_with(&inside))
                        .cloned()
                        .collect()
                };
                let parent = targets[self.rng.below(targets.len() as u64) as usize].clone();
                let to = self.new_name(&parent, 'd');
                self.rename(&from, &to)?;
                let moved = |p: &String| {
                    if *p == from {
                        to.clone()
                    } else if let Some(rest) = p.strip_prefix(&inside) {
                        format!("{to}/{rest}")
                    } else {
                        p.clone()
                    }
                };
                self.view.dirs = self.view.dirs.iter().map(moved).collect();
                self.view.files = self.view.files.iter().map(|(p, s)| (moved(p), *s)).collect();
            }
            Op::Rmdir => {
                let empty: Vec<String> = self
                    .view
                    .dirs
                    .iter()
                    .filter(|d| **d != self.sub)
                    .filter(|d| {
                        let inside = format!("{d}/");
                        !self.view.dirs.iter().any(|x| x.starts_with(&inside))
                            && !self.view.files.keys().any(|x| x.starts_with(&inside))
                    })
                    .cloned()
                    .collect();
                if empty.is_empty() {
                    let dir = self.any_dir();
                    return self.fsync_dir(&dir);
                }
                let rel = empty[self.rng.below(empty.len() as u64) as usize].clone();
                self.log.line(&format!("X {rel}"));
                fs::remove_dir(self.p(&rel))?;
                self.view.dirs.retain(|d| *d != rel);
            }
            Op::FsyncDir => {
                let dir = self.file_dir();
                self.fsync_dir(&dir)?;
            }
            Op::Chmod => {
                let rel = self.any_file();
                let mode = MODES[self.rng.below(MODES.len() as u64) as usize];
                self.log.line(&format!("P {rel} {mode}"));
                fs::set_permissions(self.p(&rel), fs::Permissions::from_mode(mode))?;
            }
            Op::Replace => {
                // The atomic-replace idiom: write a temporary, fsync it, rename it over the
                // target, fsync the directory. The new content must then be there.
                let target = self.any_file();
                let dir = parent_of(&target).to_string();
                let tmp = self.new_name(&dir, 'f');
                self.create(&tmp)?;
                let len = self.draw_len();
                self.write(&tmp, 0, len, false)?;
                self.fsync_file(&tmp, false)?;
                self.rename(&tmp, &target)?;
                let size = self.view.files.remove(&tmp).expect("known file");
                self.view.files.insert(target, size);
                self.fsync_dir(&dir)?;
            }
        }
        Ok(())
    }
}

pub(crate) fn writer_thread(root: &Path, logdir: &Path, seed: u64, round: u64, t: usize, deadline: Instant) {
    let mut log = Log { f: File::create(logdir.join(format!("t{t}.log"))).expect("writer log") };
    let sub = format!("t{t}");
    let view = match scan(root, t) {
        Ok(v) => v,
        Err(e) => return log.stop(&e),
    };
    let mut w = Writer {
        root,
        sub,
        view,
        rng: Rng::new(splitmix(mix(mix(seed, round), t as u64 + 1))),
        log,
        tag: format!("{round}x{t}"),
        names: 0,
        gen_base: mix(mix(seed, round), 1000 + t as u64),
        gens: 0,
        avoid: avoided(),
    };
    for _ in 0..MAX_OPS {
        if Instant::now() >= deadline {
            break;
        }
        if let Err(e) = w.step() {
            return w.log.stop(&e);
        }
    }
    w.log.durable(&format!("Z {}", now_us()));
}
