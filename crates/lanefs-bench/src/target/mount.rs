//! `mount:IMAGE`: lanefs through FUSE, mounted by the harness for the run.
//!
//! The image is created and formatted with the default geometry when it does not exist (as for
//! `lib:`). The real `lanefs mount` serves it, started as `lanefs mount IMAGE MP --foreground`, a
//! child of the benchmark in its own process group (a Ctrl-C at the terminal reaches the harness,
//! which stops in order, and not the file system under it), on a fresh mount point in the temporary directory ($TMPDIR, else /tmp).
//! `$LANEFS_MOUNT_OPTIONS` adds arguments to that command line (`-o writeback_cache`).
//! Once /proc/self/mountinfo shows `fuse.lanefs` there, the workloads run through a
//! [`DirTarget`] over the mount point, as any program would (O_DIRECT included: the adapter
//! answers such opens with FOPEN_DIRECT_IO).
//!
//! [`MountTarget::close`] (and Drop, on every other way out) unmounts with `lanefs umount MP`,
//! which returns once the daemon's final checkpoint is on disk, falls back to `fusermount3 -u
//! MP` if that fails, waits for the daemon (by its PID: SIGTERM, and at last SIGKILL, only if it
//! does not end), and removes the mount point. Everything by exact path or PID.

use crate::target::{fs_type_of, DirTarget, File, IoCounters, OpenOptions, Stat, Target};
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Overrides the `lanefs` executable that mounts (tests, or a bench run from another binary).
pub const BIN_ENV: &str = "LANEFS_BIN";

/// Extra arguments for `lanefs mount`, split at white space (`-o writeback_cache --threads 4`).
pub const MOUNT_ARGS_ENV: &str = "LANEFS_MOUNT_OPTIONS";

/// How long a mount may take to appear (recovery of a large image included).
const MOUNT_WAIT: Duration = Duration::from_secs(120);
/// `lanefs umount` waits up to 120 s for the final checkpoint itself; a little more for it.
const UMOUNT_WAIT: Duration = Duration::from_secs(150);
/// After the unmount, how long the daemon may take to exit before it gets SIGTERM, then SIGKILL.
const EXIT_WAIT: Duration = Duration::from_secs(60);

/// The `lanefs` executable: `$LANEFS_BIN`, else this process when it is `lanefs` itself (as in
/// `lanefs bench`).
pub fn lanefs_bin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(BIN_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the lanefs executable: {e}"))?;
    if exe.file_name().is_some_and(|n| n == "lanefs") {
        return Ok(exe);
    }
    Err(format!(
        "this program ({}) is not the lanefs executable: run mount: targets through `lanefs bench` or set {BIN_ENV}",
        exe.display()
    ))
}

/// Why a lanefs FUSE mount cannot be made here, if it cannot.
pub fn unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing (no FUSE in this kernel or container)".into());
    }
    if find_program("fusermount3").is_none() {
        return Some("fusermount3 not found (install fuse3)".into());
    }
    None
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/bin", "/usr/bin", "/bin"].iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether `mp` (canonical) is a lanefs FUSE mount point now.
pub fn is_lanefs_mount(mp: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    lanefs_fuse::mount::lanefs_mounts(&info).iter().any(|m| m.mountpoint == mp)
}

/// Whether anything is mounted on `mp` (canonical), lanefs or not.
fn is_mount_point(mp: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines().filter_map(|l| l.split(' ').nth(4)).any(|f| crate::target::unescape_mount(f) == mp)
}

/// A fresh, empty directory `PARENT/PREFIX-PID-XXXXXXXX` (created here, so it is ours).
pub fn fresh_dir(parent: &Path, prefix: &str) -> Result<PathBuf, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    for i in 0..100u32 {
        let p = parent.join(format!(
            "{prefix}-{}-{:08x}",
            std::process::id(),
            nanos.wrapping_add(i.wrapping_mul(7919))
        ));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    Err(format!("cannot create a directory under {}", parent.display()))
}

/// A mounted lanefs: the daemon (our child) and its mount point.
struct Mounted {
    bin: PathBuf,
    /// Canonical.
    mp: PathBuf,
    child: Option<Child>,
    /// Collects the daemon's stderr (so that a full pipe never blocks it).
    stderr: Option<JoinHandle<String>>,
}

impl Mounted {
    /// The daemon's stderr so far, once it has exited: its first non-empty line.
    fn stderr_line(&mut self) -> String {
        let all = self.stderr.take().and_then(|h| h.join().ok()).unwrap_or_default();
        all.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string()
    }

    /// Unmounts, waits for the daemon, removes the mount point. Returns every problem met.
    fn teardown(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        let mp = self.mp.clone();
        if is_mount_point(&mp) {
            // `lanefs umount` waits for the final checkpoint; fusermount3 -u only unmounts.
            if let Err(e) = run_bounded(Command::new(&self.bin).arg("umount").arg(&mp), UMOUNT_WAIT) {
                let mut last = e.clone();
                let mut done = false;
                // Busy for a moment after the last close: retry before giving up.
                for _ in 0..20 {
                    if !is_mount_point(&mp) {
                        done = true;
                        break;
                    }
                    match run_bounded(Command::new("fusermount3").arg("-u").arg("--").arg(&mp), UMOUNT_WAIT) {
                        Ok(()) => {
                            done = true;
                            break;
                        }
                        Err(e) => last = e,
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                if !done {
                    errors.push(format!("lanefs umount {}: {e}; fusermount3 -u: {last}", mp.display()));
                }
            }
        }
        if let Some(mut child) = self.child.take() {
            match wait_child(&mut child, EXIT_WAIT) {
                Some(st) if st.success() => {}
                Some(st) => {
                    let line = self.stderr_line();
                    errors.push(format!(
                        "the lanefs daemon of {} exited with {st}{}",
                        mp.display(),
                        if line.is_empty() { String::new() } else { format!(": {line}") }
                    ));
                }
                None => {
                    // Still serving (the unmount failed): SIGTERM makes it unmount itself, lazily
                    // if busy, and checkpoint; SIGKILL only if even that does not end it.
                    let pid = rustix::process::Pid::from_child(&child);
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                    if wait_child(&mut child, EXIT_WAIT).is_none() {
                        let _ = child.kill();
                        let _ = child.wait();
                        errors.push(format!("the lanefs daemon of {} had to be killed", mp.display()));
                    } else {
                        errors.push(format!("the lanefs daemon of {} needed SIGTERM to stop", mp.display()));
                    }
                }
            }
        }
        // A daemon that died leaves a dead mount (ENOTCONN) behind: detach it.
        if is_mount_point(&mp) {
            let _ =
                run_bounded(Command::new("fusermount3").arg("-u").arg("-z").arg("--").arg(&mp), UMOUNT_WAIT);
        }
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        // remove_dir, never remove_dir_all: a mount point that still holds a mount stays.
        if let Err(e) = std::fs::remove_dir(&mp) {
            if e.kind() != io::ErrorKind::NotFound {
                errors.push(format!("rmdir {}: {e}", mp.display()));
            }
        }
        errors
    }
}

/// Waits up to `limit` for the child; None if it is still running.
fn wait_child(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => return None,
            // Not waitable (already reaped): treat as gone.
            Err(_) => return Some(std::process::ExitStatus::default()),
        }
    }
}

/// Runs a command to completion within `limit` (killed by its PID after that); the first line of
/// its stderr becomes the error.
fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<(), String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {name}: {e}"))?;
    let err = child.stderr.take().map(drain);
    let st = wait_child(&mut child, limit);
    if st.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let text = err.and_then(|h| h.join().ok()).unwrap_or_default();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
    match st {
        Some(st) if st.success() => Ok(()),
        Some(st) => Err(if first.is_empty() { format!("{name} failed ({st})") } else { first }),
        None => Err(format!("{name} did not finish in {} s", limit.as_secs())),
    }
}

/// Reads a pipe to its end on a thread (at most 64 KiB kept).
fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            if kept.len() < 64 << 10 {
                kept.extend_from_slice(&buf[..n]);
            }
        }
        String::from_utf8_lossy(&kept).into_owned()
    })
}

/// lanefs mounted through FUSE for the run.
pub struct MountTarget {
    spec: String,
    dir: DirTarget,
    mounted: Mutex<Option<Mounted>>,
}

impl MountTarget {
    /// Mounts `image` (created when missing) with the `lanefs` executable from [`lanefs_bin`].
    pub fn open(image: &Path) -> Result<MountTarget, String> {
        let spec = format!("mount:{}", image.display());
        let bin = lanefs_bin().map_err(|e| format!("{spec}: {e}"))?;
        MountTarget::open_with(image, &bin)
    }

    /// Mounts `image` (created when missing) with the given `lanefs` executable.
    pub fn open_with(image: &Path, bin: &Path) -> Result<MountTarget, String> {
        let spec = format!("mount:{}", image.display());
        let e = |m: String| format!("{spec}: {m}");
        if let Some(why) = unavailable() {
            return Err(e(why));
        }
        if !bin.is_file() {
            return Err(e(format!("lanefs executable {} not found", bin.display())));
        }
        crate::target::library::create_if_missing(image).map_err(e)?;
        let made = fresh_dir(&std::env::temp_dir(), "lanefs-bench-mnt").map_err(e)?;
        // From here on the mount point (and soon the daemon) is undone on every way out.
        let mut m = Mounted { bin: bin.to_path_buf(), mp: made.clone(), child: None, stderr: None };
        match Self::start(&mut m, image) {
            Ok(()) => match DirTarget::new(&m.mp) {
                Ok(dir) => Ok(MountTarget { spec, dir, mounted: Mutex::new(Some(m)) }),
                Err(err) => {
                    m.teardown();
                    Err(e(err))
                }
            },
            Err(err) => {
                let mut all = vec![err];
                all.extend(m.teardown());
                Err(e(all.join("; then ")))
            }
        }
    }

    fn start(m: &mut Mounted, image: &Path) -> Result<(), String> {
        m.mp = m.mp.canonicalize().map_err(|e| format!("{}: {e}", m.mp.display()))?;
        let mut child = Command::new(&m.bin)
            .arg("mount")
            .arg(image)
            .arg(&m.mp)
            .arg("--foreground")
            .args(std::env::var(MOUNT_ARGS_ENV).unwrap_or_default().split_whitespace())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Its own process group: the terminal's SIGINT goes to the harness, which then
            // unmounts in order, not to the daemon in the middle of a run.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot run {} mount: {e}", m.bin.display()))?;
        m.stderr = child.stderr.take().map(drain);
        m.child = Some(child);
        let start = Instant::now();
        loop {
            if is_lanefs_mount(&m.mp) {
                return Ok(());
            }
            let child = m.child.as_mut().ok_or("the daemon vanished")?;
            if let Ok(Some(st)) = child.try_wait() {
                m.child = None;
                let line = m.stderr_line();
                let line = line.strip_prefix("lanefs mount: ").unwrap_or(&line).to_string();
                return Err(if line.is_empty() {
                    format!("lanefs mount exited before mounting ({st})")
                } else {
                    format!("lanefs mount failed: {line}")
                });
            }
            if crate::runner::interrupted() {
                return Err("interrupted while mounting".into());
            }
            if start.elapsed() > MOUNT_WAIT {
                return Err(format!("the mount did not appear within {} s", MOUNT_WAIT.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The mount point while mounted.
    pub fn mount_point(&self) -> Option<PathBuf> {
        self.mounted.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|m| m.mp.clone())
    }
}

impl Drop for MountTarget {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            crate::progress::say(&format!("lanefs bench: cleanup: {e}"));
        }
    }
}

impl Target for MountTarget {
    fn spec(&self) -> String {
        self.spec.clone()
    }
    fn fs_type(&self) -> String {
        match self.mount_point() {
            Some(mp) => fs_type_of(&mp),
            None => "unmounted".into(),
        }
    }
    fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Box<dyn File>> {
        self.dir.open(path, opts)
    }
    crate::target::forward_namespace!(dir);
    fn create(&self, path: &Path) -> io::Result<()> {
        self.dir.create(path)
    }
    fn space(&self) -> io::Result<(u64, u64)> {
        self.dir.space()
    }
    fn sync(&self) -> io::Result<()> {
        self.dir.sync()
    }
    fn fuse_requests(&self) -> Option<Vec<(String, u64)>> {
        lanefs_fuse::stats::read(&self.mount_point()?).ok()
    }

    /// The daemon's engine counters (`lanefs.engine`). The daemon keeps no per-run peak, so
    /// `cp_exclusive_us_max` is the longest since the mount: an upper bound of the run's own.
    fn io_counters(&self) -> Option<IoCounters> {
        let e = lanefs_fuse::stats::read_engine(&self.mount_point()?).ok()?;
        Some(IoCounters {
            user_bytes: e.get("user_bytes")?,
            device_bytes: e.get("device_bytes")?,
            cleaning_bytes: e.get("cleaning_bytes")?,
            segments_cleaned: e.get("segments_cleaned")?,
            checkpoints: e.get("checkpoints")?,
            cp_exclusive_us_max: e.get("cp_exclusive_us_max")?,
            cp_waits: e.get("cp_waits")?,
            cp_helped: e.get("cp_helped")?,
            fsync_flushes: e.get("fsync_device_flushes")?,
            fsyncs: e.get("fsync_flushes")?,
        })
    }

    /// The daemon's contention census (`lanefs.engine`): counted by the daemon's process.
    fn lock_census(&self) -> Option<lanefs::sync::Census> {
        Some(lanefs_fuse::stats::read_engine(&self.mount_point()?).ok()?.census())
    }

    /// Unmounts (waiting for the final checkpoint) and removes the mount point; idempotent.
    fn close(&self) -> Result<(), String> {
        let taken = self.mounted.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut m) = taken else { return Ok(()) };
        let errors = m.teardown();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: {}", self.spec, errors.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::open_target;

    #[test]
    fn mount_target_without_lanefs_executable_fails_in_one_line() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("m.img");
        let e = crate::target::mount::MountTarget::open_with(&img, Path::new("/nonexistent/lanefs"))
            .err()
            .unwrap();
        assert!(e.starts_with(&format!("mount:{}: ", img.display())) && !e.contains('\n'), "{e}");
        assert!(!img.exists(), "no image is made for a mount that cannot happen");
        if std::env::var_os(crate::target::mount::BIN_ENV).is_none() {
            // This test binary is not `lanefs`: the error says how to name it.
            let e = open_target(&format!("mount:{}", img.display()).parse().unwrap()).err().unwrap();
            assert!(e.contains(crate::target::mount::BIN_ENV) && !e.contains('\n'), "{e}");
            assert!(!img.exists());
        }
    }
}
