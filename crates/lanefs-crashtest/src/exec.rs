//! Runs workload operations on a mounted lanefs and records them in the [`History`].
//!
//! Each operation notes the write-log length before it starts; after it returns, the thread
//! that ran it records what changed (under the history lock). An fsync takes its promises when
//! it starts, from what was recorded by then — so in a multi-threaded run it promises exactly
//! the operations that had returned before it was called — and files them when it returns.

use super::ops::{pattern, split, xattr_value, Op};
use super::oracle::{read_file_state, Acked, FileState, History, Id, OpRecord, Promise};
use lanefs::{Attr, FileKind, Fs};
use parking_lot::Mutex;

/// What an operation runs against.
pub struct Exec<'a> {
    /// The file system under test.
    pub fs: &'a Fs,
    /// The write-log length now.
    pub events: &'a (dyn Fn() -> usize + Sync),
    /// Device errors so far (calls that returned an error).
    pub io_errors: &'a (dyn Fn() -> u64 + Sync),
    /// The history the operations record into, for the oracle.
    pub hist: &'a Mutex<History>,
    /// The thread running (its index in the workload).
    pub thread: usize,
    /// Findings made while running (an I/O error not reported to the caller, ...).
    pub findings: &'a Mutex<Vec<String>>,
    /// Inodes opened by `open`, by the path they were opened as.
    pub handles: std::cell::RefCell<std::collections::HashMap<String, lanefs::Ino>>,
}

fn parent_and_name(path: &str) -> Result<(&str, &[u8]), String> {
    split(path).map(|(p, n)| (p, n.as_bytes())).ok_or_else(|| format!("{path}: no name"))
}

impl Exec<'_> {
    fn resolve(&self, path: &str) -> Result<Attr, String> {
        self.fs.resolve(path).map_err(|e| format!("{path}: {e}"))
    }

    fn state(&self, a: &Attr) -> Result<FileState, String> {
        let a = self.fs.getattr(a.ino).map_err(|e| format!("getattr: {e}"))?;
        read_file_state(self.fs, &a)
    }

    /// Runs `op`, records it, and returns its result.
    pub fn run(&self, op: &Op) -> Result<(), String> {
        let ev = (self.events)();
        let errs = (self.io_errors)();
        let r = self.run_inner(op, ev);
        let ev_end = (self.events)();
        let device_failed = (self.io_errors)() > errs;
        if device_failed && r.is_ok() {
            self.findings.lock().push(format!(
                "thread {} `{op}`: the device returned an error during the call, but the call succeeded",
                self.thread
            ));
        }
        self.hist.lock().log.push(OpRecord {
            thread: self.thread,
            ev_start: ev,
            ev_end,
            text: op.to_string(),
            result: r.clone(),
        });
        r
    }

    /// Re-reads a file after a data operation and records its state if it changed (also after
    /// an error: a write may change memory and then fail in writeback).
    fn record_file(&self, ev: usize, a: &Attr) {
        if let Ok(st) = self.state(a) {
            self.hist.lock().set_file(ev, Id::of(a), st);
        }
    }

    fn run_inner(&self, op: &Op, ev: usize) -> Result<(), String> {
        let fs = self.fs;
        let e = |r: lanefs::Result<()>| r.map_err(|e| e.to_string());
        match op {
            Op::Create(path) | Op::Mkdir(path) | Op::Symlink(_, path) => self.run_create(op, path, ev),
            Op::Link(from, to) => {
                let src = self.resolve(from)?;
                let (pp, name) = parent_and_name(to)?;
                let parent = self.resolve(pp)?;
                e(fs.link(src.ino, parent.ino, name).map(|_| ()))?;
                self.hist.lock().set_entry(ev, Id::of(&parent), name, Some(Id::of(&src)));
                Ok(())
            }
            Op::Unlink(path) | Op::Rmdir(path) => {
                let (pp, name) = parent_and_name(path)?;
                let parent = self.resolve(pp)?;
                match op {
                    Op::Unlink(_) => e(fs.unlink(parent.ino, name))?,
                    _ => e(fs.rmdir(parent.ino, name))?,
                }
                self.hist.lock().set_entry(ev, Id::of(&parent), name, None);
                Ok(())
            }
            Op::Exchange(a, b) => self.run_exchange(a, b, ev),
            Op::Rename(from, to) => self.run_rename(from, to, false, ev),
            Op::Whiteout(from, to) => self.run_rename(from, to, true, ev),
            Op::Open(path) => {
                if self.handles.borrow().contains_key(path) {
                    return Err(format!("{path}: already open"));
                }
                let a = self.resolve(path)?;
                e(fs.open_ino(a.ino).map(|_| ()))?;
                self.handles.borrow_mut().insert(path.clone(), a.ino);
                Ok(())
            }
            Op::Close(path) => {
                let ino =
                    self.handles.borrow_mut().remove(path).ok_or_else(|| format!("{path}: not open"))?;
                e(fs.release(ino))
            }
            Op::Write { path, .. }
            | Op::Truncate { path, .. }
            | Op::Falloc { path, .. }
            | Op::SetXattr { path, .. }
            | Op::RemoveXattr { path, .. }
            | Op::Chmod { path, .. } => self.run_file_op(op, path, ev),
            Op::Fsync(path) | Op::Fdatasync(path) => {
                let a = self.resolve(path)?;
                let datasync = matches!(op, Op::Fdatasync(_));
                let promises = self.hist.lock().promise_fsync(Id::of(&a), datasync);
                e(fs.fsync(a.ino, datasync))?;
                self.acknowledge(op, promises);
                Ok(())
            }
            // Cleaning makes nothing durable that the oracle may count on (it checkpoints only
            // when it finds a victim): no promise, only crash states in the middle of it.
            Op::Clean => e(fs.clean().map(|_| ())),
            Op::Sleep(ms) => {
                std::thread::sleep(std::time::Duration::from_millis((*ms).min(1000)));
                Ok(())
            }
            Op::Sync => {
                let promises = self.hist.lock().promise_all();
                e(fs.sync())?;
                self.acknowledge(op, promises);
                Ok(())
            }
        }
    }

    /// Files the promises of an fsync or sync `op` that returned, with the write-log length now.
    fn acknowledge(&self, op: &Op, promises: Vec<Promise>) {
        let ev_end = (self.events)();
        let op = self.label(op);
        self.hist.lock().acked.push(Acked { ev_end, op, promises });
    }

    /// A create, mkdir or symlink at `path`: a new inode, its name, and (not for a directory)
    /// its contents.
    fn run_create(&self, op: &Op, path: &str, ev: usize) -> Result<(), String> {
        let fs = self.fs;
        let (pp, name) = parent_and_name(path)?;
        let parent = self.resolve(pp)?;
        let a = match op {
            Op::Create(_) => fs.create(parent.ino, name, 0o644, 0, 0),
            Op::Mkdir(_) => fs.mkdir(parent.ino, name, 0o755, 0, 0),
            Op::Symlink(target, _) => fs.symlink(parent.ino, name, target.as_bytes(), 0, 0),
            _ => unreachable!("run_create of {op}"),
        }
        .map_err(|e| e.to_string())?;
        let id = Id::of(&a);
        let st = if a.kind == FileKind::Dir { None } else { self.state(&a).ok() };
        let mut h = self.hist.lock();
        h.new_inode(id, a.kind);
        h.set_entry(ev, Id::of(&parent), name, Some(id));
        if let Some(st) = st {
            h.set_file(ev, id, st);
        }
        Ok(())
    }

    /// The parent directories and names of the two paths of a rename, in that order (each path
    /// split, then each parent resolved).
    fn both_parents<'p>(&self, a: &'p str, b: &'p str) -> Result<[(Attr, &'p [u8]); 2], String> {
        let (sp, sname) = parent_and_name(a)?;
        let (dp, dname) = parent_and_name(b)?;
        let sdir = self.resolve(sp)?;
        let ddir = self.resolve(dp)?;
        Ok([(sdir, sname), (ddir, dname)])
    }

    /// rename(2) with RENAME_EXCHANGE of `a` and `b`.
    fn run_exchange(&self, a: &str, b: &str, ev: usize) -> Result<(), String> {
        let fs = self.fs;
        let [(sdir, sname), (ddir, dname)] = self.both_parents(a, b)?;
        let x = fs.lookup(sdir.ino, sname).map_err(|e| format!("{a}: {e}"))?;
        let y = fs.lookup(ddir.ino, dname).map_err(|e| format!("{b}: {e}"))?;
        fs.rename(sdir.ino, sname, ddir.ino, dname, lanefs::RenameFlags::EXCHANGE)
            .map_err(|e| e.to_string())?;
        if x.ino == y.ino {
            return Ok(());
        }
        let (sd, dd) = (Id::of(&sdir), Id::of(&ddir));
        let mut h = self.hist.lock();
        let v = h.set_entries(ev, &[(sd, sname, Some(Id::of(&y))), (dd, dname, Some(Id::of(&x)))]);
        h.note_rename((sd, sname.to_vec()), v[0], (dd, dname.to_vec()), v[1]);
        Ok(())
    }

    /// rename(2) of `from` to `to`, with RENAME_WHITEOUT when `whiteout` (the source name then
    /// holds a new character device 0:0).
    fn run_rename(&self, from: &str, to: &str, whiteout: bool, ev: usize) -> Result<(), String> {
        let fs = self.fs;
        let [(sdir, sname), (ddir, dname)] = self.both_parents(from, to)?;
        let src = fs.lookup(sdir.ino, sname).map_err(|e| format!("{from}: {e}"))?;
        let dst = fs.lookup(ddir.ino, dname).ok();
        let flags = if whiteout { lanefs::RenameFlags::WHITEOUT } else { lanefs::RenameFlags::empty() };
        fs.rename(sdir.ino, sname, ddir.ino, dname, flags).map_err(|e| e.to_string())?;
        if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
            // Two names of one inode: rename does nothing (and leaves no whiteout).
            return Ok(());
        }
        let left = if whiteout { Some(self.whiteout_at(from, &sdir, sname)?) } else { None };
        let (sd, dd) = (Id::of(&sdir), Id::of(&ddir));
        let mut h = self.hist.lock();
        if let Some((w, _)) = &left {
            h.new_inode(Id::of(w), w.kind);
        }
        let v = h.set_entries(
            ev,
            &[(sd, sname, left.as_ref().map(|(w, _)| Id::of(w))), (dd, dname, Some(Id::of(&src)))],
        );
        if let Some((w, st)) = left {
            h.set_file(ev, Id::of(&w), st);
        }
        h.note_rename((sd, sname.to_vec()), v[0], (dd, dname.to_vec()), v[1]);
        Ok(())
    }

    /// The whiteout a rename of `from` left as `name` in `dir`, and its state; an error if it is
    /// not a character device 0:0.
    fn whiteout_at(&self, from: &str, dir: &Attr, name: &[u8]) -> Result<(Attr, FileState), String> {
        let w = self.fs.lookup(dir.ino, name).map_err(|e| format!("{from}: whiteout: {e}"))?;
        if w.kind != FileKind::CharDevice || w.rdev != 0 {
            return Err(format!(
                "{from}: the whiteout is a {:?} {:#x}, not a character device 0:0",
                w.kind, w.rdev
            ));
        }
        let st = self.state(&w)?;
        Ok((w, st))
    }

    /// An operation on the file at `path` (data, size, xattrs, mode): its new state is recorded
    /// whatever the result.
    fn run_file_op(&self, op: &Op, path: &str, ev: usize) -> Result<(), String> {
        let fs = self.fs;
        let a = self.resolve(path)?;
        let r = match op {
            Op::Write { off, len, tag, .. } => {
                fs.write_at(a.ino, *off, &pattern(*tag, *off, *len)).map(|_| ())
            }
            Op::Truncate { size, .. } => fs.truncate(a.ino, *size),
            Op::Falloc { mode, off, len, .. } => fs.fallocate(a.ino, mode.flags(), *off, *len),
            Op::SetXattr { name, len, tag, .. } => {
                fs.setxattr(a.ino, name.as_bytes(), &xattr_value(*tag, *len), lanefs::XattrFlags::empty())
            }
            Op::RemoveXattr { name, .. } => fs.removexattr(a.ino, name.as_bytes()),
            Op::Chmod { mode, .. } => {
                fs.setattr(a.ino, &lanefs::SetAttr { mode: Some(*mode), ..Default::default() }).map(|_| ())
            }
            _ => unreachable!("run_file_op of {op}"),
        };
        if a.kind != FileKind::Dir || !matches!(op, Op::Chmod { .. }) {
            self.record_file(ev, &a);
        }
        r.map_err(|e| e.to_string())
    }

    fn label(&self, op: &Op) -> String {
        let n = self.hist.lock().log.len();
        format!("{op} (thread {}, op #{n})", self.thread)
    }
}
