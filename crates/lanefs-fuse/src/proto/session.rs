//! A FUSE session: the INIT handshake, then worker threads that take requests from the
//! transport, decode them and call the [`Filesystem`].
//!
//! Over /dev/fuse each worker owns a clone of the session's descriptor (FUSE_DEV_IOC_CLONE), so
//! the kernel hands requests to the workers with no lock between them, and a reply goes back
//! through the descriptor its request came from. A worker ends when its read says ENODEV: the
//! file system was unmounted (or the connection aborted); `run` returns once all have ended.
//!
//! Over io_uring (see [`super::uring`]) the ring workers serve every request but FORGET and
//! INTERRUPT, which the kernel still queues on /dev/fuse: the /dev/fuse workers stay for them,
//! and for what comes before the last queue is registered (or if one cannot be).

use super::abi::{self, init, opcode, Out};
use super::dev::DevFuse;
use super::reply::*;
use super::request::{decode, Header, InitIn, Op, Request, SetattrIn};
use super::spares::{Event, Queue, Spares, SpawnRequest};
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::{mpsc, Arc};

/// What a file system answers. Each method gets its request and the reply to send; every
/// request is answered exactly once (a dropped reply answers EIO).
#[allow(clippy::too_many_arguments)]
pub trait Filesystem: Send + Sync {
    /// INIT: what to ask of the kernel, from what it offers.
    fn init(&mut self, req: &Request, config: &mut KernelConfig);
    /// A handler panicked (`what` says where and why); its request was answered EIO as its
    /// reply unwound. The state behind the handlers may be half changed: the file system should
    /// stop changing anything from here on (lanefs shuts down: every later request fails, the
    /// next mount recovers what was made durable).
    fn panicked(&self, what: &str);
    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry);
    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64);
    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr);
    fn statx(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, mask: u32, reply: ReplyStatx);
    fn setattr(&self, req: &Request, ino: INodeNo, attr: &SetattrIn, reply: ReplyAttr);
    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData);
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    );
    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry);
    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty);
    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty);
    fn symlink(&self, req: &Request, parent: INodeNo, name: &OsStr, target: &Path, reply: ReplyEntry);
    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    );
    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry);
    fn open(&self, req: &Request, ino: INodeNo, flags: i32, reply: ReplyOpen);
    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        read_flags: u32,
        flags: i32,
        reply: ReplyData,
    );
    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: u32,
        flags: i32,
        reply: ReplyWrite,
    );
    fn flush(&self, req: &Request, ino: INodeNo, fh: FileHandle, reply: ReplyEmpty);
    fn release(&self, req: &Request, ino: INodeNo, fh: FileHandle, flags: i32, reply: ReplyEmpty);
    fn fsync(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty);
    fn opendir(&self, req: &Request, ino: INodeNo, flags: i32, reply: ReplyOpen);
    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory);
    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    );
    fn releasedir(&self, req: &Request, ino: INodeNo, fh: FileHandle, flags: i32, reply: ReplyEmpty);
    fn fsyncdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty);
    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs);
    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    );
    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr);
    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr);
    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty);
    fn access(&self, req: &Request, ino: INodeNo, mask: u32, reply: ReplyEmpty);
    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    );
    /// open(2) of directory `parent` with O_TMPFILE: a regular file with no name, answered as
    /// a create (its entry and its open handle).
    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, umask: u32, flags: i32, reply: ReplyCreate);
    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    );
    fn lseek(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek);
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: u32,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    );
    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        reply: ReplyWrite,
    );
}

/// What INIT settles: the kernel's offer, the file system's choice and limits.
#[derive(Debug, Clone)]
pub struct KernelConfig {
    offered: u64,
    wanted: u64,
    max_write: u32,
    max_readahead: u32,
    max_background: u16,
}

impl KernelConfig {
    fn new(offered: u64, max_readahead: u32) -> KernelConfig {
        KernelConfig { offered, wanted: 0, max_write: 128 << 10, max_readahead, max_background: 16 }
    }

    /// What the kernel offers (`abi::init` bits).
    pub fn capabilities(&self) -> u64 {
        self.offered
    }

    /// Asks for `flags`; only what the kernel offers is taken.
    pub fn add_capabilities(&mut self, flags: u64) {
        self.wanted |= flags & self.offered;
    }

    /// What was asked for (and offered).
    pub fn wanted(&self) -> u64 {
        self.wanted
    }

    pub fn set_max_write(&mut self, n: u32) {
        self.max_write = n.max(4096);
    }

    pub fn set_max_readahead(&mut self, n: u32) {
        self.max_readahead = self.max_readahead.min(n);
    }

    pub fn set_max_background(&mut self, n: u16) {
        self.max_background = n.max(1);
    }

    /// `struct fuse_init_out` (64 bytes).
    fn reply_body(&self) -> Vec<u8> {
        let flags = self.wanted | init::INIT_EXT;
        let max_pages = if flags & init::MAX_PAGES != 0 { (self.max_write / 4096).max(1) as u16 } else { 0 };
        let mut o = Out::with_capacity(64);
        o.u32(abi::KERNEL_VERSION).u32(abi::KERNEL_MINOR_VERSION).u32(self.max_readahead).u32(flags as u32);
        o.u16(self.max_background).u16(self.max_background * 3 / 4).u32(self.max_write);
        // time_gran 1: nanosecond times.
        o.u32(1).u16(max_pages).u16(0).u32((flags >> 32) as u32).u32(0).bytes(&[0; 24]);
        debug_assert_eq!(o.buf.len(), 64);
        o.buf
    }
}

/// Tells the kernel of changes it did not ask for (FUSE notifications).
#[derive(Clone)]
pub struct Notifier {
    dev: Arc<DevFuse>,
    spares: Arc<Spares>,
}

impl Notifier {
    /// Has the kernel write `ino`'s dirty pages from `off` on back (and drop its cached pages
    /// there) and waits until it has: `Ok(false)` if this thread may not wait for the kernel
    /// (see [`super::spares`]: the WRITEs need a worker of its queue, and none could be
    /// spared), and nothing was asked.
    pub fn write_back(&self, ino: INodeNo, off: u64) -> io::Result<bool> {
        let Some(_waiting) = self.spares.wait_for_kernel() else { return Ok(false) };
        match self.inval_inode(ino, off.min(i64::MAX as u64) as i64, 0) {
            // The kernel holds no such inode: it has no pages of it either.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(true),
            r => r.map(|()| true),
        }
    }

    /// Drops the kernel's cached attributes of `ino` and its pages in `[off, off + len)` (`off`
    /// -1: the attributes only; `len` 0: to the end).
    pub fn inval_inode(&self, ino: INodeNo, off: i64, len: i64) -> io::Result<()> {
        let mut o = Out::with_capacity(24);
        o.u64(ino.0).u64(off as u64).u64(len as u64);
        self.dev.write_reply(0, abi::NOTIFY_INVAL_INODE, &[&o.buf])
    }

    /// Sends notifications (`send`) from a thread of its own and waits for them at most `wait`
    /// (`None`: not at all). A notification may need a lock the kernel holds while it waits for
    /// the request being served (dropping an entry takes its directory's lock), so it cannot be
    /// sent from the handler itself; waiting a bounded time orders it before the reply whenever
    /// no such lock is held, and the reply always goes.
    pub fn aside(&self, wait: Option<std::time::Duration>, send: impl FnOnce(&Notifier) + Send + 'static) {
        let n = self.clone();
        let (tx, rx) = mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new().name("lanefs-inval".into()).spawn(move || {
            send(&n);
            let _ = tx.send(());
        });
        if let (Ok(_), Some(wait)) = (spawned, wait) {
            let _ = rx.recv_timeout(wait);
        }
    }

    /// Drops the kernel's cached entry `name` in `parent`.
    pub fn inval_entry(&self, parent: INodeNo, name: &OsStr) -> io::Result<()> {
        let name = std::os::unix::ffi::OsStrExt::as_bytes(name);
        let mut o = Out::with_capacity(16);
        o.u64(parent.0).u32(name.len() as u32).u32(0);
        self.dev.write_reply(0, abi::NOTIFY_INVAL_ENTRY, &[&o.buf, name, &[0]])
    }
}

/// Tells the serving loop that a worker ended, however it ended.
struct SayEnded(mpsc::Sender<Event>);

impl Drop for SayEnded {
    fn drop(&mut self) {
        let _ = self.0.send(Event::Ended);
    }
}

/// How requests reach the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// read(2) and writev(2) on /dev/fuse.
    DevFuse,
    /// FUSE over io_uring where the kernel offers it (else /dev/fuse), `per_queue` workers on
    /// each CPU's queue.
    Uring { per_queue: usize },
}

impl Transport {
    /// FUSE over io_uring where the kernel offers it, for a mount of `threads` workers: at
    /// least two workers per CPU queue, so that one that blocks (an fsync) leaves the CPU's
    /// other requests another.
    pub fn uring_for(threads: usize) -> Transport {
        Transport::Uring { per_queue: threads.div_ceil(super::uring::queue_count()).max(2) }
    }

    /// The CPU of each ring worker this transport starts once io_uring is agreed on.
    fn ring_cpus(&self) -> Vec<usize> {
        match *self {
            Transport::Uring { per_queue } => (0..super::uring::queue_count())
                .flat_map(|q| std::iter::repeat_n(q, per_queue.max(1)))
                .collect(),
            Transport::DevFuse => Vec::new(),
        }
    }

    /// How many ring workers this transport may start.
    pub fn ring_workers(&self) -> usize {
        self.ring_cpus().len()
    }
}

/// What the session serves with, once INIT has settled it, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportInUse {
    pub uring: bool,
    pub why: String,
}

/// A mounted FUSE connection and the file system that serves it.
pub struct Session<F: Filesystem> {
    fs: F,
    dev: Arc<DevFuse>,
    /// The workers per queue, and spares for those that wait for the kernel.
    spares: Arc<Spares>,
    /// Requests come only from the owner and root (`allow_root`): the kernel lets everyone
    /// through (`allow_other`), this filters.
    root_and_owner: Option<u32>,
}

impl<F: Filesystem> Session<F> {
    /// A session on `dev`, a /dev/fuse descriptor whose mount is up.
    pub fn new(fs: F, dev: DevFuse, root_and_owner: Option<u32>) -> Session<F> {
        let spares = Arc::new(Spares::new(super::uring::queue_count()));
        Session { fs, dev: Arc::new(dev), spares, root_and_owner }
    }

    /// The count of workers per queue, where the mount sets how spares are put to work.
    pub fn spares(&self) -> Arc<Spares> {
        self.spares.clone()
    }

    pub fn notifier(&self) -> Notifier {
        Notifier { dev: self.dev.clone(), spares: self.spares.clone() }
    }

    /// Answers INIT (and any INIT before it of a newer major version); whether io_uring was
    /// agreed on.
    fn handshake(&mut self, buf: &mut [u8], uring: bool) -> io::Result<Option<bool>> {
        loop {
            let n = match self.dev.read(buf) {
                Ok(n) => n,
                Err(e) if retry(&e) => continue,
                // Unmounted before the kernel's INIT was read (a SIGTERM right after the
                // mount: its handler unmounts): nothing to serve, which is a clean end, as the
                // workers' ENODEV is.
                Err(e) if unmounted(&e) => return Ok(None),
                Err(e) => return Err(e),
            };
            let h = Header::parse(&buf[..n]).ok_or_else(|| bad("a request shorter than its header"))?;
            let (arg, rest) = split(&h, &buf[..n]);
            let Ok(Op::Init(i)) = decode(&h, arg, rest) else {
                return Err(bad(&format!("the first request was opcode {}, not INIT", h.opcode)));
            };
            let dev = self.dev.clone();
            let sink = dev.as_sink();
            if i.major > abi::KERNEL_VERSION {
                // The kernel sends INIT again with our major.
                let mut o = Out::default();
                o.u32(abi::KERNEL_VERSION).u32(abi::KERNEL_MINOR_VERSION);
                ReplyInit::new(h.unique, &sink).init(&o.buf);
                continue;
            }
            if i.major < abi::KERNEL_VERSION || i.minor < 31 {
                ReplyInit::new(h.unique, &sink).error(Errno(libc::EPROTO));
                return Err(bad(&format!("kernel FUSE protocol {}.{} is older than 7.31", i.major, i.minor)));
            }
            return Ok(Some(self.init(&h, &i, &sink, uring)));
        }
    }

    fn init(&mut self, h: &Header, i: &InitIn, sink: &dyn Sink, uring: bool) -> bool {
        let mut config = KernelConfig::new(i.flags, i.max_readahead);
        self.fs.init(&Request::new(*h), &mut config);
        if uring {
            config.add_capabilities(init::OVER_IO_URING);
        }
        ReplyInit::new(h.unique, sink).init(&config.reply_body());
        config.wanted() & init::OVER_IO_URING != 0
    }

    /// Serves with `threads` /dev/fuse workers, or over io_uring if `transport` asks and the
    /// kernel offers it, until the file system is unmounted; `said` is told which, and why,
    /// once INIT has settled it.
    ///
    /// Long, and kept in one piece: the workers are threads of one scope that borrow the
    /// session, started by two closures that the serving loop at the end also calls for
    /// spares; split up, each part would need the scope, both closures and the event channel.
    pub fn run(
        mut self,
        threads: usize,
        max_write: u32,
        transport: Transport,
        said: &mut dyn FnMut(&TransportInUse),
    ) -> io::Result<()> {
        let size = (max_write as usize + 4096).max(abi::MIN_READ_BUFFER);
        let mut buf = vec![0u8; size];
        let ask = matches!(transport, Transport::Uring { .. });
        let Some(uring) = self.handshake(&mut buf, ask)? else { return Ok(()) };
        said(&TransportInUse { uring, why: why(ask, uring) });
        // The /dev/fuse workers stay whatever the transport: over io_uring they see FORGET and
        // INTERRUPT only (idle threads cost a buffer each), but if a queue cannot be registered
        // the kernel keeps every request on /dev/fuse, and they serve it at full width.
        let dev_workers = threads.max(1);
        let mut devs = vec![self.dev.clone()];
        for _ in 1..dev_workers {
            match self.dev.clone_dev() {
                Ok(d) => devs.push(Arc::new(d)),
                // Unmounted meanwhile: the workers started so far read ENODEV and end cleanly.
                Err(e) if unmounted(&e) => break,
                Err(e) => return Err(e),
            }
        }
        let rings = if uring { transport.ring_cpus() } else { Vec::new() };
        let payload = (max_write as usize).max(abi::MIN_READ_BUFFER);
        let fd = std::os::fd::AsRawFd::as_raw_fd(self.dev.as_file());
        let this = &self;
        let (events, heard) = mpsc::channel::<Event>();
        this.spares.set_spawner(Some(events.clone()));
        std::thread::scope(|s| {
            // Each worker says when it ends (the serving loop below counts them down), and
            // when it serves, if a spare was asked for.
            let dev_worker = |i: usize, dev: Arc<DevFuse>, ready: Option<mpsc::SyncSender<bool>>| {
                let ended = events.clone();
                std::thread::Builder::new().name(format!("fuse-{i}")).spawn_scoped(s, move || {
                    let _ended = SayEnded(ended);
                    let _serving = this.spares.serving(Queue::Dev);
                    if let Some(r) = ready {
                        let _ = r.send(true);
                    }
                    this.serve(&dev, size)
                })
            };
            let ring_worker = |i: usize, cpu: usize, ready: Option<mpsc::SyncSender<bool>>| {
                let ended = events.clone();
                std::thread::Builder::new().name(format!("fuse-ring-{cpu}-{i}")).spawn_scoped(s, move || {
                    let _ended = SayEnded(ended);
                    let pinned = super::uring::pin_to(cpu);
                    let mut serving = None;
                    let mut ready = ready;
                    let mut registered = || {
                        // Unpinned, its WRITEs could go to another CPU's queue: it does not
                        // count, and never waits for the kernel.
                        if pinned {
                            serving = Some(this.spares.serving(Queue::Ring(cpu)));
                        }
                        if let Some(r) = ready.take() {
                            let _ = r.send(pinned);
                        }
                    };
                    let mut ring = super::uring::RingWorker::new(fd, cpu as u16, payload)?;
                    ring.run(&|h, arg, rest, sink| this.request(h, arg, rest, sink), &mut registered)
                        .map_err(|e| io::Error::new(e.kind(), format!("FUSE ring worker on CPU {cpu}: {e}")))
                })
            };
            let mut workers = Vec::new();
            for (i, dev) in devs.into_iter().enumerate() {
                workers.push(dev_worker(i, dev, None));
            }
            for (i, cpu) in rings.iter().copied().enumerate() {
                workers.push(ring_worker(i, cpu, None));
            }
            // Until every worker has ended: start the spares asked for (`super::spares`).
            let mut live = workers.iter().filter(|w| w.is_ok()).count();
            while live > 0 {
                match heard.recv() {
                    Ok(Event::Ended) => live -= 1,
                    Ok(Event::Spawn(SpawnRequest { queue, ready })) => {
                        let i = workers.len();
                        // A spare that cannot start fails only the wait that asked for it (its
                        // `ready` says no, or is dropped): not the session.
                        let w = match queue {
                            Queue::Dev => {
                                this.dev.clone_dev().and_then(|dev| dev_worker(i, Arc::new(dev), Some(ready)))
                            }
                            Queue::Ring(cpu) => ring_worker(i, cpu, Some(ready)),
                        };
                        match w {
                            Ok(h) => {
                                live += 1;
                                workers.push(Ok(h));
                            }
                            Err(e) => {
                                eprintln!("lanefs: a spare FUSE worker for {queue:?} did not start: {e}")
                            }
                        }
                    }
                    Err(_) => break,
                }
            }
            this.spares.set_spawner(None);
            let mut first_err = None;
            for w in workers {
                let r = match w {
                    Ok(h) => h.join().unwrap_or_else(|_| Err(bad("a worker panicked"))),
                    Err(e) => Err(e),
                };
                if let (Err(e), None) = (r, &first_err) {
                    first_err = Some(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        })
    }

    /// One worker's loop over `dev`.
    fn serve(&self, dev: &DevFuse, size: usize) -> io::Result<()> {
        let mut buf = vec![0u8; size];
        let sink = dev.as_sink();
        loop {
            let n = match dev.read(&mut buf) {
                Ok(n) => n,
                Err(e) if retry(&e) => continue,
                Err(e) if unmounted(&e) => return Ok(()),
                Err(e) => return Err(io::Error::new(e.kind(), format!("reading /dev/fuse: {e}"))),
            };
            let Some(h) = Header::parse(&buf[..n]) else { continue };
            let (arg, rest) = split(&h, &buf[..n]);
            self.request(&h, arg, rest, &sink);
        }
    }

    /// Decodes and serves one request (shared by the transports).
    pub fn request(&self, h: &Header, arg: &[u8], rest: &[u8], sink: &dyn Sink) {
        match decode(h, arg, rest) {
            Ok(op) => {
                if let Some(owner) = self.root_and_owner {
                    if h.uid != owner && h.uid != 0 && expects_reply(h.opcode) {
                        return ReplyEmpty::new(h.unique, sink).error(Errno::EACCES);
                    }
                }
                // A panic must not take the worker with it: with FUSE over io_uring its queue
                // has no other worker, and every later request on that CPU would wait forever
                // (a hang, where an error is what the application should get). The reply, moved
                // into the handler, answered EIO as it unwound (`Replier`'s drop).
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    dispatch(&self.fs, &Request::new(*h), op, rest, sink)
                }));
                if let Err(payload) = served {
                    let why = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic with no message".into());
                    self.fs.panicked(&format!("request {} (opcode {}): {why}", h.unique, h.opcode));
                }
            }
            Err(_) if expects_reply(h.opcode) => ReplyEmpty::new(h.unique, sink).error(Errno::EINVAL),
            Err(_) => {}
        }
    }
}

/// Why the session serves with what it does.
fn why(asked: bool, uring: bool) -> String {
    let enabled = super::uring::enabled_by_kernel();
    match (asked, uring, enabled) {
        (_, true, _) => format!("io_uring ({} queues, one per CPU)", super::uring::queue_count()),
        (false, false, _) => "/dev/fuse (asked for with -o transport=dev)".into(),
        (true, false, Some(false)) => {
            "/dev/fuse: FUSE over io_uring is off in the kernel (as root: echo Y > \
             /sys/module/fuse/parameters/enable_uring)"
                .into()
        }
        (true, false, Some(true)) => "/dev/fuse: the kernel did not offer FUSE over io_uring at INIT".into(),
        (true, false, None) => {
            "/dev/fuse: this kernel has no FUSE over io_uring (Linux 6.14 and later)".into()
        }
    }
}

fn expects_reply(op: u32) -> bool {
    !matches!(op, opcode::FORGET | opcode::BATCH_FORGET | opcode::INTERRUPT)
}

/// Reads that may simply be tried again: a signal, or a request the kernel took back
/// (interrupted before it was read).
/// The connection is gone: the file system was unmounted (a read, or a clone of the
/// descriptor, says ENODEV). For a session that is a clean end, whenever it comes.
fn unmounted(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENODEV)
}

fn retry(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::ENOENT))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A request read from /dev/fuse, split as `decode` takes it: the fixed argument struct and
/// the rest, without the header and without the extensions at the end.
fn split<'a>(h: &Header, req: &'a [u8]) -> (&'a [u8], &'a [u8]) {
    let end = (h.len as usize).min(req.len());
    let body = h.without_extensions(req.get(abi::IN_HEADER_LEN..end).unwrap_or(&[]));
    body.split_at(abi::arg_size(h.opcode).min(body.len()))
}

/// Calls the handler of `op`: one arm per operation, the counterpart of `request::decode_op`'s
/// table, kept as one for the same reason.
fn dispatch<F: Filesystem>(fs: &F, req: &Request, op: Op<'_>, rest: &[u8], sink: &dyn Sink) {
    let (u, ino) = (req.unique(), INodeNo(req.nodeid()));
    match op {
        Op::Lookup { name } => fs.lookup(req, ino, name, ReplyEntry::new(u, sink)),
        Op::Forget { nlookup } => fs.forget(req, ino, nlookup),
        Op::BatchForget { count } => {
            for one in rest.chunks_exact(16).take(count as usize) {
                let mut b = abi::Bytes::new(one);
                if let (Some(n), Some(c)) = (b.u64(), b.u64()) {
                    fs.forget(req, INodeNo(n), c);
                }
            }
        }
        Op::Getattr { fh } => fs.getattr(req, ino, fh.map(FileHandle), ReplyAttr::new(u, sink)),
        Op::Statx { fh, mask } => fs.statx(req, ino, fh.map(FileHandle), mask, ReplyStatx::new(u, sink)),
        Op::Setattr(a) => fs.setattr(req, ino, &a, ReplyAttr::new(u, sink)),
        Op::Readlink => fs.readlink(req, ino, ReplyData::new(u, sink)),
        Op::Symlink { name, target } => {
            fs.symlink(req, ino, name, Path::new(target), ReplyEntry::new(u, sink))
        }
        Op::Mknod { name, mode, rdev, umask } => {
            fs.mknod(req, ino, name, mode, umask, rdev, ReplyEntry::new(u, sink))
        }
        Op::Mkdir { name, mode, umask } => fs.mkdir(req, ino, name, mode, umask, ReplyEntry::new(u, sink)),
        Op::Unlink { name } => fs.unlink(req, ino, name, ReplyEmpty::new(u, sink)),
        Op::Rmdir { name } => fs.rmdir(req, ino, name, ReplyEmpty::new(u, sink)),
        Op::Rename { name, newdir, newname, flags } => {
            fs.rename(req, ino, name, INodeNo(newdir), newname, flags, ReplyEmpty::new(u, sink))
        }
        Op::Link { oldnodeid, newname } => {
            fs.link(req, INodeNo(oldnodeid), ino, newname, ReplyEntry::new(u, sink))
        }
        Op::Open { flags } => fs.open(req, ino, flags, ReplyOpen::new(u, sink)),
        Op::Read(r) => fs.read(
            req,
            ino,
            FileHandle(r.fh),
            r.offset,
            r.size,
            r.read_flags,
            r.flags,
            ReplyData::new(u, sink),
        ),
        Op::Write { fh, offset, data, write_flags, flags } => {
            fs.write(req, ino, FileHandle(fh), offset, data, write_flags, flags, ReplyWrite::new(u, sink))
        }
        Op::Statfs => fs.statfs(req, ino, ReplyStatfs::new(u, sink)),
        Op::Release { fh, flags } => fs.release(req, ino, FileHandle(fh), flags, ReplyEmpty::new(u, sink)),
        Op::Fsync { fh, datasync } => fs.fsync(req, ino, FileHandle(fh), datasync, ReplyEmpty::new(u, sink)),
        Op::Setxattr { name, value, flags } => {
            fs.setxattr(req, ino, name, value, flags, ReplyEmpty::new(u, sink))
        }
        Op::Getxattr { name, size } => fs.getxattr(req, ino, name, size, ReplyXattr::new(u, sink)),
        Op::Listxattr { size } => fs.listxattr(req, ino, size, ReplyXattr::new(u, sink)),
        Op::Removexattr { name } => fs.removexattr(req, ino, name, ReplyEmpty::new(u, sink)),
        Op::Flush { fh } => fs.flush(req, ino, FileHandle(fh), ReplyEmpty::new(u, sink)),
        // A second INIT is a protocol error.
        Op::Init(_) => ReplyEmpty::new(u, sink).error(Errno(libc::EPROTO)),
        Op::Opendir { flags } => fs.opendir(req, ino, flags, ReplyOpen::new(u, sink)),
        Op::Readdir(r) => {
            fs.readdir(req, ino, FileHandle(r.fh), r.offset, ReplyDirectory::new(u, sink, r.size))
        }
        Op::Readdirplus(r) => {
            fs.readdirplus(req, ino, FileHandle(r.fh), r.offset, ReplyDirectoryPlus::new(u, sink, r.size))
        }
        Op::Releasedir { fh, flags } => {
            fs.releasedir(req, ino, FileHandle(fh), flags, ReplyEmpty::new(u, sink))
        }
        Op::Fsyncdir { fh, datasync } => {
            fs.fsyncdir(req, ino, FileHandle(fh), datasync, ReplyEmpty::new(u, sink))
        }
        Op::Access { mask } => fs.access(req, ino, mask, ReplyEmpty::new(u, sink)),
        Op::Create { name, mode, umask, flags } => {
            fs.create(req, ino, name, mode, umask, flags, ReplyCreate::new(u, sink))
        }
        Op::Tmpfile { mode, umask, flags } => {
            fs.tmpfile(req, ino, mode, umask, flags, ReplyCreate::new(u, sink))
        }
        // Requests are not cancelled: each finishes, and the kernel drops an answer it no
        // longer wants.
        Op::Interrupt => {}
        Op::Destroy => ReplyEmpty::new(u, sink).ok(),
        Op::Ioctl { fh, flags, cmd, arg, in_data, out_size } => {
            fs.ioctl(req, ino, FileHandle(fh), flags, cmd, arg, in_data, out_size, ReplyIoctl::new(u, sink))
        }
        Op::Fallocate { fh, offset, length, mode } => {
            fs.fallocate(req, ino, FileHandle(fh), offset, length, mode, ReplyEmpty::new(u, sink))
        }
        Op::Lseek { fh, offset, whence } => {
            fs.lseek(req, ino, FileHandle(fh), offset, whence, ReplyLseek::new(u, sink))
        }
        Op::CopyFileRange { fh_in, off_in, nodeid_out, fh_out, off_out, len } => fs.copy_file_range(
            req,
            ino,
            FileHandle(fh_in),
            off_in,
            INodeNo(nodeid_out),
            FileHandle(fh_out),
            off_out,
            len,
            ReplyWrite::new(u, sink),
        ),
        Op::Unknown => ReplyEmpty::new(u, sink).error(Errno::ENOSYS),
    }
}
