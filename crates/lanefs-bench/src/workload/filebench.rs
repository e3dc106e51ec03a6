//! Three filebench personalities: varmail, fileserver and oltp, each a worker over a file set.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Personality {
    Varmail,
    Fileserver,
}

/// varmail and fileserver: a thread's share of a file set, with the sizes of present files.
pub(super) struct FileSet<'a> {
    pub(super) t: &'a dyn Target,
    pub(super) kind: Personality,
    /// Path of each slot.
    pub(super) paths: Vec<PathBuf>,
    /// Present slots and their sizes; absent slots. Random picks, O(1) moves between the two.
    pub(super) present: Vec<(usize, u64)>,
    pub(super) absent: Vec<usize>,
    pub(super) rng: Rng,
    pub(super) step: usize,
    pub(super) buf: AlignedBuf,
}

impl<'a> FileSet<'a> {
    pub(super) fn new(env: &'a Env<'a>, tid: usize, kind: Personality) -> io::Result<Self> {
        let t = env.target;
        let total = match kind {
            Personality::Varmail => env.scaled(MAIL_FILES, 8 * env.threads),
            Personality::Fileserver => env.scaled(SERVER_FILES, 8 * env.threads),
        };
        let per = total.div_ceil(env.threads);
        let mut paths = Vec::with_capacity(per);
        for slot in 0..per {
            let name = format!("t{tid}-{slot}");
            paths.push(match kind {
                // varmail's dirwidth is a million: one flat directory.
                Personality::Varmail => env.shared().join(name),
                Personality::Fileserver => {
                    // Directories of SERVER_DIR_WIDTH entries over the global slot numbers.
                    let dir = env.shared().join(format!("d{}", (tid * per + slot) / SERVER_DIR_WIDTH));
                    match t.mkdir(&dir) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(e),
                    }
                    dir.join(name)
                }
            });
        }
        let mut s = FileSet {
            t,
            kind,
            paths,
            present: Vec::new(),
            absent: Vec::new(),
            rng: Rng::new(tid as u64 + 101),
            step: 0,
            buf: buffer(WHOLE_IO, 0xA5)?,
        };
        // filebench prealloc=80: 80 % of the files exist at the start.
        for slot in 0..per {
            if slot * 10 < per * 8 {
                let size = s.file_size();
                make_file(t, &s.paths[slot], size)?;
                s.present.push((slot, size));
            } else {
                s.absent.push(slot);
            }
        }
        Ok(s)
    }

    /// A new file's size: uniform around filebench's mean (16 KiB varmail, 128 KiB fileserver).
    fn file_size(&mut self) -> u64 {
        match self.kind {
            Personality::Varmail => 4096 + self.rng.below(24 << 10),
            Personality::Fileserver => (64 << 10) + self.rng.below(128 << 10),
        }
    }

    /// An append's size: uniform in 1..32 KiB, mean 16 KiB (filebench meanappendsize).
    fn append_size(&mut self) -> u64 {
        1 + self.rng.below(32 << 10)
    }

    fn pick_present(&mut self) -> Option<usize> {
        (!self.present.is_empty()).then(|| self.rng.below(self.present.len() as u64) as usize)
    }

    fn read_whole(&mut self, f: &dyn File, size: u64) -> io::Result<()> {
        let mut off = 0;
        while off < size {
            let n = f.read_at(&mut self.buf, off)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shorter than written"));
            }
            off += n as u64;
        }
        Ok(())
    }

    fn append(&mut self, f: &dyn File, size: u64) -> io::Result<u64> {
        let n = self.append_size();
        f.write_all_at(&self.buf[..n as usize], size)?;
        Ok(size + n)
    }

    fn sync(f: &dyn File, fsync: &mut Histogram) -> io::Result<()> {
        let t0 = Instant::now();
        f.fsync()?;
        fsync.record(t0.elapsed());
        Ok(())
    }

    fn delete(&mut self) -> io::Result<bool> {
        let Some(i) = self.pick_present() else { return Ok(false) };
        let (slot, _) = self.present.swap_remove(i);
        self.t.unlink(&self.paths[slot])?;
        self.absent.push(slot);
        Ok(true)
    }

    /// Creates a file in a free slot: varmail appends and fsyncs, fileserver writes it whole.
    fn create(&mut self, fsync: &mut Histogram) -> io::Result<bool> {
        if self.absent.is_empty() {
            return Ok(false);
        }
        let i = self.rng.below(self.absent.len() as u64) as usize;
        let slot = self.absent.swap_remove(i);
        let f = self.t.open(&self.paths[slot], OpenOptions::create_new())?;
        let size = match self.kind {
            Personality::Varmail => {
                let size = self.append(&*f, 0)?;
                Self::sync(&*f, fsync)?;
                size
            }
            Personality::Fileserver => {
                let size = self.file_size();
                fill_file(&*f, size)?;
                size
            }
        };
        self.present.push((slot, size));
        Ok(true)
    }

    /// Opens a present file, reads it whole when `read`, appends when `append`, fsyncs when
    /// `sync`.
    fn touch(&mut self, read: bool, append: bool, sync: Option<&mut Histogram>) -> io::Result<bool> {
        let Some(i) = self.pick_present() else { return Ok(false) };
        let (slot, size) = self.present[i];
        let opts = if append { OpenOptions::read_write() } else { OpenOptions::read() };
        let f = self.t.open(&self.paths[slot], opts)?;
        if read {
            self.read_whole(&*f, size)?;
        }
        if append {
            self.present[i].1 = self.append(&*f, size)?;
        }
        if let Some(h) = sync {
            Self::sync(&*f, h)?;
        }
        Ok(true)
    }
}

impl Worker for FileSet<'_> {
    fn op(&mut self, fsync: &mut Histogram) -> io::Result<Step> {
        let step = self.step;
        self.step += 1;
        // When a step finds no file to act on (or no free slot), the set has drifted to an
        // extreme; creating (or deleting) brings it back, and still counts as that op.
        let done = match (self.kind, step % if self.kind == Personality::Varmail { 4 } else { 5 }) {
            (Personality::Varmail, 0) => self.delete()?,
            (Personality::Varmail, 1) => self.create(fsync)?,
            (Personality::Varmail, 2) => self.touch(true, true, Some(fsync))?,
            (Personality::Varmail, _) => self.touch(true, false, None)?,
            (Personality::Fileserver, 0) => self.create(fsync)?,
            (Personality::Fileserver, 1) => self.touch(false, true, None)?,
            (Personality::Fileserver, 2) => self.touch(true, false, None)?,
            (Personality::Fileserver, 3) => self.delete()?,
            (Personality::Fileserver, _) => match self.pick_present() {
                Some(i) => {
                    self.t.stat(&self.paths[self.present[i].0])?;
                    true
                }
                None => false,
            },
        };
        if !done && !self.create(fsync)? {
            self.delete()?;
        }
        Ok(Step::Done)
    }
}

/// A counting semaphore for oltp's log pacing.
#[derive(Default)]
pub(crate) struct Credits {
    pub(super) owed: Mutex<u64>,
    pub(super) ready: Condvar,
}

impl Credits {
    fn post(&self) {
        *self.owed.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.ready.notify_one();
    }
    /// Takes one credit, waiting at most `wait` (so the runner can stop the thread).
    fn take(&self, wait: Duration) -> bool {
        let g = self.owed.lock().unwrap_or_else(|e| e.into_inner());
        let (mut g, _) =
            self.ready.wait_timeout_while(g, wait, |n| *n == 0).unwrap_or_else(|e| e.into_inner());
        if *g == 0 {
            return false;
        }
        *g -= 1;
        true
    }
}

/// oltp: the log writer (thread 0 of several), a database thread, or one thread doing both.
pub(super) struct Oltp<'a> {
    pub(super) log: Option<Box<dyn File>>,
    pub(super) db: Option<Box<dyn File>>,
    pub(super) credits: &'a Credits,
    pub(super) rng: Rng,
    pub(super) buf: AlignedBuf,
    pub(super) db_blocks: u64,
    pub(super) log_off: u64,
    /// Database I/Os left before the next log record.
    pub(super) until_log: u64,
}

impl<'a> Oltp<'a> {
    pub(super) fn new(env: &Env, tid: usize, db_size: u64, credits: &'a Credits) -> io::Result<Oltp<'a>> {
        let t = env.target;
        let log = tid == 0;
        let db = tid > 0 || env.threads == 1;
        Ok(Oltp {
            log: if log {
                Some(t.open(&env.dir.join("log.dat"), OpenOptions::read_write().dsync(true))?)
            } else {
                None
            },
            db: if db { Some(t.open(&env.dir.join("db.dat"), OpenOptions::read_write())?) } else { None },
            credits,
            rng: Rng::new(tid as u64 + 7),
            buf: buffer(OLTP_LOG_RECORD, tid as u8)?,
            db_blocks: db_size / BLOCK as u64,
            log_off: 0,
            until_log: OLTP_LOG_EVERY,
        })
    }

    fn log_write(log: &dyn File, buf: &[u8], off: &mut u64, fsync: &mut Histogram) -> io::Result<()> {
        let t0 = Instant::now();
        log.write_all_at(buf, *off)?;
        fsync.record(t0.elapsed());
        // A circular log: rewrite from the start once it is full.
        *off = (*off + buf.len() as u64) % OLTP_LOG_WRAP;
        Ok(())
    }
}

impl Worker for Oltp<'_> {
    fn op(&mut self, fsync: &mut Histogram) -> io::Result<Step> {
        let Some(db) = &self.db else {
            // The log writer: one record per credit, else report an idle wait.
            let log = self.log.as_deref().ok_or_else(|| io::Error::other("oltp worker without a file"))?;
            if !self.credits.take(Duration::from_millis(5)) {
                return Ok(Step::Uncounted);
            }
            Self::log_write(log, &self.buf, &mut self.log_off, fsync)?;
            return Ok(Step::Uncounted);
        };
        let off = self.rng.below(self.db_blocks) * BLOCK as u64;
        if self.rng.below(4) == 0 {
            db.write_all_at(&self.buf[..BLOCK], off)?;
        } else {
            db.read_at(&mut self.buf[..BLOCK], off)?;
        }
        self.until_log -= 1;
        if self.until_log == 0 {
            self.until_log = OLTP_LOG_EVERY;
            match &self.log {
                Some(log) => Self::log_write(&**log, &self.buf, &mut self.log_off, fsync)?,
                None => self.credits.post(),
            }
        }
        Ok(Step::Done)
    }
}
