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

use crate::adapter::{LaneFuse, Ttl};
use crate::inflight::{Inflight, Watcher};
use fuser::{Config, MountOption, Session, SessionACL};
use lanefs::device::{DeviceOptions, FileDevice, IoChoice};
use lanefs::{AtimeMode, AtimePolicy, Fs, FsOptions};
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set in the environment of the re-executed daemon.
const DAEMON_ENV: &str = "LANEFS_MOUNT_DAEMON";

/// How long a mount waits for the daemon of an unmounted image to finish its final checkpoint.
/// A checkpoint writes what is dirty; a minute covers gigabytes on the slowest device here.
pub const RELEASE_WAIT: Duration = Duration::from_secs(60);

/// Whether the kernel caches writes when no `writeback_cache` option says (see the crate docs
/// for what it changes).
pub const WRITEBACK_CACHE_DEFAULT: bool = false;

/// Default of `stuck_request_secs`.
pub const STUCK_REQUEST: Duration = Duration::from_secs(30);

/// What `lanefs mount` was asked for.
#[derive(Debug, Clone, Default)]
pub struct MountArgs {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    /// Persistent-memory region holding the NAT and the lane journals (`--nvm FILE`; also
    /// `-o nvm=FILE`): created on the first mount with it, required from then on.
    pub nvm: Option<PathBuf>,
    /// Size of a region this mount creates (`--nvm-size`; default: the image's NAT plus 32 MiB
    /// per lane of journal, at most 256 MiB of journals).
    pub nvm_size: Option<u64>,
    /// Worker threads; default one per core.
    pub threads: Option<usize>,
    /// `-o` option lists, each comma-separated.
    pub options: Vec<String>,
    pub foreground: bool,
}

/// Mount options after parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub fuse: Vec<MountOption>,
    pub acl: SessionACL,
    pub threads: Option<usize>,
    pub nvm: Option<PathBuf>,
    pub writeback_cache: bool,
    /// `checkpoint_secs=N`: the checkpoint timer (None: the engine's default; Some(None): no
    /// timer, checkpoints only when a bound is passed and at unmount).
    pub checkpoint_interval: Option<Option<Duration>>,
    /// `stuck_request_secs=N`: requests in flight this long are logged (None: never).
    pub stuck_request: Option<Duration>,
    /// `norecovery` (read-only mounts only): the last checkpoint alone, the journals not
    /// replayed.
    pub no_recovery: bool,
    /// The access-time options (`relatime` by default; `noatime`, `strictatime`, `nodiratime`,
    /// `lazytime` and their opposites, the last word winning), which the daemon applies: the
    /// kernel keeps no atime for FUSE.
    pub atime: AtimePolicy,
    /// How long the kernel caches names and attributes (`cache_timeout=S`) and names that do
    /// not exist (`negative_timeout=S`); see [`Ttl`].
    pub ttl: Ttl,
}

/// Parses `-o` lists. Standard options become fuser's; `allow_other` / `allow_root` set the
/// access list; `threads=N`, `nvm=FILE`, `writeback_cache[=on|off]` (off by default;
/// `nowriteback_cache` is off too), `checkpoint_secs=N`,
/// `stuck_request_secs=N`, `cache_timeout=S`, `negative_timeout=S` and `norecovery` (read-only
/// mounts only) are lanefs's own; anything else is passed to the kernel, which refuses
/// what it does not know.
pub fn parse_options(lists: &[String]) -> Result<Parsed, String> {
    let mut fuse = Vec::new();
    let mut acl = SessionACL::Owner;
    let mut threads = None;
    let mut nvm = None;
    let mut default_permissions = true;
    let mut writeback_cache = WRITEBACK_CACHE_DEFAULT;
    let mut checkpoint_interval = None;
    let mut stuck_request = Some(STUCK_REQUEST);
    let mut no_recovery = false;
    let mut atime = AtimePolicy::default();
    let mut ttl = Ttl::default();
    for o in lists.iter().flat_map(|l| l.split(',')).map(str::trim).filter(|o| !o.is_empty()) {
        let opt = match o {
            "ro" => MountOption::RO,
            "rw" => MountOption::RW,
            "dev" => MountOption::Dev,
            "nodev" => MountOption::NoDev,
            "suid" => MountOption::Suid,
            "nosuid" => MountOption::NoSuid,
            "exec" => MountOption::Exec,
            "noexec" => MountOption::NoExec,
            "atime" | "noatime" | "relatime" | "norelatime" | "strictatime" | "nostrictatime"
            | "lazytime" | "nolazytime" | "diratime" | "nodiratime" => {
                match o {
                    "noatime" => atime.mode = AtimeMode::Never,
                    // The kernel's default is relatime: "atime" and "norelatime" come back to it.
                    "atime" | "relatime" | "norelatime" | "nostrictatime" => atime.mode = AtimeMode::Relative,
                    "strictatime" => atime.mode = AtimeMode::Always,
                    "lazytime" => atime.lazy = true,
                    "nolazytime" => atime.lazy = false,
                    "diratime" => atime.dirs = true,
                    _ => atime.dirs = false,
                }
                continue;
            }
            "dirsync" => MountOption::DirSync,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "auto_unmount" => MountOption::AutoUnmount,
            "default_permissions" => {
                default_permissions = true;
                continue;
            }
            "no_default_permissions" => {
                default_permissions = false;
                continue;
            }
            "allow_other" => {
                acl = SessionACL::All;
                continue;
            }
            "allow_root" => {
                acl = SessionACL::RootAndOwner;
                continue;
            }
            "writeback_cache" | "writeback_cache=on" => {
                writeback_cache = true;
                continue;
            }
            "writeback_cache=off" | "nowriteback_cache" => {
                writeback_cache = false;
                continue;
            }
            "norecovery" => {
                no_recovery = true;
                continue;
            }
            // mount(8) and fstab words that are not mount options.
            "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "nofail" | "_netdev" => continue,
            o if o.starts_with("x-") || o.starts_with("comment=") => continue,
            o if o.starts_with("threads=") => {
                let n = o["threads=".len()..]
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| (1..=1024).contains(&n))
                    .ok_or_else(|| format!("option {o}: give a thread count from 1 to 1024"))?;
                threads = Some(n);
                continue;
            }
            o if o.starts_with("checkpoint_secs=") => {
                let n = o["checkpoint_secs=".len()..]
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n <= 86_400)
                    .ok_or_else(|| format!("option {o}: give seconds from 0 (no timer) to 86400"))?;
                checkpoint_interval = Some((n > 0).then(|| Duration::from_secs(n)));
                continue;
            }
            o if o.starts_with("stuck_request_secs=") => {
                let n = o["stuck_request_secs=".len()..]
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n <= 86_400)
                    .ok_or_else(|| format!("option {o}: give seconds from 0 (no log) to 86400"))?;
                stuck_request = (n > 0).then(|| Duration::from_secs(n));
                continue;
            }
            o if o.starts_with("cache_timeout=") || o.starts_with("negative_timeout=") => {
                let (key, v) = o.split_once('=').unwrap_or((o, ""));
                let secs = v
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n <= 86_400)
                    .ok_or_else(|| format!("option {o}: give seconds from 0 (no caching) to 86400"))?;
                let d = Duration::from_secs(secs);
                if key == "cache_timeout" {
                    ttl.cache = d;
                } else {
                    ttl.negative = d;
                }
                continue;
            }
            o if o.starts_with("nvm=") => {
                nvm = Some(PathBuf::from(&o["nvm=".len()..]));
                continue;
            }
            // lanefs names its own subtype (fuse.lanefs).
            o if o.starts_with("subtype=") => continue,
            o if o.starts_with("fsname=") => MountOption::FSName(o["fsname=".len()..].to_string()),
            o => MountOption::CUSTOM(o.to_string()),
        };
        if !fuse.contains(&opt) {
            fuse.push(opt);
        }
    }
    if default_permissions {
        fuse.push(MountOption::DefaultPermissions);
    }
    // What the mount table shows. noatime is a flag fuser passes; lazytime a superblock flag the
    // kernel takes as a mount option from root's mount(2) (fusermount3 3.14, which mounts for a
    // user, refuses it). strictatime and nodiratime have no fuser option: `show_atime_flags`
    // sets them once the mount is up.
    if atime.mode == AtimeMode::Never {
        fuse.push(MountOption::NoAtime);
    }
    if atime.lazy && rustix::process::geteuid().is_root() {
        fuse.push(MountOption::CUSTOM("lazytime".into()));
    }
    // The kernel's own subtype option: /proc/mounts shows the type as fuse.lanefs.
    fuse.push(MountOption::CUSTOM("subtype=lanefs".into()));
    Ok(Parsed {
        fuse,
        acl,
        threads,
        nvm,
        writeback_cache,
        checkpoint_interval,
        stuck_request,
        no_recovery,
        atime,
        ttl,
    })
}

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
    let mut config = Config::default();
    config.mount_options = parsed.fuse.clone();
    // A write-protected image is mounted read-only in the kernel too, so that a change fails
    // with EROFS there, as on a kernel file system.
    // (mount(8) passes `rw` on when nothing else is asked for.)
    if read_only && !config.mount_options.contains(&MountOption::RO) {
        config.mount_options.retain(|o| *o != MountOption::RW);
        config.mount_options.push(MountOption::RO);
    }
    if !config.mount_options.iter().any(|o| matches!(o, MountOption::FSName(_))) {
        config.mount_options.push(MountOption::FSName(image.display().to_string()));
    }
    config.acl = parsed.acl;
    let threads = args.threads.or(parsed.threads).unwrap_or_else(default_threads).max(1);
    config.n_threads = Some(threads);
    config.clone_fd = true;
    let inflight = Arc::new(Inflight::new(threads));
    let kernel_acls = parsed.fuse.contains(&MountOption::DefaultPermissions);
    // Idmapped mounts need the kernel to check permissions, and fuser to let requests
    // through whose uid is unset (see `LaneFuse::allow_idmap`).
    let idmap = kernel_acls && parsed.acl == SessionACL::All;
    let fuse = LaneFuse::new(fs.clone(), parsed.writeback_cache, inflight.clone())
        .with_posix_acl(kernel_acls)
        .allow_idmap(idmap)
        .with_ttl(parsed.ttl);
    let notifier = fuse.notifier_slot();
    let session = match Session::new(fuse, &mountpoint, &config) {
        Ok(s) => {
            let _ = notifier.set(s.notifier());
            s
        }
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
    // Read before anything can be mounted over it; a stat of the mount point would be a FUSE
    // request that no worker serves yet.
    let dev = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|info| lanefs_mounts(&info).into_iter().rev().find(|m| m.mountpoint == mountpoint))
        .map(|m| m.dev);
    let signals = signals.and_then(|s| signal_thread(s, mountpoint.clone(), dev));
    let watcher = parsed.stuck_request.and_then(|threshold| {
        let log = stuck_log(args.foreground, &mountpoint);
        Watcher::spawn(inflight, threshold, log).ok()
    });
    ready();
    let run = session.run();
    drop(watcher);
    if let Some((handle, thread)) = signals {
        handle.close();
        let _ = thread.join();
    }
    let done = finish(fs, lock);
    run.map_err(|e| format!("serving {}: {}", mountpoint.display(), plain(&e)))?;
    done
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

/// Where `image` is mounted, if it is: the first lanefs mount with it as its source.
pub fn mounted_at(image: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    lanefs_mounts(&info).into_iter().find(|m| Path::new(&m.source) == image).map(|m| m.mountpoint)
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
    // FUSE's defaults, as fuser applies them to a fresh mount: nosuid and nodev unless asked.
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
/// does: fuser's mount(2) cannot pass them, so the per-mount flags are set again with a bind
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
        Err(_) => {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg("--")
                .arg(mp)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A lanefs mount as /proc/self/mountinfo lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub source: String,
    /// major:minor of the file system: the same for every bind of one mount.
    pub dev: String,
    /// The per-mount options (rw, nosuid, nodev, relatime, ...).
    pub options: String,
}

/// Decodes mountinfo's octal escapes (\040 for a space, ...).
fn unescape(s: &str) -> String {
    String::from_utf8_lossy(&unescape_mountinfo(s)).into_owned()
}

/// Decodes the octal escapes of a /proc/self/mountinfo field (the kernel writes space, tab,
/// newline and backslash as `\ooo`) into the raw bytes of the path. A backslash not followed by
/// three octal digits stays as it is. The one implementation, shared with lanefs-bench.
pub fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // The escape is b[i..i + 4]; `get` also takes one that ends the field, and none that is
        // cut short. Above \377 it is no byte: kept as it is (and no u8 overflow).
        let value = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u16, |v, c| v * 8 + u16::from(c - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        match value {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// The lanefs mounts in a mountinfo text.
pub fn lanefs_mounts(mountinfo: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        // id parent major:minor root mountpoint opts [optional...] - fstype source superopts
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 6 || r.len() < 2 || r[0] != "fuse.lanefs" {
            continue;
        }
        out.push(MountEntry {
            mountpoint: PathBuf::from(unescape(l[4])),
            source: unescape(r[1]),
            dev: l[2].to_string(),
            options: l[5].to_string(),
        });
    }
    out
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
    fn options_map_to_fuser_and_lanefs() {
        let p = parse_options(&["ro,allow_other,threads=3".into(), "noatime,max_read=65536".into()]).unwrap();
        assert_eq!(p.acl, SessionACL::All);
        assert_eq!(p.threads, Some(3));
        assert!(p.fuse.contains(&MountOption::RO));
        assert!(p.fuse.contains(&MountOption::NoAtime));
        assert!(p.fuse.contains(&MountOption::DefaultPermissions));
        assert!(p.fuse.contains(&MountOption::CUSTOM("max_read=65536".into())));
        let p = parse_options(&["defaults,no_default_permissions,relatime".into()]).unwrap();
        assert!(!p.fuse.contains(&MountOption::DefaultPermissions));
        assert!(parse_options(&["threads=0".into()]).is_err());
        assert!(parse_options(&["threads=x".into()]).is_err());
        assert_eq!(p.checkpoint_interval, None);
        let p = parse_options(&["checkpoint_secs=2".into()]).unwrap();
        assert_eq!(p.checkpoint_interval, Some(Some(Duration::from_secs(2))));
        assert_eq!(parse_options(&["checkpoint_secs=0".into()]).unwrap().checkpoint_interval, Some(None));
        assert!(parse_options(&["checkpoint_secs=-1".into()]).is_err());
        assert!(!p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c.starts_with("checkpoint"))));
        let p = parse_options(&["ro,norecovery".into()]).unwrap();
        assert!(
            p.no_recovery && !p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c == "norecovery"))
        );
        assert!(!parse_options(&["ro".into()]).unwrap().no_recovery);
        // Without ro it is refused at mount, unless the image is write-protected (then ro).
        assert!(parse_options(&["norecovery".into()]).unwrap().no_recovery);
    }

    #[test]
    fn atime_options_make_a_policy_the_last_word_winning() {
        let p = parse_options(&[]).unwrap();
        assert_eq!(p.atime, AtimePolicy::default());
        assert!(!p.fuse.contains(&MountOption::NoAtime));
        let p = parse_options(&["noatime,nodiratime".into()]).unwrap();
        assert_eq!(p.atime, AtimePolicy { mode: AtimeMode::Never, dirs: false, lazy: false });
        assert!(p.fuse.contains(&MountOption::NoAtime));
        let p =
            parse_options(&["noatime,strictatime,lazytime".into(), "nodiratime,diratime".into()]).unwrap();
        assert_eq!(p.atime, AtimePolicy { mode: AtimeMode::Always, dirs: true, lazy: true });
        assert!(!p.fuse.contains(&MountOption::NoAtime));
        for back in ["atime", "relatime", "norelatime", "nostrictatime"] {
            let p = parse_options(&[format!("strictatime,{back},lazytime,nolazytime")]).unwrap();
            assert_eq!(p.atime, AtimePolicy::default(), "{back}");
        }
        // None of them reaches the kernel as a FUSE option it would refuse.
        let p = parse_options(&["relatime,strictatime,nodiratime,norelatime,nostrictatime".into()]).unwrap();
        assert!(!p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c.contains("atime"))));
    }

    #[test]
    fn writeback_cache_on_and_off() {
        assert_eq!(parse_options(&[]).unwrap().writeback_cache, WRITEBACK_CACHE_DEFAULT);
        for (o, on) in [
            ("writeback_cache", true),
            ("writeback_cache=on", true),
            ("writeback_cache=off", false),
            ("nowriteback_cache", false),
            ("writeback_cache=off,writeback_cache", true),
        ] {
            let p = parse_options(&[o.into()]).unwrap();
            assert_eq!(p.writeback_cache, on, "{o}");
            assert!(!p.fuse.iter().any(|m| matches!(m, MountOption::CUSTOM(c) if c.contains("writeback"))));
        }
    }

    #[test]
    fn cache_timeouts_set_the_ttls_and_stay_out_of_the_kernel_options() {
        assert_eq!(parse_options(&[]).unwrap().ttl, Ttl::default());
        let p = parse_options(&["cache_timeout=1,negative_timeout=0".into()]).unwrap();
        assert_eq!(p.ttl, Ttl { cache: Duration::from_secs(1), negative: Duration::ZERO });
        assert!(!p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c.contains("timeout"))));
        for bad in ["cache_timeout=", "cache_timeout=-1", "negative_timeout=1.5", "cache_timeout=86401"] {
            let e = parse_options(&[bad.into()]).unwrap_err();
            assert!(e.starts_with(&format!("option {bad}: ")), "{e}");
        }
    }

    #[test]
    fn stuck_request_secs_sets_the_threshold_or_turns_the_log_off() {
        assert_eq!(parse_options(&[]).unwrap().stuck_request, Some(STUCK_REQUEST));
        let p = parse_options(&["rw,stuck_request_secs=1".into()]).unwrap();
        assert_eq!(p.stuck_request, Some(Duration::from_secs(1)));
        assert!(!p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c.starts_with("stuck"))));
        assert_eq!(parse_options(&["stuck_request_secs=0".into()]).unwrap().stuck_request, None);
        for bad in [
            "stuck_request_secs=",
            "stuck_request_secs=-3",
            "stuck_request_secs=1.5",
            "stuck_request_secs=86401",
        ] {
            let e = parse_options(&[bad.into()]).unwrap_err();
            assert!(e.starts_with(&format!("option {bad}: ")) && e.contains("seconds"), "{e}");
        }
    }

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

    #[test]
    fn mountinfo_lists_lanefs_mounts_with_escapes() {
        let info = "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    50 22 0:45 / /tmp/my\\040mnt rw,nosuid,nodev,relatime shared:30 - fuse.lanefs /tmp/a\\040b.img rw,user_id=0,group_id=0\n";
        let m = lanefs_mounts(info);
        assert_eq!(
            m,
            vec![MountEntry {
                mountpoint: PathBuf::from("/tmp/my mnt"),
                source: "/tmp/a b.img".into(),
                dev: "0:45".into(),
                options: "rw,nosuid,nodev,relatime".into(),
            }]
        );
    }
}
