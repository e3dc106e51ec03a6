//! Mounting and unmounting: `lanefs mount` and `lanefs umount`.
//!
//! A mount takes an exclusive flock on the image (a second mount of it fails at once), opens the
//! file system (recovering from a crash), mounts it with FUSE and serves requests on N worker
//! threads, each reading its own cloned /dev/fuse descriptor. SIGTERM, SIGINT and SIGHUP unmount
//! it (lazily if it is busy); once the kernel lets go, a final checkpoint makes everything
//! durable and the lock is released.
//!
//! Without `--foreground` the command re-executes itself as a daemon in a new session and waits
//! for it to say that the mount is up, or why it failed: errors reach the caller before it
//! detaches. `lanefs umount` unmounts with fusermount3 and then waits for the daemon's final
//! checkpoint (it waits for the image lock), so an image is complete once it returns.

use crate::adapter::LaneFuse;
use fuser::{Config, MountOption, Session, SessionACL};
use lanefs::device::{DeviceOptions, FileDevice, IoChoice};
use lanefs::{Fs, FsOptions};
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set in the environment of the re-executed daemon.
const DAEMON_ENV: &str = "LANEFS_MOUNT_DAEMON";

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
}

/// Parses `-o` lists. Standard options become fuser's; `allow_other` / `allow_root` set the
/// access list; `threads=N`, `nvm=FILE`, `writeback_cache` and `checkpoint_secs=N` are lanefs's
/// own; anything else is passed to the kernel, which refuses what it does not know.
pub fn parse_options(lists: &[String]) -> Result<Parsed, String> {
    let mut fuse = Vec::new();
    let mut acl = SessionACL::Owner;
    let mut threads = None;
    let mut nvm = None;
    let mut default_permissions = true;
    let mut writeback_cache = false;
    let mut checkpoint_interval = None;
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
            "atime" => MountOption::Atime,
            "noatime" => MountOption::NoAtime,
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
            "writeback_cache" => {
                writeback_cache = true;
                continue;
            }
            // Access-time policies the kernel applies to every mount; FUSE takes no option.
            "relatime" | "norelatime" | "strictatime" | "lazytime" | "nolazytime" | "diratime"
            | "nodiratime" => continue,
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
    // The kernel's own subtype option: /proc/mounts shows the type as fuse.lanefs.
    fuse.push(MountOption::CUSTOM("subtype=lanefs".into()));
    Ok(Parsed { fuse, acl, threads, nvm, writeback_cache, checkpoint_interval })
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Runs `lanefs mount`: in the foreground, as the daemon child, or as the parent that starts
/// the daemon and waits for its word.
pub fn mount_command(args: &MountArgs) -> Result<(), String> {
    let parsed = parse_options(&args.options)?;
    if args.foreground {
        return serve(args, &parsed, &mut || {});
    }
    if std::env::var_os(DAEMON_ENV).is_some() {
        return daemon_child(args, &parsed);
    }
    start_daemon()
}

/// The parent: starts `lanefs mount ...` again as the daemon and relays its first line.
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
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        // One line: "ready" or "error: ..."; EOF if the child died first.
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let line = line.trim_end();
    if line == "ready" {
        return Ok(());
    }
    if let Some(msg) = line.strip_prefix("error: ") {
        let _ = child.wait();
        return Err(msg.to_string());
    }
    match child.wait() {
        Ok(s) => Err(format!("the daemon exited before mounting ({s})")),
        Err(e) => Err(format!("the daemon vanished before mounting: {e}")),
    }
}

/// The daemon: a new session, no terminal, "ready" or the error on stdout (a pipe to the
/// parent), then stdio on /dev/null.
fn daemon_child(args: &MountArgs, parsed: &Parsed) -> Result<(), String> {
    // Not a process group leader (spawned into the parent's group), so setsid succeeds.
    let _ = rustix::process::setsid();
    let mut ready = false;
    let r = serve(args, parsed, &mut || {
        ready = true;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
        drop(out);
        if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
            let _ = rustix::stdio::dup2_stdout(&null);
            let _ = rustix::stdio::dup2_stderr(&null);
        }
    });
    if let (Err(e), false) = (&r, ready) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "error: {e}");
        let _ = out.flush();
    }
    // After the mount there is no one left to tell: the exit status is all.
    r
}

/// Mounts and serves until unmounted; calls `ready` once the mount is up.
fn serve(args: &MountArgs, parsed: &Parsed, ready: &mut dyn FnMut()) -> Result<(), String> {
    // The handlers go in before anything else: a signal that comes during recovery or just as the
    // mount comes up is held and unmounts it once it is up, where the default action would kill
    // the daemon with the mount up and no final checkpoint.
    let signals = catch_signals();
    let (fs, lock, image, mountpoint) = open(args)?;
    let fs = Arc::new(fs);
    let mut config = Config::default();
    config.mount_options = parsed.fuse.clone();
    if !config.mount_options.iter().any(|o| matches!(o, MountOption::FSName(_))) {
        config.mount_options.push(MountOption::FSName(image.display().to_string()));
    }
    config.acl = parsed.acl;
    config.n_threads = Some(args.threads.or(parsed.threads).unwrap_or_else(default_threads).max(1));
    config.clone_fd = true;
    let session = match Session::new(LaneFuse::new(fs.clone(), parsed.writeback_cache), &mountpoint, &config)
    {
        Ok(s) => s,
        Err(e) => {
            let e = format!("cannot mount on {}: {}", mountpoint.display(), plain(&e));
            return Err(match finish(fs, lock) {
                Ok(()) => e,
                Err(f) => format!("{e}; then {f}"),
            });
        }
    };
    let signals = signals.and_then(|s| signal_thread(s, mountpoint.clone()));
    ready();
    let run = session.run();
    if let Some((handle, thread)) = signals {
        handle.close();
        let _ = thread.join();
    }
    let done = finish(fs, lock);
    run.map_err(|e| format!("serving {}: {}", mountpoint.display(), plain(&e)))?;
    done
}

/// Checks the mount point, locks and opens the image.
fn open(args: &MountArgs) -> Result<(Fs, File, PathBuf, PathBuf), String> {
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
    let lock = File::options()
        .read(true)
        .write(true)
        .open(img)
        .map_err(|e| format!("{}: {}", img.display(), plain(&e)))?;
    let image = img.canonicalize().map_err(|e| format!("{}: {}", img.display(), plain(&e)))?;
    let imd = lock.metadata().map_err(|e| format!("{}: {}", img.display(), plain(&e)))?;
    if imd.is_dir() {
        return Err(format!("{} is a directory, not a lanefs image", img.display()));
    }
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            return Err(format!("{} is in use (mounted already, or being checked)", img.display()))
        }
        Err(e) => return Err(format!("{}: cannot lock: {e}", img.display())),
    }
    let dev = FileDevice::open(img, DeviceOptions { io: IoChoice::Auto })
        .map_err(|e| format!("{}: {}", img.display(), plain(&e)))?;
    // `-o ro`: recovery replays into memory only and nothing is ever written to the image.
    let parsed = parse_options(&args.options)?;
    let read_only = parsed.fuse.contains(&MountOption::RO);
    // The daemon leaves its start directory: a relative region path is made absolute first.
    let nvm = match args.nvm.clone().or(parsed.nvm) {
        Some(p) => Some(std::path::absolute(&p).map_err(|e| format!("--nvm {}: {e}", p.display()))?),
        None => None,
    };
    let defaults = FsOptions::default();
    let mut opts = FsOptions { read_only, nvm, nvm_size: args.nvm_size.or(defaults.nvm_size), ..defaults };
    if let Some(interval) = parsed.checkpoint_interval {
        opts.checkpoint_interval = interval;
    }
    let fs = Fs::open(Arc::new(dev), opts).map_err(|e| format!("{}: {e}", img.display()))?;
    // The daemon must not keep its start directory busy.
    let _ = std::env::set_current_dir("/");
    Ok((fs, lock, image, mountpoint))
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
fn signal_thread(mut signals: signal_hook::iterator::Signals, mountpoint: PathBuf) -> Option<SignalThread> {
    let handle = signals.handle();
    let thread = std::thread::Builder::new()
        .name("lanefs-signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                unmount_path(&mountpoint);
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
        if l.len() < 5 || r.len() < 2 || r[0] != "fuse.lanefs" {
            continue;
        }
        out.push(MountEntry { mountpoint: PathBuf::from(unescape(l[4])), source: unescape(r[1]) });
    }
    out
}

/// `lanefs umount MOUNTPOINT`: fusermount3 -u, then wait (up to `wait`) for the daemon's final
/// checkpoint, which ends when it releases the image lock.
pub fn umount_command(mountpoint: &Path, wait: Duration) -> Result<(), String> {
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
    // The source is the image path unless the mount named another fsname.
    let Ok(img) = File::open(&entry.source) else { return Ok(()) };
    let start = Instant::now();
    loop {
        match rustix::fs::flock(&img, rustix::fs::FlockOperation::NonBlockingLockShared) {
            Ok(()) => return Ok(()),
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
            Err(_) => return Ok(()),
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
    }

    #[test]
    fn mountinfo_lists_lanefs_mounts_with_escapes() {
        let info = "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    50 22 0:45 / /tmp/my\\040mnt rw,nosuid,nodev,relatime shared:30 - fuse.lanefs /tmp/a\\040b.img rw,user_id=0,group_id=0\n";
        let m = lanefs_mounts(info);
        assert_eq!(
            m,
            vec![MountEntry { mountpoint: PathBuf::from("/tmp/my mnt"), source: "/tmp/a b.img".into() }]
        );
    }
}
