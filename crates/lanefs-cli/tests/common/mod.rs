//! Helpers shared by the FUSE test files: running `lanefs`, mounts that are undone by their exact
//! path whatever happens, daemons stopped by their PID, mkfs and fsck. Each test file uses a part.
#![allow(dead_code)]

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_lanefs");

/// `LANEFS_TEST_NVM=1`: every image these helpers mount gets a persistent-memory region
/// (`--nvm FILE`), and fsck checks it with the image. Read only by test code.
pub fn nvm_mode() -> bool {
    matches!(std::env::var("LANEFS_TEST_NVM").as_deref(), Ok("1" | "true" | "yes"))
}

/// The region of `img` in nvm mode: `IMAGE.nvm` next to it, so it lives exactly as long as the
/// image does (in the test's temporary directory, removed with it) and every remount of the
/// image finds it. `mkfs` removes it, since a fresh image needs a fresh region.
pub fn region_of(img: &Path) -> Option<PathBuf> {
    nvm_mode().then(|| {
        let mut name = img.as_os_str().to_os_string();
        name.push(".nvm");
        std::path::absolute(PathBuf::from(name)).expect("absolute region path")
    })
}

/// `--nvm REGION` for `img` in nvm mode, unless `extra` names a region already.
pub fn nvm_args<S: AsRef<std::ffi::OsStr>>(img: &Path, extra: &[S]) -> Vec<std::ffi::OsString> {
    match region_of(img) {
        Some(r) if !extra.iter().any(|a| a.as_ref() == "--nvm") => vec!["--nvm".into(), r.into_os_string()],
        _ => Vec::new(),
    }
}

/// `LANEFS_TEST_TRANSPORT=dev|uring`: every mount these helpers make asks for that FUSE
/// transport (`-o transport=...`), and the mount is checked to use it (its `lanefs.transport`
/// attribute): `uring` where the kernel cannot serve it fails, it does not fall back in silence.
/// Unset: lanefs's default (io_uring where the kernel offers it). Read only by test code.
pub fn transport() -> Option<&'static str> {
    match std::env::var("LANEFS_TEST_TRANSPORT").as_deref() {
        Ok("dev") => Some("dev"),
        Ok("uring") => Some("uring"),
        Ok("") | Err(_) => None,
        Ok(other) => panic!("LANEFS_TEST_TRANSPORT={other}: give dev or uring"),
    }
}

/// `-o transport=...` for [`transport`], unless `extra` names one already.
pub fn transport_args<S: AsRef<std::ffi::OsStr>>(extra: &[S]) -> Vec<std::ffi::OsString> {
    let named = extra.iter().any(|a| a.as_ref().to_string_lossy().contains("transport="));
    match transport() {
        Some(t) if !named => vec!["-o".into(), format!("transport={t}").into()],
        _ => Vec::new(),
    }
}

/// Checks that the mount at `mp` serves with the transport [`transport`] asks for.
pub fn check_transport<S: AsRef<std::ffi::OsStr>>(mp: &Path, extra: &[S]) {
    if transport_args(extra).is_empty() {
        return;
    }
    let said = lanefs_fuse::stats::read_transport(mp).expect("the lanefs.transport attribute");
    let want = if transport() == Some("uring") { "io_uring" } else { "/dev/fuse" };
    assert!(said.starts_with(want), "LANEFS_TEST_TRANSPORT asks for {want}, the mount says: {said}");
}

/// Whether FUSE tests can run here: root, /dev/fuse and fusermount3. Where they are expected to
/// run (under CI, or as root, who can have FUSE) a missing piece is a failure, not a skip: a suite
/// that passes by running nothing hides what it was meant to find. Elsewhere it prints why not.
pub fn fuse_available() -> bool {
    let why_not = if !rustix::process::geteuid().is_root() {
        Some("FUSE tests need root")
    } else if !Path::new("/dev/fuse").exists() {
        Some("FUSE tests need /dev/fuse")
    } else if !std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").is_file()))
    {
        Some("FUSE tests need fusermount3 (fuse3) on PATH")
    } else {
        None
    };
    let Some(why) = why_not else { return true };
    let expected = if std::env::var_os("CI").is_some() {
        Some("CI is set")
    } else if rustix::process::geteuid().is_root() {
        Some("running as root")
    } else {
        None
    };
    if let Some(expected) = expected {
        panic!("cannot run: {why} ({expected}, so these tests must run)");
    }
    eprintln!("skipped: {why}");
    false
}

/// Runs `lanefs ARGS`, killing it (by its PID) if it outlives `limit`.
pub fn run(args: &[&std::ffi::OsStr], limit: Duration) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lanefs");
    wait_output(child, limit)
}

pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("lanefs hung for {limit:?}; stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn os<S: AsRef<std::ffi::OsStr> + ?Sized>(s: &S) -> &std::ffi::OsStr {
    s.as_ref()
}

pub fn is_mounted(mp: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    lanefs_fuse::mount::lanefs_mounts(&info).iter().any(|m| m.mountpoint == mp)
}

/// A lanefs mount owned by a test: undone on drop, whatever state it is in.
pub struct Mounted {
    pub mp: PathBuf,
    /// The foreground daemon, when the test started it as its own child.
    pub child: Option<Child>,
}

impl Mounted {
    /// `lanefs mount` as a daemon (the default): the command returns once the mount is up.
    pub fn daemon(img: &Path, mp: &Path, extra: &[&str]) -> Mounted {
        let nvm = nvm_args(img, extra);
        let transport = transport_args(extra);
        let mut args = vec![os("mount"), img.as_os_str(), mp.as_os_str()];
        args.extend(extra.iter().map(os));
        args.extend(nvm.iter().map(os));
        args.extend(transport.iter().map(os));
        let out = run(&args, Duration::from_secs(60));
        assert!(out.status.success(), "mount failed: {}", String::from_utf8_lossy(&out.stderr));
        let mp = mp.canonicalize().unwrap();
        assert!(is_mounted(&mp), "mount returned but {} is not mounted", mp.display());
        // Checked once the guard exists, so that a failed check still unmounts.
        let m = Mounted { mp, child: None };
        check_transport(&m.mp, extra);
        if !nvm.is_empty() {
            assert!(region_of(img).unwrap().exists(), "nvm mode: the mount made no region");
        }
        m
    }

    /// `lanefs mount --foreground` as a child of the test, so that the test can kill it.
    pub fn foreground(img: &Path, mp: &Path) -> Mounted {
        Mounted::foreground_with(img, mp, &[])
    }

    /// `lanefs mount --foreground` with more arguments.
    pub fn foreground_with(img: &Path, mp: &Path, extra: &[&str]) -> Mounted {
        let mut m = Mounted::start_foreground(img, mp, extra);
        let start = Instant::now();
        while !is_mounted(&m.mp) {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("lanefs mount --foreground exited before mounting: {st}");
            }
            assert!(start.elapsed() < Duration::from_secs(60), "mount did not come up");
            std::thread::sleep(Duration::from_millis(5));
        }
        if !nvm_args(img, extra).is_empty() {
            assert!(region_of(img).unwrap().exists(), "nvm mode: the mount made no region");
        }
        check_transport(&m.mp, extra);
        m
    }

    /// Starts `lanefs mount --foreground` and returns at once (recovery may still be running).
    pub fn start_foreground(img: &Path, mp: &Path, extra: &[&str]) -> Mounted {
        let child = Command::new(BIN)
            .args([
                os("mount"),
                img.as_os_str(),
                mp.as_os_str(),
                os("--foreground"),
                os("--threads"),
                os("2"),
            ])
            .args(extra)
            .args(nvm_args(img, extra))
            .args(transport_args(extra))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn lanefs mount");
        Mounted { mp: mp.canonicalize().unwrap(), child: Some(child) }
    }

    /// `lanefs umount`, which returns after the daemon's final checkpoint.
    pub fn umount(mut self) {
        let out = run(&[os("umount"), self.mp.as_os_str()], Duration::from_secs(120));
        assert!(out.status.success(), "umount failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!is_mounted(&self.mp));
        if let Some(mut c) = self.child.take() {
            let st = wait_child(&mut c, Duration::from_secs(60));
            assert!(st.success(), "daemon exited with {st}");
        }
    }

    /// SIGTERM to the foreground daemon: it unmounts and checkpoints.
    pub fn terminate(mut self) {
        let mut c = self.child.take().expect("foreground daemon");
        rustix::process::kill_process(rustix::process::Pid::from_child(&c), rustix::process::Signal::TERM)
            .expect("SIGTERM");
        let st = wait_child(&mut c, Duration::from_secs(120));
        assert!(st.success(), "daemon exited with {st} after SIGTERM");
        assert!(!is_mounted(&self.mp));
    }

    /// SIGKILL to the foreground daemon, then clear the dead mount.
    pub fn kill(mut self) {
        self.sigkill();
        self.detach();
    }

    /// SIGKILL to the foreground daemon (by its PID), reaped; the dead mount stays attached, so
    /// that its users see ENOTCONN rather than the directory below it.
    pub fn sigkill(&mut self) {
        let mut c = self.child.take().expect("foreground daemon");
        c.kill().expect("SIGKILL");
        let _ = c.wait();
    }

    /// Detaches the mount (fusermount3 -u -z on its exact path).
    pub fn detach(self) {
        fusermount_lazy(&self.mp);
        assert!(!is_mounted(&self.mp), "{} is still mounted after fusermount3 -u -z", self.mp.display());
    }
}

pub fn wait_child(c: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = c.try_wait().expect("wait") {
            return st;
        }
        if start.elapsed() > limit {
            let _ = c.kill();
            panic!("daemon {} did not exit within {limit:?}", c.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `fusermount3 -u -z MP`: detaches the mount at exactly this path.
pub fn fusermount_lazy(mp: &Path) {
    let _ = Command::new("fusermount3")
        .args([os("-u"), os("-z"), mp.as_os_str()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&c),
                rustix::process::Signal::TERM,
            );
            let start = Instant::now();
            while c.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if is_mounted(&self.mp) {
            let _ = run(&[os("umount"), self.mp.as_os_str()], Duration::from_secs(120));
        }
        if is_mounted(&self.mp) {
            fusermount_lazy(&self.mp);
        }
    }
}

pub fn mkfs(img: &Path) {
    if let Some(r) = region_of(img) {
        let _ = fs::remove_file(r);
    }
    let out = run(
        &[os("mkfs"), img.as_os_str(), os("--size"), os("1G"), os("--lanes"), os("2")],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "mkfs: {}", String::from_utf8_lossy(&out.stderr));
}

/// A temporary directory holding a fresh image `disk.img` and an empty mount point `mnt`;
/// both go with the directory.
pub fn scratch_image() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    mkfs(&img);
    (dir, img, mp)
}

/// `lanefs fsck IMAGE` must exit 0 (clean); in nvm mode, having checked the region (which
/// every mount through these helpers creates and uses).
pub fn fsck_clean(img: &Path) {
    fsck_clean_when(img, "fsck");
}

/// [`fsck_clean`], its failure message starting with `when` (which round, after what).
pub fn fsck_clean_when(img: &Path, when: &str) {
    let out = fsck(img);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{when}: {text}");
    if region_of(img).is_some_and(|r| r.exists()) {
        assert!(text.contains("note: region "), "{when}: nvm mode: fsck did not check the region: {text}");
    }
}

/// `lanefs fsck IMAGE` (with `--nvm REGION` in nvm mode), whatever it finds.
pub fn fsck(img: &Path) -> Output {
    let nvm = nvm_args::<&str>(img, &[]);
    let mut args = vec![os("fsck"), img.as_os_str()];
    args.extend(nvm.iter().map(os));
    run(&args, Duration::from_secs(120))
}

/// A page-aligned buffer for O_DIRECT.
pub struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let v = vec![0u8; len + 4096];
        let off = (4096 - (v.as_ptr() as usize % 4096)) % 4096;
        AlignedBuf { v, off, len }
    }
    pub fn as_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
    pub fn as_ref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

/// `lanefs mkfs IMAGE --size SIZE --lanes 2` (as [`mkfs`], with another size; the issue 14
/// reproductions use 2G).
pub fn mkfs_sized(img: &Path, size: &str) {
    if let Some(r) = region_of(img) {
        let _ = fs::remove_file(r);
    }
    let out = run(
        &[os("mkfs"), img.as_os_str(), os("--size"), os(size), os("--lanes"), os("2")],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "mkfs: {}", String::from_utf8_lossy(&out.stderr));
}

/// `lanefs umount` right after the test closed files on the mount, retried while fusermount3
/// finds the mount busy (for up to 30 s): the kernel may hold the mount until the daemon has
/// answered the RELEASE of the files just closed. Then waits for the daemon to exit. Returns how
/// many attempts found it busy.
pub fn umount_settled(mut m: Mounted) -> u32 {
    let start = Instant::now();
    let mut busy = 0;
    // Bounded by the 30 s.
    loop {
        let out = run(&[os("umount"), m.mp.as_os_str()], Duration::from_secs(120));
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(err.contains("busy") && start.elapsed() < Duration::from_secs(30), "umount failed: {err}");
        busy += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!is_mounted(&m.mp));
    if let Some(mut c) = m.child.take() {
        let st = wait_child(&mut c, Duration::from_secs(60));
        assert!(st.success(), "daemon exited with {st}");
    }
    busy
}

/// Deterministic bytes.
pub fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs `lanefs ARGS` to completion; returns (exit code, stdout, stderr).
pub fn lanefs(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = run(args, Duration::from_secs(120));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// The ioctls of issue 14, as fstests' godown, fstrim and xfs_io send them.
pub mod ioctls {
    pub const GOINGDOWN: libc::c_ulong = 0x8004_587d;
    pub const FITRIM: libc::c_ulong = 0xc018_5879;
    pub const GETFSLABEL: libc::c_ulong = 0x8100_9431;
    pub const SETFSLABEL: libc::c_ulong = 0x4100_9432;
    pub const LOGFLUSH: u32 = 1;
    pub const NOLOGFLUSH: u32 = 2;

    #[repr(C)]
    #[derive(Debug, Default)]
    pub struct FstrimRange {
        pub start: u64,
        pub len: u64,
        pub minlen: u64,
    }
}

/// `ioctl(fd of path, cmd, arg)` on a file or directory of a mount; the errno on failure.
pub fn ioctl_on<T>(path: &Path, cmd: libc::c_ulong, arg: &mut T) -> io::Result<()> {
    ioctl_fd(&File::open(path)?, cmd, arg)
}

/// `ioctl(f, cmd, arg)`. The tests' one unsafe call (rustix has no untyped ioctl), allowed
/// here alone.
#[allow(unsafe_code)]
pub fn ioctl_fd<T>(f: &File, cmd: libc::c_ulong, arg: &mut T) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `arg` is a live, exclusively borrowed value of the type each command reads and
    // writes (u32, struct fstrim_range, char[256]), valid for the whole call; the descriptor
    // is open for its duration.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd, arg as *mut T) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn errno_of(r: io::Result<impl std::fmt::Debug>) -> i32 {
    match r {
        Ok(v) => panic!("succeeded: {v:?}"),
        Err(e) => e.raw_os_error().expect("an errno"),
    }
}

/// Longer than a tick of the clock the daemon stamps times with.
pub fn tick() {
    std::thread::sleep(Duration::from_millis(30));
}

/// Runs a `lanefs mount` that must fail: non-zero exit, one line on stderr, no panic.
pub fn mount_fails(args: &[&std::ffi::OsStr], what: &str) -> String {
    let mut a = vec![os("mount")];
    a.extend_from_slice(args);
    let out = run(&a, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{what}: mount succeeded");
    assert_eq!(out.status.code(), Some(1), "{what}: exit status {}", out.status);
    assert_eq!(err.lines().count(), 1, "{what}: stderr is not one line: {err:?}");
    assert!(err.starts_with("lanefs mount: "), "{what}: {err:?}");
    assert!(!err.contains("panicked"), "{what}: {err:?}");
    err
}
