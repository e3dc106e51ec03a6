//! Mounting and unmounting: `lanefs mount` and `lanefs umount`.
//!
//! A mount takes an exclusive flock on the image, opens the file system (recovering from a
//! crash), mounts it with FUSE and serves requests on N worker threads, each reading its own
//! cloned /dev/fuse descriptor. SIGTERM, SIGINT and SIGHUP unmount it (lazily if it is busy);
//! once the kernel lets go, a final checkpoint makes everything durable and the lock is released.
//!
//! The image's lock is held by a mount (a second `lanefs mount` of the same image meets it):
//! - If the image is mounted (a lanefs mount in /proc/self/mountinfo has it as its source), the
//!   new mount is what the kernel makes of a second mount of one device: the same file system at
//!   a second place. As root it is a bind mount of the first, with the per-mount flags (ro,
//!   nosuid, nodev, noexec, noatime) the new options ask for, and `lanefs mount` exits 0 saying
//!   so; otherwise it fails at once, naming where the image is mounted.
//! - If it is not, its daemon is finishing: `umount` and `fusermount3 -u` return before the final
//!   checkpoint, and scripts (fstests among them) mount again at once. The new mount says that
//!   it waits, and waits for the lock, up to [`RELEASE_WAIT`].
//!
//! Without `--foreground` the command re-executes itself as a daemon in a new session and waits
//! for it to say that the mount is up, or why it failed: errors reach the caller before it
//! detaches, and so do notes (the wait above). `lanefs umount` unmounts with fusermount3 and then
//! waits for the daemon's final checkpoint (it waits for the image lock), so an image is complete
//! once it returns; if the file system is still mounted elsewhere (a bind), there is nothing to
//! wait for yet.
//!
//! A worker's request that stays in flight past `stuck_request_secs` is logged (see
//! [`crate::inflight`]): on stderr under `--foreground`, in syslog for the detached daemon.
//!
//! The `-o` options and their defaults are in `options`; the mount table (which lanefs mounts
//! /proc/self/mountinfo lists) in `table`; the kernel's dirty limit for the mount, and what keeps
//! the daemon writing beside it, in `dirty`.

mod dirty;
mod idle_poll;
mod options;
mod table;

pub use options::{parse_options, MountArgs, Parsed, STUCK_REQUEST, WRITEBACK_CACHE_DEFAULT};
pub use table::{lanefs_mounts, mounted_at, unescape_mountinfo, MountEntry};

use crate::adapter::LaneFuse;
use crate::inflight::{Inflight, Watcher};
use crate::proto::{MountOption, Session, SessionACL, Transport};
use lanefs::device::{DeviceOptions, FileDevice, IoChoice};
use lanefs::{AtimeMode, Fs, FsOptions};
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// In-flight slots kept for spare workers (`proto::spares`): a spare is started only when
/// every other worker of its queue waits for the kernel, which few requests do (LSEEK and
/// direct reads under the writeback cache), so a session starts a handful at most. A spare past
/// these still serves and is counted; its requests are not logged if stuck.
const SPARE_SLOTS: usize = 16;

/// Set in the environment of the re-executed daemon.
const DAEMON_ENV: &str = "LANEFS_MOUNT_DAEMON";

/// How long a mount waits for the daemon of an unmounted image to finish its final checkpoint.
/// A checkpoint writes what is dirty; a minute covers gigabytes on the slowest device here.
pub const RELEASE_WAIT: Duration = Duration::from_secs(60);

fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Runs `lanefs mount`: in the foreground, as the daemon child, or as the parent that starts
/// the daemon and waits for its word.
pub fn mount_command(args: &MountArgs) -> Result<(), String> {
    let parsed = parse_options(&args.options)?;
    if args.foreground {
        return serve(args, &parsed, &mut |note| eprintln!("lanefs mount: {note}"), &mut || {});
    }
    if std::env::var_os(DAEMON_ENV).is_some() {
        return daemon_child(args, &parsed);
    }
    start_daemon()
}

/// The parent: starts `lanefs mount ...` again as the daemon and relays what it says: notes
/// (to stderr) until "ready" or "error: ...".
fn start_daemon() -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the lanefs executable: {e}"))?;
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut child = Command::new(exe)
        .args(argv)
        .env(DAEMON_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    if let Some(out) = child.stdout.take() {
        // EOF (the child died first) ends the loop.
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let line = line.trim_end();
            if line == "ready" {
                return Ok(());
            }
            if let Some(note) = line.strip_prefix("note: ") {
                eprintln!("lanefs mount: {note}");
            } else if let Some(msg) = line.strip_prefix("error: ") {
                let _ = child.wait();
                return Err(msg.to_string());
            }
        }
    }
    match child.wait() {
        Ok(s) => Err(format!("the daemon exited before mounting ({s})")),
        Err(e) => Err(format!("the daemon vanished before mounting: {e}")),
    }
}

/// The daemon: a new session, no terminal; notes, then "ready" or the error, on stdout (a pipe
/// to the parent), then stdio on /dev/null.
fn daemon_child(args: &MountArgs, parsed: &Parsed) -> Result<(), String> {
    // Not a process group leader (spawned into the parent's group), so setsid succeeds.
    let _ = rustix::process::setsid();
    let mut ready = false;
    let r = serve(
        args,
        parsed,
        &mut |note| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "note: {note}");
            let _ = out.flush();
        },
        &mut || {
            ready = true;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "ready");
            let _ = out.flush();
            drop(out);
            if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
                let _ = rustix::stdio::dup2_stdout(&null);
                let _ = rustix::stdio::dup2_stderr(&null);
            }
        },
    );
    if let (Err(e), false) = (&r, ready) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "error: {e}");
        let _ = out.flush();
    }
    // After the mount there is no one left to tell: the exit status is all.
    r
}

/// Mounts and serves until unmounted; `note` tells the user something on the way (one line),
/// `ready` is called once the mount is up.
fn serve(
    args: &MountArgs,
    parsed: &Parsed,
    note: &mut dyn FnMut(&str),
    ready: &mut dyn FnMut(),
) -> Result<(), String> {
    // The handlers go in before anything else: a signal that comes during recovery or just as the
    // mount comes up is held and unmounts it once it is up, where the default action would kill
    // the daemon with the mount up and no final checkpoint.
    let signals = catch_signals();
    // Before any thread starts: they inherit it. Root in a container may lack the capability;
    // the mount serves all the same (see `dirty` for what the mark adds), and says so only in
    // the system log, since every mount would print it.
    if let Err(e) = dirty::mark_io_flusher() {
        crate::syslog::open();
        crate::syslog::info(&e);
    }
    let (fs, lock, image, mountpoint, read_only) = match open(args, parsed, note)? {
        Opened::Fs { fs, lock, image, mountpoint, read_only } => (fs, lock, image, mountpoint, read_only),
        Opened::Bound(said) => {
            // As quiet as a second mount of a device (fstests' 732 compares the output); the
            // system log has it.
            crate::syslog::open();
            crate::syslog::info(&said);
            ready();
            return Ok(());
        }
    };
    let fs = Arc::new(fs);
    let options = kernel_options(parsed, &image, read_only);
    let threads = args.threads.or(parsed.threads).unwrap_or_else(default_threads).max(1);
    let transport = if parsed.uring { Transport::uring_for(threads) } else { Transport::DevFuse };
    // A slot for every worker, /dev/fuse and ring workers both, and for the spares started
    // beside workers that wait for the kernel (`proto::spares`), so that each one's stuck
    // requests are logged.
    let inflight = Arc::new(Inflight::new(threads + transport.ring_workers() + SPARE_SLOTS));
    let fuse = handler(&fs, parsed, &inflight);
    let transport_slot = fuse.transport_slot();
    let (session, mounted) = match mount_session(fuse, &mountpoint, &options, parsed.acl) {
        Ok(s) => s,
        Err(e) => {
            let e = format!("cannot mount on {}: {}", mountpoint.display(), plain(&e));
            return Err(match finish(fs, lock) {
                Ok(()) => e,
                Err(f) => format!("{e}; then {f}"),
            });
        }
    };
    if let Err(e) = show_atime_flags(&mountpoint, parsed) {
        // The daemon applies the options all the same; only the table would say otherwise.
        note(&e);
    }
    let dev = mounted_dev(&mountpoint);
    if parsed.share_dirty_limit {
        if let Some(Err(e)) = dev.as_deref().map(dirty::share_dirty_limit) {
            note(&e);
        }
    }
    let signals = signals.and_then(|s| signal_thread(s, mountpoint.clone(), dev));
    let (idle_poll, watcher) = watchers(args, parsed, &mountpoint, inflight, note);
    ready();
    let (foreground, mp) = (args.foreground, mountpoint.display().to_string());
    let run = session.run(threads, crate::adapter::max_write(), transport, &mut |t| {
        let _ = transport_slot.set(t.why.clone());
        say_transport(foreground, &mp, &t.why)
    });
    // The kernel ended the connection: the mount is gone (or was never served, on an error:
    // then it is taken down here).
    if run.is_ok() {
        mounted.forget();
    } else {
        drop(mounted);
    }
    drop(watcher);
    drop(idle_poll);
    if let Some((handle, thread)) = signals {
        handle.close();
        let _ = thread.join();
    }
    let done = finish(fs, lock);
    run.map_err(|e| format!("serving {}: {}", mountpoint.display(), plain(&e)))?;
    done
}

/// The request handler over `fs`, as the mount options configure it.
fn handler(fs: &Arc<lanefs::Fs>, parsed: &Parsed, inflight: &Arc<Inflight>) -> LaneFuse {
    let kernel_acls = parsed.fuse.contains(&MountOption::DefaultPermissions);
    // Idmapped mounts need the kernel to check permissions, and requests from every uid (see
    // `LaneFuse::allow_idmap`).
    let idmap = kernel_acls && parsed.acl == SessionACL::All;
    LaneFuse::new(fs.clone(), parsed.writeback_cache, inflight.clone())
        .with_posix_acl(kernel_acls)
        .allow_idmap(idmap)
        .with_ttl(parsed.ttl)
}

/// The threads that watch the mount while it serves, as the options ask: the idle-CPU poll
/// (`-o idle_poll`) and the stuck-request log (`-o stuck_request`). Either may be missing: the
/// mount serves without them.
fn watchers(
    args: &MountArgs,
    parsed: &Parsed,
    mountpoint: &Path,
    inflight: Arc<Inflight>,
    note: &mut dyn FnMut(&str),
) -> (Option<idle_poll::IdlePoll>, Option<Watcher>) {
    let idle_poll = parsed.idle_poll.then(|| idle_poll::IdlePoll::spawn(inflight.clone())).and_then(|r| {
        r.map_err(|(e, denied)| {
            // Not being root is the common reason, and every such mount would print it.
            if denied {
                crate::syslog::open();
                crate::syslog::info(&e);
            } else {
                note(&e);
            }
        })
        .ok()
    });
    let watcher = parsed.stuck_request.and_then(|threshold| {
        let log = stuck_log(args.foreground, mountpoint);
        Watcher::spawn(inflight, threshold, log).ok()
    });
    (idle_poll, watcher)
}

/// Mounts `fuse` at `mountpoint` and makes the session that serves it (not started yet).
fn mount_session(
    fuse: LaneFuse,
    mountpoint: &Path,
    options: &[MountOption],
    acl: SessionACL,
) -> std::io::Result<(Session<LaneFuse>, crate::proto::Mounted)> {
    let notifier = fuse.notifier_slot();
    let root_and_owner = (acl == SessionACL::RootAndOwner).then(|| rustix::process::getuid().as_raw());
    let (dev, mounted) = crate::proto::mount(mountpoint, options, acl)?;
    let s = Session::new(fuse, dev, root_and_owner);
    let _ = notifier.set(s.notifier());
    // A request of the daemon's own, through the mount (`proto::spares`): any one the kernel
    // cannot answer from its caches; an xattr of the root is never cached. By path, holding
    // nothing open that would keep the mount busy.
    let root = mountpoint.to_path_buf();
    s.spares().set_kick(Box::new(move || {
        let _ = rustix::fs::getxattr(&root, "user.lanefs.spare", &mut [0u8; 0][..]);
    }));
    Ok((s, mounted))
}

/// The options the kernel mount gets: the user's, read-only for a write-protected image (so
/// that a change fails with EROFS in the kernel, as on a kernel file system; mount(8) passes
/// `rw` on when nothing else is asked for), and the image as the source unless one is named.
fn kernel_options(parsed: &Parsed, image: &Path, read_only: bool) -> Vec<MountOption> {
    let mut options = parsed.fuse.clone();
    if read_only && !options.contains(&MountOption::RO) {
        options.retain(|o| *o != MountOption::RW);
        options.push(MountOption::RO);
    }
    if !options.iter().any(|o| matches!(o, MountOption::FSName(_))) {
        options.push(MountOption::FSName(image.display().to_string()));
    }
    options
}

/// The device number (`MAJ:MIN`) of the lanefs mount just made at `mountpoint`. Read from
/// /proc/self/mountinfo before anything can be mounted over it: a stat of the mount point
/// would be a FUSE request that no worker serves yet.
fn mounted_dev(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    lanefs_mounts(&info).into_iter().rev().find(|m| m.mountpoint == mountpoint).map(|m| m.dev)
}

/// Tells which transport serves the mount, and why: on stderr in the foreground, in the
/// system log for the daemon.
fn say_transport(foreground: bool, mountpoint: &str, why: &str) {
    if foreground {
        eprintln!("lanefs: {mountpoint}: transport {why}");
    } else {
        crate::syslog::open();
        crate::syslog::info(&format!("{mountpoint}: transport {why}"));
    }
}

/// Where stuck requests are told: stderr in the foreground; syslog for the daemon, whose
/// stderr is /dev/null.
fn stuck_log(foreground: bool, mountpoint: &Path) -> Box<dyn Fn(&crate::inflight::Stuck) + Send> {
    let mp = mountpoint.display().to_string();
    if foreground {
        Box::new(move |s| eprintln!("lanefs: {mp}: {s}"))
    } else {
        crate::syslog::open();
        Box::new(move |s| crate::syslog::warning(&format!("{mp}: {s}")))
    }
}

/// What `open` made of the request.
enum Opened {
    /// A file system to serve (read-only: asked for, or the image is write-protected).
    Fs { fs: Fs, lock: File, image: PathBuf, mountpoint: PathBuf, read_only: bool },
    /// The image was mounted: the mount point is a bind of that mount now; what to tell the user.
    Bound(String),
}

/// Checks the mount point, locks and opens the image.
fn open(args: &MountArgs, parsed: &Parsed, note: &mut dyn FnMut(&str)) -> Result<Opened, String> {
    let mp = &args.mountpoint;
    let md = std::fs::metadata(mp).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => format!("mount point {} does not exist", mp.display()),
        Some(libc::ENOTCONN) => format!(
            "mount point {} is a dead FUSE mount; clear it with: fusermount3 -u -z {}",
            mp.display(),
            mp.display()
        ),
        _ => format!("mount point {}: {e}", mp.display()),
    })?;
    if !md.is_dir() {
        return Err(format!("mount point {} is not a directory", mp.display()));
    }
    let mountpoint = mp.canonicalize().map_err(|e| format!("mount point {}: {e}", mp.display()))?;
    let img = &args.image;
    let (lock, write_protected) = open_image(img)?;
    let image = img.canonicalize().map_err(|e| format!("{}: {}", img.display(), plain(&e)))?;
    let imd = lock.metadata().map_err(|e| format!("{}: {}", img.display(), plain(&e)))?;
    if imd.is_dir() {
        return Err(format!("{} is a directory, not a lanefs image", img.display()));
    }
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            if let Some(at) = mounted_at(&image) {
                return second_mount(&image, &at, &mountpoint, parsed).map(Opened::Bound);
            }
            await_release(&lock, img, QUIET_WAIT, RELEASE_WAIT, note)?;
        }
        Err(e) => return Err(format!("{}: cannot lock: {e}", img.display())),
    }
    // `-o ro`: recovery replays into memory only and nothing is ever written to the image. A
    // write-protected image is mounted so, as the kernel's file systems do, with a word.
    let asked_ro = parsed.fuse.contains(&MountOption::RO);
    if write_protected && !asked_ro {
        note(&format!("{} is write-protected, mounting read-only", img.display()));
    }
    let read_only = asked_ro || write_protected;
    if parsed.no_recovery && !read_only {
        return Err("option norecovery needs ro: the journals it leaves out must not be overwritten".into());
    }
    let dev_opts = DeviceOptions { io: IoChoice::Auto };
    let dev = if write_protected {
        FileDevice::open_read_only(img, dev_opts)
    } else {
        FileDevice::open(img, dev_opts)
    }
    .map_err(|e| format!("{}: {}", img.display(), plain(&e)))?;
    // The daemon leaves its start directory: a relative region path is made absolute first.
    let nvm = match args.nvm.clone().or(parsed.nvm.clone()) {
        Some(p) => Some(std::path::absolute(&p).map_err(|e| format!("--nvm {}: {e}", p.display()))?),
        None => None,
    };
    let defaults = FsOptions::default();
    let mut opts = FsOptions {
        read_only,
        no_recovery: parsed.no_recovery,
        nvm,
        nvm_size: args.nvm_size.or(defaults.nvm_size),
        atime: parsed.atime,
        cooperative: parsed.cooperative,
        ..defaults
    };
    if let Some(interval) = parsed.checkpoint_interval {
        opts.checkpoint_interval = interval;
    }
    let fs = Fs::open(Arc::new(dev), opts).map_err(|e| format!("{}: {e}", img.display()))?;
    if fs.recovery().replayed() {
        // The system log always has it (as the kernel's log has a journal replay); the terminal
        // only in the foreground: scripts that mount after a crash (fstests among them) compare
        // what the mount prints.
        let said = format!("{}: {}", img.display(), fs.recovery());
        crate::syslog::open();
        crate::syslog::info(&said);
        if args.foreground {
            note(&said);
        }
    }
    // The daemon must not keep its start directory busy.
    let _ = std::env::set_current_dir("/");
    Ok(Opened::Fs { fs, lock, image, mountpoint, read_only })
}

/// Opens the image (the descriptor that holds the lock) and tells whether it is
/// write-protected: a block device the kernel keeps read-only (`blockdev --setro`, a read-only
/// loop device), or an image that cannot be opened for writing (on a read-only file system, or
/// without write permission). Such a device may open read-write and fail every write, so it is
/// asked, not tried.
fn open_image(img: &Path) -> Result<(File, bool), String> {
    let fail = |e: std::io::Error| format!("{}: {}", img.display(), plain(&e));
    match File::options().read(true).write(true).open(img) {
        Ok(f) => {
            let protected = block_device_read_only(&f);
            Ok((f, protected))
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EROFS | libc::EACCES)) => {
            File::open(img).map(|f| (f, true)).map_err(fail)
        }
        Err(e) => Err(fail(e)),
    }
}

/// Whether `f` is a block device that the kernel marks read-only (/sys/dev/block/M:N/ro).
fn block_device_read_only(f: &File) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(m) = f.metadata() else { return false };
    if !m.file_type().is_block_device() {
        return false;
    }
    let (major, minor) = (rustix::fs::major(m.rdev()), rustix::fs::minor(m.rdev()));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/ro")).is_ok_and(|s| s.trim() == "1")
}

/// Takes the exclusive lock on `file`, waiting up to `limit` for its holder.
/// Waits for the daemon of a mount that just went away to release `img`'s lock: silently for
/// `quiet` (a final checkpoint usually takes milliseconds, and a mount that succeeds prints
/// nothing, as the kernel's do: fstests compares a remount's output), then with one line to say
/// what it waits for, up to `limit` in all.
fn await_release(
    lock: &File,
    img: &Path,
    quiet: Duration,
    limit: Duration,
    note: &mut dyn FnMut(&str),
) -> Result<(), String> {
    debug_assert!(quiet <= limit);
    if wait_for_lock(lock, quiet).is_ok() {
        return Ok(());
    }
    note(&format!("waiting for the previous lanefs daemon to release {} (final checkpoint)", img.display()));
    wait_for_lock(lock, limit - quiet).map_err(|e| format!("{}: {e}", img.display()))
}

/// How long a mount waits for a finishing daemon before it says so.
pub const QUIET_WAIT: Duration = Duration::from_secs(1);

fn wait_for_lock(file: &File, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::WOULDBLOCK) if start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(format!(
                    "still in use after {} s, and not mounted here under its own name: its daemon \
                     serves a lazily unmounted (still busy) mount, a mount with another fsname, or \
                     one in another mount namespace",
                    limit.as_secs()
                ))
            }
            Err(e) => return Err(format!("cannot lock: {e}")),
        }
    }
}

/// A second mount of a mounted image, as a kernel file system makes it: the same file system
/// at `new` too, a bind of the mount at `at`, with the per-mount flags that a fresh mount with
/// these options would get. Only root may bind; a user gets the reason.
fn second_mount(image: &Path, at: &Path, new: &Path, parsed: &Parsed) -> Result<String, String> {
    use rustix::mount::{mount_bind, mount_remount, unmount, MountFlags, UnmountFlags};
    if at == new {
        return Err(format!("{} is mounted on {} already", image.display(), new.display()));
    }
    if !rustix::process::geteuid().is_root() {
        return Err(format!(
            "{} is in use: mounted at {}; a second mount of it is a bind of that mount, which needs \
             root (mount --bind {} {})",
            image.display(),
            at.display(),
            at.display(),
            new.display()
        ));
    }
    mount_bind(at, new).map_err(|e| format!("cannot bind {} to {}: {e}", at.display(), new.display()))?;
    if let Err(e) = mount_remount(new, MountFlags::BIND | per_mount_flags(parsed), "") {
        let _ = unmount(new, UnmountFlags::empty());
        return Err(format!(
            "cannot set the flags of the bind of {} on {}: {e}",
            at.display(),
            new.display()
        ));
    }
    Ok(format!(
        "{} is mounted at {} already: mounted it on {} too, as a bind of that mount (one file system, \
         as for a second mount of a device)",
        image.display(),
        at.display(),
        new.display()
    ))
}

/// The per-mount flags a fresh mount with these options gets (what a bind of it is given), and
/// what `show_atime_flags` sets.
fn per_mount_flags(parsed: &Parsed) -> rustix::mount::MountFlags {
    use rustix::mount::MountFlags;
    let has = |o: MountOption| parsed.fuse.contains(&o);
    let mut flags = MountFlags::empty();
    // FUSE's defaults, as `proto::mount` applies them to a fresh mount: nosuid and nodev unless
    // asked.
    for (set, flag) in [
        (has(MountOption::RO), MountFlags::RDONLY),
        (!has(MountOption::Suid), MountFlags::NOSUID),
        (!has(MountOption::Dev), MountFlags::NODEV),
        (has(MountOption::NoExec), MountFlags::NOEXEC),
        (parsed.atime.mode == AtimeMode::Never, MountFlags::NOATIME),
        (parsed.atime.mode == AtimeMode::Always, MountFlags::STRICTATIME),
        (!parsed.atime.dirs, MountFlags::NODIRATIME),
    ] {
        if set {
            flags |= flag;
        }
    }
    flags
}

/// Makes the mount table show `strictatime` and `nodiratime` as a kernel file system's mount
/// does: mount(2) of a new FUSE mount does not take them, so the per-mount flags are set again with a bind
/// remount (root only: for another user the table shows relatime, while the daemon applies
/// the options all the same). It changes per-mount flags only, and sends the file system no
/// request: it can run before the workers serve.
fn show_atime_flags(mountpoint: &Path, parsed: &Parsed) -> Result<(), String> {
    use rustix::mount::{mount_remount, MountFlags};
    if parsed.atime.mode != AtimeMode::Always && parsed.atime.dirs {
        return Ok(());
    }
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    mount_remount(mountpoint, MountFlags::BIND | per_mount_flags(parsed), "")
        .map_err(|e| format!("cannot set the access-time flags of {}: {e}", mountpoint.display()))
}

/// An I/O error without Rust's " (os error N)" tail.
fn plain(e: &std::io::Error) -> String {
    let s = e.to_string();
    s.split(" (os error").next().unwrap_or(&s).to_string()
}

/// Final checkpoint, then the image lock goes.
fn finish(fs: Arc<Fs>, lock: File) -> Result<(), String> {
    // The kernel's references ended with the session (it sends no FORGET when the connection
    // goes), so an unlinked file it still held is deleted by this checkpoint, not left to the
    // next mount's recovery.
    fs.forget_all();
    let r = match Arc::try_unwrap(fs) {
        Ok(fs) => fs.unmount().map_err(|e| format!("final checkpoint failed: {e}")),
        // Unreachable once the session is gone; dropping it checkpoints as well.
        Err(fs) => {
            drop(fs);
            Ok(())
        }
    };
    drop(lock);
    r
}

type SignalThread = (signal_hook::iterator::Handle, std::thread::JoinHandle<()>);

/// SIGTERM, SIGINT and SIGHUP, caught from now on and held until `signal_thread` takes them.
fn catch_signals() -> Option<signal_hook::iterator::Signals> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]).ok()
}

/// Unmounts on SIGTERM, SIGINT and SIGHUP (also those caught before the mount was up): plainly,
/// or lazily (MNT_DETACH) if the mount is busy, so that the daemon ends once the last user lets go.
/// Every mount point of this file system goes (`dev`, its mountinfo major:minor, finds the binds
/// of it), or the daemon would go on serving a bind.
fn signal_thread(
    mut signals: signal_hook::iterator::Signals,
    mountpoint: PathBuf,
    dev: Option<String>,
) -> Option<SignalThread> {
    let handle = signals.handle();
    let thread = std::thread::Builder::new()
        .name("lanefs-signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
                let mut points: Vec<PathBuf> = lanefs_mounts(&info)
                    .into_iter()
                    .filter(|m| dev.as_ref() == Some(&m.dev))
                    .map(|m| m.mountpoint)
                    .collect();
                if points.is_empty() {
                    points.push(mountpoint.clone());
                }
                for p in points.iter().rev() {
                    unmount_path(p);
                }
            }
        })
        .ok()?;
    Some((handle, thread))
}

fn unmount_path(mp: &Path) {
    use rustix::mount::{unmount, UnmountFlags};
    match unmount(mp, UnmountFlags::empty()) {
        Ok(()) => {}
        Err(rustix::io::Errno::BUSY) => {
            let _ = unmount(mp, UnmountFlags::DETACH);
        }
        // Not root: fusermount3 is setuid root and unmounts what this user mounted.
        Err(_) => crate::proto::mount::unmount_by_helper(mp),
    }
}

/// `lanefs umount MOUNTPOINT`: fusermount3 -u, then wait (up to `wait`) for the daemon's final
/// checkpoint, which ends when it releases the image lock. If the file system is still mounted
/// elsewhere (a bind of it), the daemon goes on serving that: nothing to wait for, and the note
/// returned says where.
pub fn umount_command(mountpoint: &Path, wait: Duration) -> Result<Option<String>, String> {
    let mp = mountpoint.canonicalize().map_err(|e| format!("{}: {}", mountpoint.display(), plain(&e)))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {}", plain(&e)))?;
    let entry = lanefs_mounts(&info)
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == mp)
        .ok_or_else(|| format!("{} is not a lanefs mount point", mp.display()))?;
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg("--")
        .arg(&mp)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run fusermount3: {}", plain(&e)))?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr);
        let msg = msg.lines().next().unwrap_or("").trim();
        return Err(if msg.is_empty() {
            format!("fusermount3 -u failed ({})", out.status)
        } else {
            msg.to_string()
        });
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if let Some(other) = lanefs_mounts(&info).into_iter().find(|m| m.dev == entry.dev) {
        return Ok(Some(format!(
            "{} is still mounted at {}: its final checkpoint comes when that is unmounted",
            entry.source,
            other.mountpoint.display()
        )));
    }
    // The source is the image path unless the mount named another fsname.
    let Ok(img) = File::open(&entry.source) else { return Ok(None) };
    let start = Instant::now();
    loop {
        match rustix::fs::flock(&img, rustix::fs::FlockOperation::NonBlockingLockShared) {
            Ok(()) => return Ok(None),
            Err(rustix::io::Errno::WOULDBLOCK) if start.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(format!(
                    "unmounted, but the daemon has not finished its final checkpoint of {} after {} s",
                    entry.source,
                    wait.as_secs()
                ))
            }
            Err(_) => return Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_waited_for_within_the_limit_only() {
        let path = std::env::temp_dir().join(format!("lanefs-lockwait-{}", std::process::id()));
        std::fs::write(&path, b"image").unwrap();
        // flock locks belong to the open file: two opens conflict within one process too.
        let holder = File::open(&path).unwrap();
        let waiter = File::open(&path).unwrap();
        rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let t = Instant::now();
        let e = wait_for_lock(&waiter, Duration::from_millis(200)).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(200), "gave up early");
        assert!(e.contains("still in use after"), "{e}");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(holder);
        });
        wait_for_lock(&waiter, Duration::from_secs(30)).unwrap();
        release.join().unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_short_wait_is_silent_and_a_long_one_says_what_it_waits_for() {
        let path = std::env::temp_dir().join(format!("lanefs-quietwait-{}", std::process::id()));
        std::fs::write(&path, b"image").unwrap();
        let waiter = File::open(&path).unwrap();
        for (held_ms, says) in [(50u64, false), (600, true)] {
            let holder = File::open(&path).unwrap();
            rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
            let release = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(held_ms));
                drop(holder);
            });
            let mut notes = Vec::new();
            await_release(&waiter, &path, Duration::from_millis(300), Duration::from_secs(30), &mut |n| {
                notes.push(n.to_string())
            })
            .unwrap();
            release.join().unwrap();
            assert_eq!(notes.len(), usize::from(says), "held {held_ms} ms: {notes:?}");
            assert!(notes.iter().all(|n| n.starts_with("waiting for the previous lanefs daemon")));
            rustix::fs::flock(&waiter, rustix::fs::FlockOperation::Unlock).unwrap();
        }
        std::fs::remove_file(&path).unwrap();
    }
}
