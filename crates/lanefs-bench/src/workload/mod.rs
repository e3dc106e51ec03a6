//! The workloads: FxMark's micro-benchmarks, three filebench personalities, and `untar`, which
//! replays what tar and git do to a source tree.
//!
//! Names and meaning follow the FxMark paper (Min et al., "Understanding Manycore Scalability of
//! File Systems", USENIX ATC'16, table 3) and its published sources: the first letter says data
//! (D) or metadata (M), the second the operation (R read, W write), the third the object (O
//! overwrite, A append, S sync, B block, P path, D directory, C create, U unlink, R rename), the
//! last the sharing level: L(ow) = every thread has its own file or directory, M(edium) = threads
//! share one file or directory but touch different parts of it. Each workload's doc comment says
//! what one counted operation is.
//!
//! Layout inside a run's directory: `t{N}/` is thread N's private directory, `shared/` is the
//! shared directory, `shared.dat` the shared file. Everything is created by `prepare` or by a
//! worker before the clock starts, and removed by the runner afterwards.
//!
//! Workloads that would exhaust something if run forever (appends grow a file, creates fill a
//! directory, unlinks empty a pool) stop for housekeeping (`Step::Maintain`): truncate, remove or
//! refill. The runner keeps that time out of both the latency histogram and the throughput.

mod filebench;
mod fxmark;
mod programs;

use crate::hist::Histogram;
use crate::target::{File, OpenOptions, Target};
use filebench::{Credits, FileSet, Oltp, Personality};
use fxmark::{Append, Block, ListDir, Lookup, NameOp, Names};
use lanefs::device::AlignedBuf;
use programs::{source_tree, Member, Unpack, TREE_FILES};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// One benchmark workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// Overwrite one 4 KiB block of a private file, again and again (buffered `pwrite` at
    /// offset 0 of `t{N}/data`). One op = one 4 KiB write. The ideal, contention-free write.
    Dwol,
    /// Overwrite disjoint 4 KiB blocks of one shared file: thread N rewrites the first block of
    /// its own 8 MiB region of `shared.dat` (FxMark's layout). Opened with O_DIRECT where the
    /// target supports it, so that writes reach the file system together instead of queueing on
    /// the page cache's inode lock; buffered otherwise (the run's note says so). One op = one
    /// 4 KiB write. Shows whether writers to disjoint ranges of one file are serialized.
    Dwom,
    /// Append 4 KiB blocks to a private file (no fsync). One op = one 4 KiB append; at 64 MiB the
    /// file is truncated to 0 outside the clock. Tests block allocation.
    Dwal,
    /// Append 4 KiB to a private file and fsync it. One op = append + fsync; fsync latency is
    /// reported separately. (FxMark's source overwrites block 0 before each fsync; appending
    /// also makes every fsync commit a size change and a new block, the journaling case that
    /// lanefs's node logging targets.) Wraps at 64 MiB like DWAL.
    Dwsl,
    /// Read one 4 KiB block of a private file (buffered `pread` at offset 0). One op = one read.
    Drbl,
    /// Read 4 KiB blocks of one shared file: thread N reads the first block of its own 8 MiB
    /// region of `shared.dat`. One op = one read.
    Drbm,
    /// Path lookup of a private file: stat of `t{N}/0/0/0/0`, a file four levels below the
    /// thread's directory (FxMark's path). One op = one stat.
    Mrpl,
    /// Path lookup in a shared tree: stat of a pseudo-random file of a five-level tree with
    /// fan-out 8 (4,096 directories, 32,768 files, shared by all threads). One op = one stat.
    Mrpm,
    /// Enumerate a private directory of 1,000 empty files. One op = one complete readdir.
    Mrdl,
    /// Enumerate one shared directory of 1,000 empty files. One op = one complete readdir.
    Mrdm,
    /// Create empty files in a private directory. One op = one create (open O_CREAT|O_EXCL and
    /// close). After 10,000 files the thread removes them outside the clock.
    Mwcl,
    /// Create empty files in one shared directory (names distinct per thread). As MWCL.
    Mwcm,
    /// Unlink empty files from a private directory. Each thread unlinks a pool of 10,000
    /// pre-created files and refills it outside the clock. One op = one unlink.
    Mwul,
    /// Unlink empty files from one shared directory (each thread its own names). As MWUL.
    Mwum,
    /// Rename a file within a private directory (`f{k}` to `f{k+1}`). One op = one rename.
    Mwrl,
    /// Move files from a private directory into one shared directory (`t{N}/f{k}` to
    /// `shared/t{N}-{k}`), so every rename inserts into the shared directory. A pool of 10,000
    /// files per thread is moved back outside the clock when used up. One op = one rename.
    Mwrm,
    /// Filebench varmail: a mail server over a flat shared directory of 1,000 small files (mean
    /// 16 KiB, 80 % present at start; each thread owns its share of the names so that threads
    /// never race on one file). A thread cycles through four operations, each one counted op:
    /// delete a file; create a file, append (mean 16 KiB) and fsync; open, read it whole, append
    /// and fsync; open and read it whole. Fsync latency is reported.
    Varmail,
    /// Filebench fileserver: 1,000 files (mean 128 KiB, 80 % present) in directories of 20,
    /// names owned per thread. A thread cycles through five operations, each one counted op:
    /// create a file and write it whole (1 MiB I/Os); append (mean 16 KiB) to a file; read a file
    /// whole; delete a file; stat a file.
    Fileserver,
    /// Filebench oltp, reduced to its I/O shape: random 4 KiB reads (3 in 4) and writes (1 in 4)
    /// on one 64 MiB `db.dat`, and a log writer appending 256 KiB records to `log.dat` opened
    /// with O_DSYNC (a circular 16 MiB log). As in filebench, where the log writer blocks on a
    /// semaphore fed by the database threads, the log is paced by the work: one record per 100
    /// database I/Os. With N >= 2 threads, thread 0 is the log writer and the other N - 1 do the
    /// database I/O; with one thread, that thread writes the record itself after every 100th
    /// I/O (inside that op). One counted op = one database I/O, so ops/s means the same at every
    /// thread count; "fsync" latency is that of the O_DSYNC log writes. The database writes are
    /// buffered (filebench marks them dsync): the log is the durability point, as with a
    /// write-ahead log.
    Oltp,
    /// A source tree unpacked and checked, as `tar xf` and then `git status` do it. Each thread
    /// unpacks a private tree of 3,072 files (source-tree sizes: 300 B to 250 KiB, most a few
    /// KiB) in 8 directories of 8 subdirectories: each directory made, each file created
    /// (O_EXCL), written whole, its times set (utimensat) and closed. Then it checks the tree:
    /// a readdir of every directory and a stat of every file, in archive order. One op = one
    /// member unpacked, or one member checked. After the check the tree is removed outside the
    /// clock and the next one unpacked.
    Untar,
}

use Workload::*;

impl Workload {
    pub const ALL: [Workload; 20] = [
        Dwol, Dwom, Dwal, Dwsl, Drbl, Drbm, Mrpl, Mrpm, Mrdl, Mrdm, Mwcl, Mwcm, Mwul, Mwum, Mwrl, Mwrm,
        Varmail, Fileserver, Oltp, Untar,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dwol => "DWOL",
            Dwom => "DWOM",
            Dwal => "DWAL",
            Dwsl => "DWSL",
            Drbl => "DRBL",
            Drbm => "DRBM",
            Mrpl => "MRPL",
            Mrpm => "MRPM",
            Mrdl => "MRDL",
            Mrdm => "MRDM",
            Mwcl => "MWCL",
            Mwcm => "MWCM",
            Mwul => "MWUL",
            Mwum => "MWUM",
            Mwrl => "MWRL",
            Mwrm => "MWRM",
            Varmail => "varmail",
            Fileserver => "fileserver",
            Oltp => "oltp",
            Untar => "untar",
        }
    }

    /// Whether the workload syncs, and so reports fsync latency percentiles.
    pub fn has_fsync(self) -> bool {
        matches!(self, Dwsl | Varmail | Oltp)
    }

    fn is_filebench(self) -> bool {
        matches!(self, Varmail | Fileserver | Oltp)
    }

    /// FxMark's micro-benchmarks.
    fn is_fxmark(self) -> bool {
        !self.is_filebench() && self != Untar
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Workload::ALL.into_iter().find(|w| w.name().eq_ignore_ascii_case(s.trim())).ok_or_else(|| {
            let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
            format!("unknown workload {s:?}; known: {}, or all, fxmark, filebench, programs", names.join(","))
        })
    }
}

/// A `--workload` value: comma-separated names (any case), or the groups `all`, `fxmark` (the 16
/// micro-benchmarks), `filebench` (varmail, fileserver, oltp) and `programs` (untar and
/// fileserver: what real programs do). Duplicates are dropped, order
/// is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadList(pub Vec<Workload>);

impl std::str::FromStr for WorkloadList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out: Vec<Workload> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let group: Vec<Workload> = match part.to_ascii_lowercase().as_str() {
                "all" => Workload::ALL.to_vec(),
                "fxmark" => Workload::ALL.into_iter().filter(|w| w.is_fxmark()).collect(),
                "programs" => vec![Untar, Fileserver],
                "filebench" => Workload::ALL.into_iter().filter(|w| w.is_filebench()).collect(),
                _ => vec![part.parse()?],
            };
            for w in group {
                if !out.contains(&w) {
                    out.push(w);
                }
            }
        }
        if out.is_empty() {
            return Err("no workload given".into());
        }
        Ok(WorkloadList(out))
    }
}

const BLOCK: usize = 4096;
/// Per-thread region of the shared file in DWOM and DRBM (FxMark's PRIVATE_REGION_SIZE).
const REGION: u64 = 8 << 20;
/// Appending workloads truncate their file when it reaches this size (or less on a nearly full
/// file system: see [`append_wrap`]).
const APPEND_WRAP: u64 = 64 << 20;
/// The least an appending workload's file grows to before it wraps.
const MIN_APPEND_WRAP: u64 = 1 << 20;
const DIR_ENTRIES: usize = 1000;
const NAME_POOL: usize = 10_000;
const TREE_DEPTH: usize = 5;
const TREE_FANOUT: usize = 8;
/// Components of MRPL's path below the thread's directory (FxMark: `$root/$id/0/0/0/0`).
const MRPL_DEPTH: usize = 4;
const MAIL_FILES: usize = 1000;
const SERVER_FILES: usize = 1000;
const SERVER_DIR_WIDTH: usize = 20;
const OLTP_DB: u64 = 64 << 20;
const OLTP_LOG_RECORD: usize = 256 << 10;
const OLTP_LOG_WRAP: u64 = 16 << 20;
/// Database I/Os per log record.
const OLTP_LOG_EVERY: u64 = 100;
/// Chunk of whole-file reads and writes (filebench's iosize for fileserver and varmail).
const WHOLE_IO: usize = 1 << 20;

/// What a worker's operation asks of the runner.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Done,
    /// Nothing countable happened (a waiting oltp log writer): neither an op nor a latency.
    Uncounted,
    /// The op completed, and before the next one the worker needs housekeeping that is not
    /// part of the measurement (see the module doc).
    Maintain,
}

/// One thread's state: its open files, buffers, counters.
pub(crate) trait Worker {
    /// One counted operation. Sync latencies inside it go to `fsync`.
    fn op(&mut self, fsync: &mut Histogram) -> io::Result<Step>;
    fn maintain(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What workers of one run share: the target, the run directory and the sizing.
pub(crate) struct Env<'a> {
    pub target: &'a dyn Target,
    /// The run's directory, relative to the target root.
    pub dir: PathBuf,
    pub threads: usize,
    /// Fraction of the default file-set sizes (1.0 = the sizes in the doc comments).
    pub scale: f64,
    pub notes: Mutex<Vec<String>>,
}

impl Env<'_> {
    fn scaled(&self, n: usize, min: usize) -> usize {
        ((n as f64 * self.scale) as usize).max(min)
    }
    fn scaled_bytes(&self, n: u64, min: u64) -> u64 {
        (((n as f64 * self.scale) as u64).max(min) / BLOCK as u64) * BLOCK as u64
    }
    fn private(&self, tid: usize) -> PathBuf {
        self.dir.join(format!("t{tid}"))
    }
    fn shared(&self) -> PathBuf {
        self.dir.join("shared")
    }
    fn note(&self, s: String) {
        let mut n = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        if !n.contains(&s) {
            n.push(s);
        }
    }
}

/// A prepared run: files are in place; each thread asks for its worker.
pub(crate) struct Plan {
    w: Workload,
    /// DWOM: whether O_DIRECT opens work on this target.
    direct: bool,
    region: u64,
    fanout: usize,
    dir_entries: usize,
    pool: usize,
    db_size: u64,
    /// DWAL, DWSL: the size at which each thread's file is truncated.
    append_wrap: u64,
    /// oltp: log records owed by the database threads to the log writer.
    log_credits: Credits,
    /// untar: the archive every thread unpacks.
    members: Vec<Member>,
}

/// Per-thread pseudo-random numbers: lanefs's one deterministic generator, so every target
/// sees the same sequence of operations.
pub(crate) use lanefs::rng::Rng;

fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::InvalidInput | io::ErrorKind::Unsupported)
        || e.raw_os_error() == Some(libc::EINVAL)
        || e.raw_os_error() == Some(libc::EOPNOTSUPP)
}

fn buffer(len: usize, fill: u8) -> io::Result<AlignedBuf> {
    let mut b = AlignedBuf::new(len)?;
    b.fill(fill);
    Ok(b)
}

/// Writes `len` bytes of pattern to a new file at `path`.
fn make_file(t: &dyn Target, path: &Path, len: u64) -> io::Result<()> {
    let f = t.open(path, OpenOptions::create_new())?;
    fill_file(&*f, len)
}

fn fill_file(f: &dyn File, len: u64) -> io::Result<()> {
    let chunk = buffer(WHOLE_IO, 0x5A)?;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(chunk.len() as u64) as usize;
        f.write_all_at(&chunk[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

fn tree_path(root: &Path, digits: &[usize]) -> PathBuf {
    let mut p = root.to_path_buf();
    for d in digits {
        p.push(d.to_string());
    }
    p
}

/// Creates the run's files. Everything per thread that threads can build in parallel is left to
/// [`Plan::worker`], which also runs before the clock starts.
pub(crate) fn prepare(w: Workload, env: &Env) -> io::Result<Plan> {
    let t = env.target;
    let mut plan = Plan {
        w,
        direct: false,
        region: env.scaled_bytes(REGION, 64 << 10),
        fanout: ((TREE_FANOUT as f64 * env.scale.powf(1.0 / TREE_DEPTH as f64)).round() as usize)
            .clamp(2, TREE_FANOUT),
        dir_entries: env.scaled(DIR_ENTRIES, 10),
        pool: env.scaled(NAME_POOL, 10),
        db_size: env.scaled_bytes(OLTP_DB, 1 << 20),
        append_wrap: APPEND_WRAP,
        log_credits: Credits::default(),
        members: Vec::new(),
    };
    for tid in 0..env.threads {
        t.mkdir(&env.private(tid))?;
    }
    t.mkdir(&env.shared())?;
    match w {
        Dwom | Drbm => {
            let path = env.dir.join("shared.dat");
            let f = t.open(&path, OpenOptions::create_new())?;
            fill_file(&*f, plan.region * env.threads as u64)?;
            f.fsync()?;
            drop(f);
            if w == Dwom {
                plan.direct = probe_direct(t, &path)?;
                if !plan.direct {
                    env.note("O_DIRECT not supported here: DWOM ran buffered".into());
                }
            }
        }
        Mrpm => {
            // fanout^4 directories with fanout files each, as FxMark's MRPM pre_work.
            let root = env.shared();
            let f = plan.fanout;
            let mut digits = vec![0usize; TREE_DEPTH];
            for level in 1..TREE_DEPTH {
                for i in 0..f.pow(level as u32) {
                    let mut x = i;
                    for d in (0..level).rev() {
                        digits[d] = x % f;
                        x /= f;
                    }
                    t.mkdir(&tree_path(&root, &digits[..level]))?;
                }
            }
            for i in 0..f.pow(TREE_DEPTH as u32) {
                let mut x = i;
                for d in (0..TREE_DEPTH).rev() {
                    digits[d] = x % f;
                    x /= f;
                }
                t.create(&tree_path(&root, &digits))?;
            }
        }
        Mrdm => {
            for i in 0..plan.dir_entries {
                t.create(&env.shared().join(format!("e{i}")))?;
            }
        }
        Dwal | Dwsl => {
            if let Ok((_, free)) = t.space() {
                let wrap = append_wrap(free, env.threads);
                if wrap < APPEND_WRAP {
                    plan.append_wrap = wrap;
                    env.note(format!(
                        "appends wrap at {} KiB, not {} MiB: half the free space ({} MiB) over {} thread(s)",
                        wrap >> 10,
                        APPEND_WRAP >> 20,
                        free >> 20,
                        env.threads
                    ));
                }
            }
        }
        Untar => plan.members = source_tree(env.scaled(TREE_FILES, 64)),
        Oltp => {
            make_file(t, &env.dir.join("db.dat"), plan.db_size)?;
            make_file(t, &env.dir.join("log.dat"), 0)?;
        }
        _ => {}
    }
    Ok(plan)
}

/// Whether `path` can be opened and written with O_DIRECT (some file systems refuse the open,
/// others the first I/O).
fn probe_direct(t: &dyn Target, path: &Path) -> io::Result<bool> {
    let f = match t.open(path, OpenOptions::read_write().direct(true)) {
        Ok(f) => f,
        Err(e) if is_unsupported(&e) => return Ok(false),
        Err(e) => return Err(e),
    };
    let b = buffer(BLOCK, 0x5A)?;
    match f.write_at(&b, 0) {
        Ok(_) => Ok(true),
        Err(e) if is_unsupported(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

impl Plan {
    /// Thread `tid`'s worker; runs on that thread before the clock starts.
    pub(crate) fn worker<'a>(&'a self, env: &'a Env<'a>, tid: usize) -> io::Result<Box<dyn Worker + 'a>> {
        let t = env.target;
        let mine = env.private(tid);
        let seed = tid as u64 + 1;
        Ok(match self.w {
            Dwol | Drbl => {
                let path = mine.join("data");
                make_file(t, &path, BLOCK as u64)?;
                let file = t.open(&path, OpenOptions::read_write())?;
                Box::new(Block { file, buf: buffer(BLOCK, tid as u8)?, off: 0, write: self.w == Dwol })
            }
            Dwom | Drbm => {
                let file = t.open(
                    &env.dir.join("shared.dat"),
                    OpenOptions::read_write().direct(self.w == Dwom && self.direct),
                )?;
                let off = self.region * tid as u64;
                Box::new(Block { file, buf: buffer(BLOCK, tid as u8)?, off, write: self.w == Dwom })
            }
            Dwal | Dwsl => {
                let file = t.open(&mine.join("data"), OpenOptions::create_new())?;
                Box::new(Append {
                    file,
                    buf: buffer(BLOCK, tid as u8)?,
                    off: 0,
                    wrap: self.append_wrap,
                    sync: self.w == Dwsl,
                })
            }
            Mrpl => {
                let mut p = mine;
                for _ in 0..MRPL_DEPTH - 1 {
                    p.push("0");
                    t.mkdir(&p)?;
                }
                p.push("0");
                t.create(&p)?;
                Box::new(Lookup { t, root: p, fanout: 0, rng: Rng::new(seed) })
            }
            Mrpm => Box::new(Lookup { t, root: env.shared(), fanout: self.fanout, rng: Rng::new(seed) }),
            Mrdl => {
                for i in 0..self.dir_entries {
                    t.create(&mine.join(format!("e{i}")))?;
                }
                Box::new(ListDir { t, dir: mine })
            }
            Mrdm => Box::new(ListDir { t, dir: env.shared() }),
            Mwcl => Box::new(Names::new(t, mine, "f".into(), self.pool, NameOp::Create)),
            Mwcm => Box::new(Names::new(t, env.shared(), format!("t{tid}-"), self.pool, NameOp::Create)),
            Mwul | Mwum => {
                let (dir, prefix) =
                    if self.w == Mwul { (mine, "f".into()) } else { (env.shared(), format!("t{tid}-")) };
                let mut n = Names::new(t, dir, prefix, self.pool, NameOp::Unlink);
                n.maintain()?;
                Box::new(n)
            }
            Mwrl => {
                t.create(&mine.join("f0"))?;
                Box::new(Names::new(t, mine, "f".into(), 0, NameOp::RenameInPlace))
            }
            Mwrm => {
                let to = env.shared().join(format!("t{tid}-"));
                let mut n = Names::new(t, mine, "f".into(), self.pool, NameOp::MoveTo(to));
                n.populate()?;
                Box::new(n)
            }
            Varmail => Box::new(FileSet::new(env, tid, Personality::Varmail)?),
            Fileserver => Box::new(FileSet::new(env, tid, Personality::Fileserver)?),
            Oltp => Box::new(Oltp::new(env, tid, self.db_size, &self.log_credits)?),
            Untar => {
                let w = Unpack::new(t, mine, &self.members, tid);
                t.mkdir(&w.tree())?;
                Box::new(w)
            }
        })
    }
}

/// The size at which appending threads truncate their files: [`APPEND_WRAP`], or on a nearly
/// full file system half of the `free` bytes over the `threads` (whole blocks, at least
/// [`MIN_APPEND_WRAP`]), so that the run's own files, each at its largest at once, leave room
/// for the cleaner and measure appends rather than ENOSPC.
fn append_wrap(free: u64, threads: usize) -> u64 {
    let share = free / 2 / threads.max(1) as u64 / BLOCK as u64 * BLOCK as u64;
    share.clamp(MIN_APPEND_WRAP, APPEND_WRAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>(), Ok(w));
            assert_eq!(w.name().to_lowercase().parse::<Workload>(), Ok(w));
        }
        assert!("DWXX".parse::<Workload>().unwrap_err().contains("known"));
    }

    #[test]
    fn append_wrap_fits_the_free_space() {
        assert_eq!(append_wrap(100 << 30, 2), APPEND_WRAP);
        assert_eq!(append_wrap(256 << 20, 2), APPEND_WRAP);
        // 45 MiB free, two threads: 11.25 MiB each, whole blocks.
        assert_eq!(append_wrap(45 << 20, 2), (45 << 20) / 4);
        assert_eq!(append_wrap((45 << 20) + 100, 3) % BLOCK as u64, 0);
        assert_eq!(append_wrap(0, 1), MIN_APPEND_WRAP);
    }

    #[test]
    fn workload_lists() {
        let l: WorkloadList = "dwol, MWCM,dwol".parse().unwrap();
        assert_eq!(l.0, vec![Dwol, Mwcm]);
        assert_eq!("all".parse::<WorkloadList>().unwrap().0.len(), 20);
        assert_eq!("fxmark".parse::<WorkloadList>().unwrap().0.len(), 16);
        assert_eq!("filebench".parse::<WorkloadList>().unwrap().0, vec![Varmail, Fileserver, Oltp]);
        assert!("".parse::<WorkloadList>().is_err());
        assert!("dwol,nope".parse::<WorkloadList>().is_err());
    }

    #[test]
    fn rng_is_spread() {
        let mut r = Rng::new(1);
        let mut seen = [0u32; 8];
        for _ in 0..8000 {
            seen[r.below(8) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
    }
}
