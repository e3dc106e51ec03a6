//! The life of a lanefs mount through FUSE: the stuck-request log, `umount` then `mount` at
//! once, a second mount of a mounted image, the mount(8) helper's flags, a write-protected
//! device, and FUSE tests that fail rather than skip. Each needs root, /dev/fuse and
//! fusermount3 (see `common::fuse_available`).

mod common;

use common::*;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The lanefs mount at `mp` as mountinfo lists it (the last one there).
fn mount_entry(mp: &Path) -> lanefs_fuse::mount::MountEntry {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    lanefs_fuse::mount::lanefs_mounts(&info)
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == mp)
        .unwrap_or_else(|| panic!("{} is not a lanefs mount", mp.display()))
}

/// The mount options of the mount at `mp`, one by one.
fn mount_flags(mp: &Path) -> Vec<String> {
    mount_entry(mp).options.split(',').map(String::from).collect()
}

/// `lanefs mount IMAGE MP EXTRA...` (with the region in nvm mode) run to its end.
fn mount_cmd(img: &Path, mp: &Path, extra: &[&str]) -> std::process::Output {
    let nvm = nvm_args(img, extra);
    let mut args = vec![os("mount"), img.as_os_str(), mp.as_os_str()];
    args.extend(extra.iter().map(os));
    args.extend(nvm.iter().map(os));
    run(&args, Duration::from_secs(120))
}

/// Sends SIGCONT to a stopped process when dropped, so that a failing test leaves no daemon
/// stopped (and no mount on top of it hung).
struct Resume(rustix::process::Pid);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.0, rustix::process::Signal::CONT);
    }
}

/// The kernel's id of the calling thread: FUSE sends it as the request's pid.
fn thread_id() -> u32 {
    let link = fs::read_link("/proc/thread-self").unwrap();
    link.to_string_lossy().rsplit('/').next().unwrap().parse().unwrap()
}

#[test]
fn a_stuck_request_is_logged_once_with_its_opcode_and_inode() {
    if !fuse_available() {
        return;
    }
    // A request that is really stuck, without a hook in the daemon: the image lives on a second
    // lanefs mount whose daemon is then stopped (SIGSTOP), so that the device write of an fsync
    // waits in the kernel until it is resumed, as on a device that stops answering.
    let dir = tempfile::tempdir().unwrap();
    let low_img = dir.path().join("low.img");
    let low_mp = dir.path().join("low");
    let mp = dir.path().join("mnt");
    fs::create_dir(&low_mp).unwrap();
    fs::create_dir(&mp).unwrap();
    mkfs(&low_img);
    let low = Mounted::foreground(&low_img, &low_mp);
    let img = low.mp.join("upper.img");
    let out = run(
        &[os("mkfs"), img.as_os_str(), os("--size"), os("256M"), os("--lanes"), os("2")],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "mkfs: {}", String::from_utf8_lossy(&out.stderr));
    // Without a region even in nvm mode: the test is about the request log, not the region.
    let mut child = Command::new(BIN)
        .args([os("mount"), img.as_os_str(), mp.as_os_str(), os("--foreground"), os("--threads"), os("2")])
        .args(["-o", "stuck_request_secs=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lanefs mount");
    let stderr = child.stderr.take().unwrap();
    let upper = Mounted { mp: mp.canonicalize().unwrap(), child: Some(child) };
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in io::BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    let start = std::time::Instant::now();
    while !is_mounted(&upper.mp) {
        assert!(start.elapsed() < Duration::from_secs(60), "mount did not come up: {:?}", lines.lock());
        std::thread::sleep(Duration::from_millis(10));
    }
    let path = upper.mp.join("f");
    let f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
    f.write_all_at(&data(3, 1 << 20), 0).unwrap();
    let ino = f.metadata().unwrap().ino();

    let low_pid = rustix::process::Pid::from_child(low.child.as_ref().unwrap());
    rustix::process::kill_process(low_pid, rustix::process::Signal::STOP).unwrap();
    let resume = Resume(low_pid);
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let fsync = std::thread::spawn(move || {
        tid_tx.send(thread_id()).unwrap();
        f.sync_all()
    });
    let tid = tid_rx.recv().unwrap();
    let want = format!("request FSYNC on inode {ino} from pid {tid} in flight for ");
    let start = std::time::Instant::now();
    while !lines.lock().unwrap().iter().any(|l| l.contains(&want)) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no stuck-request line after 30 s: {:?}",
            lines.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Several more looks of the watcher (every 0.5 s at a 1 s threshold): still one line.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!fsync.is_finished(), "the fsync returned while the device was stopped");
    drop(resume);
    fsync.join().unwrap().expect("fsync once the device is back");
    let got = lines.lock().unwrap().clone();
    let stuck: Vec<&String> = got.iter().filter(|l| l.contains("request ")).collect();
    assert_eq!(stuck.len(), 1, "one request, one line: {got:?}");
    let line = stuck[0];
    assert!(line.starts_with(&format!("lanefs: {}: ", upper.mp.display())), "{line}");
    assert!(line.ends_with("the mount may be hung"), "{line}");
    assert_eq!(fs::read(&path).unwrap(), data(3, 1 << 20));
    upper.umount();
    reader.join().unwrap();
    fsck_clean(&img);
    low.umount();
    fsck_clean(&low_img);
}

#[test]
fn umount_then_mount_at_once_waits_for_the_old_daemon() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    // Undoes whatever is mounted at the mount point at the end, whichever daemon serves it.
    let m = Mounted::daemon(&img, &mp, &[]);
    let waiting = format!(
        "lanefs mount: waiting for the previous lanefs daemon to release {} (final checkpoint)",
        img.display()
    );
    const ROUNDS: u64 = 5;
    const LEN: usize = 24 << 20;
    let mut waited = 0;
    for round in 0..ROUNDS {
        // Not synced: the old daemon's final checkpoint writes it after umount has returned.
        fs::write(m.mp.join(format!("r{round}")), data(round, LEN)).unwrap();
        // Plain umount(8) and fusermount3 -u, as scripts and fstests do: neither waits.
        let st = if round % 2 == 0 {
            Command::new("umount").arg(&m.mp).status().unwrap()
        } else {
            Command::new("fusermount3").arg("-u").arg(&m.mp).status().unwrap()
        };
        assert!(st.success(), "round {round}: unmount: {st}");
        assert!(!is_mounted(&m.mp));
        let out = mount_cmd(&img, &mp, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "round {round}: mount at once after umount: {err}");
        // Silent unless the old daemon takes longer than QUIET_WAIT (then one line).
        for line in err.lines() {
            assert_eq!(line, waiting, "round {round}: stderr {err:?}");
        }
        waited += usize::from(!err.is_empty());
        assert!(is_mounted(&m.mp));
        for r in 0..=round {
            assert!(
                fs::read(m.mp.join(format!("r{r}"))).unwrap() == data(r, LEN),
                "round {round}: r{r} differs"
            );
        }
    }
    // Every mount right after umount succeeded: it met the old daemon's lock and waited for it
    // (the message itself is tested in lanefs-fuse's mount tests).
    eprintln!("{waited} of {ROUNDS} mounts waited longer than the quiet second");
    m.umount();
    fsck_clean(&img);
}

#[test]
fn a_second_mount_of_a_mounted_image_is_a_bind_of_the_first() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let [mp1, mp2, mp3] = ["m1", "m2", "m3"].map(|n| dir.path().join(n));
    for mp in [&mp1, &mp2, &mp3] {
        fs::create_dir(mp).unwrap();
    }
    mkfs(&img);
    let m1 = Mounted::daemon(&img, &mp1, &[]);
    let bind = |mp: &Path, extra: &[&str]| {
        let out = mount_cmd(&img, mp, extra);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "second mount: {err}");
        let mp = mp.canonicalize().unwrap();
        assert!(err.is_empty(), "as quiet as a second mount of a device: {err}");
        assert_eq!(mount_entry(&mp).dev, mount_entry(&m1.mp).dev, "not the same file system");
        Mounted { mp, child: None }
    };
    let m2 = bind(&mp2, &[]);

    // generic/732: renames through either mount point, seen through the other.
    let (a, b) = (&m1.mp, &m2.mp);
    fs::create_dir(a.join("A")).unwrap();
    fs::create_dir(a.join("B")).unwrap();
    fs::write(a.join("A/f"), b"732").unwrap();
    fs::rename(a.join("A/f"), a.join("B/f")).unwrap();
    assert_eq!(fs::read(b.join("B/f")).unwrap(), b"732");
    fs::rename(b.join("B/f"), b.join("A/f")).unwrap();
    assert_eq!(fs::read(a.join("A/f")).unwrap(), b"732");
    fs::rename(a.join("A/f"), a.join("B/f")).unwrap();

    // The same mount point again is refused, as the kernel refuses it (EBUSY).
    let e = mount_fails(&[img.as_os_str(), mp1.as_os_str()], "same image, same mount point");
    assert!(e.contains("is mounted on") && e.contains("already"), "{e}");

    // A second mount takes its own per-mount flags: read-only here, the first stays writable.
    let m3 = bind(&mp3, &["-o", "ro"]);
    assert!(mount_flags(&m3.mp).contains(&"ro".to_string()), "{:?}", mount_flags(&m3.mp));
    assert!(mount_flags(&m1.mp).contains(&"rw".to_string()));
    let e = fs::write(m3.mp.join("no"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(fs::read(m3.mp.join("B/f")).unwrap(), b"732");

    // Unmounting a bind returns at once (the image stays locked: it is still mounted).
    for m in [m3, m2] {
        let t = std::time::Instant::now();
        let out = run(&[os("umount"), m.mp.as_os_str()], Duration::from_secs(120));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(err.contains(&format!("still mounted at {}", m1.mp.display())), "{err}");
        assert!(t.elapsed() < Duration::from_secs(20), "umount of a bind waited {:?}", t.elapsed());
        assert!(!is_mounted(&m.mp));
    }
    fs::write(m1.mp.join("after"), b"still served").unwrap();

    // The first mount goes first: the bind goes on serving; its umount is the last and waits
    // for the final checkpoint.
    let m2 = bind(&mp2, &[]);
    let out = run(&[os("umount"), m1.mp.as_os_str()], Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(&m1.mp));
    drop(m1);
    fs::write(m2.mp.join("last"), b"through the bind").unwrap();
    m2.umount();
    fsck_clean(&img);
    let m = Mounted::daemon(&img, &mp1, &[]);
    assert_eq!(fs::read(m.mp.join("B/f")).unwrap(), b"732");
    assert_eq!(fs::read(m.mp.join("after")).unwrap(), b"still served");
    assert_eq!(fs::read(m.mp.join("last")).unwrap(), b"through the bind");
    m.umount();
}

/// Removes a file by its exact path when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[test]
fn the_mount_helper_passes_dev_and_suid_through() {
    if !fuse_available() {
        return;
    }
    // mount(8) looks for helpers in /sbin only: this test's own copy, under a type of its own
    // (so an installed lanefs and its helper are left alone), running this build of lanefs.
    let ty = format!("fuse.lanefstest{}", std::process::id());
    let helper = PathBuf::from(format!("/sbin/mount.{ty}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mount.lanefs");
    fs::copy(&script, &helper).unwrap();
    let _remove = RemoveOnDrop(helper.clone());
    fs::set_permissions(&helper, fs::Permissions::from_mode(0o755)).unwrap();
    let (_dir, img, mp) = scratch_image();
    let mp = mp.canonicalize().unwrap();
    for (opts, want, not) in [
        ("dev,suid", &[][..], &["nodev", "nosuid"][..]),
        ("nodev,nosuid,noexec", &["nodev", "nosuid", "noexec"][..], &[][..]),
        // As root, no option gives what a kernel file system gets: dev and suid.
        ("allow_other", &[][..], &["nodev", "nosuid", "noexec"][..]),
    ] {
        let mut o = opts.to_string();
        if let Some(r) = region_of(&img) {
            o.push_str(&format!(",nvm={}", r.display()));
        }
        let out = Command::new("mount")
            .args(["-t", &ty])
            .arg(&img)
            .arg(&mp)
            .args(["-o", &o])
            .env("LANEFS_BIN", BIN)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "mount -o {opts}: {}", String::from_utf8_lossy(&out.stderr));
        let m = Mounted { mp: mp.clone(), child: None };
        let flags = mount_flags(&m.mp);
        for w in want {
            assert!(flags.iter().any(|f| f == w), "-o {opts}: {w} missing from {flags:?}");
        }
        for n in not {
            assert!(!flags.iter().any(|f| f == n), "-o {opts}: {n} in {flags:?}");
        }
        m.umount();
    }
    fsck_clean(&img);
}

#[test]
fn fuse_tests_fail_rather_than_skip_where_they_should_run() {
    // This test binary again, running one FUSE test with no fusermount3 on PATH.
    let exe = std::env::current_exe().unwrap();
    let child = |ci: bool| {
        let mut c = Command::new(&exe);
        c.args([
            "--exact",
            "umount_then_mount_at_once_waits_for_the_old_daemon",
            "--test-threads",
            "1",
            "--nocapture",
        ])
        .env("PATH", "/nonexistent")
        .env_remove("CI")
        .stdin(Stdio::null());
        if ci {
            c.env("CI", "1");
        }
        let out = c.output().unwrap();
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    let (ok, text) = child(true);
    assert!(!ok, "under CI a FUSE test that cannot run passed: {text}");
    assert!(
        text.contains("cannot run: FUSE tests need") && text.contains("(CI is set, so these tests must run)"),
        "{text}"
    );
    let (ok, text) = child(false);
    if rustix::process::geteuid().is_root() {
        assert!(!ok, "as root a FUSE test that cannot run passed: {text}");
        assert!(
            text.contains("cannot run: FUSE tests need fusermount3") && text.contains("(running as root"),
            "{text}"
        );
    } else {
        assert!(ok && text.contains("skipped: FUSE tests need root"), "{text}");
    }
}

/// A loop device over an image, read-only or not; set read-write again and detached (by its
/// exact name) when dropped.
struct LoopDevice(PathBuf);

impl LoopDevice {
    fn attach(img: &Path) -> LoopDevice {
        let out = Command::new("losetup").arg("--find").arg("--show").arg(img).output().expect("losetup");
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        LoopDevice(PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()))
    }

    fn set_read_only(&self, ro: bool) {
        let st = Command::new("blockdev").arg(if ro { "--setro" } else { "--setrw" }).arg(&self.0).status();
        assert!(st.expect("blockdev").success());
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("blockdev").arg("--setrw").arg(&self.0).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn a_write_protected_device_is_mounted_read_only_with_a_word() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    fs::write(m.mp.join("f"), b"on the device").unwrap();
    m.umount();
    let dev = LoopDevice::attach(&img);
    // In nvm mode the image's region goes with it (the helpers would look for the device's).
    let region = region_of(&img).map(|r| r.into_os_string().into_string().unwrap());
    let on_dev = |opts: &[&'static str]| {
        let mut args: Vec<&str> = opts.to_vec();
        if let Some(r) = &region {
            args.extend(["--nvm", r.as_str()]);
        }
        mount_cmd(&dev.0, &mp, &args)
    };
    dev.set_read_only(true);
    // As a kernel file system: mounted read-only, and mount says why (fstests' filter for
    // generic/050 looks for "write-protected, mount.*read-only"). `rw` is what mount(8) passes
    // on when nothing is asked for.
    let out = on_dev(&["-o", "rw"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    assert!(err.contains("is write-protected, mounting read-only"), "{err}");
    let m = Mounted { mp: mp.canonicalize().unwrap(), child: None };
    assert!(mount_flags(&m.mp).contains(&"ro".to_string()), "{:?}", mount_flags(&m.mp));
    assert_eq!(fs::read(m.mp.join("f")).unwrap(), b"on the device");
    assert_eq!(errno_of(File::create(m.mp.join("g"))), libc::EROFS);
    m.umount();
    // norecovery needs a read-only mount: a write-protected device is one.
    let out = on_dev(&["-o", "norecovery"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = Mounted { mp: mp.canonicalize().unwrap(), child: None };
    assert_eq!(fs::read(m.mp.join("f")).unwrap(), b"on the device");
    m.umount();
    dev.set_read_only(false);
    let out = on_dev(&["-o", "norecovery"]);
    assert!(!out.status.success() && !is_mounted(&mp.canonicalize().unwrap()));
    assert!(String::from_utf8_lossy(&out.stderr).contains("norecovery needs ro"));
    // A writable one is mounted read-write, silently.
    let out = on_dev(&[]);
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = Mounted { mp: mp.canonicalize().unwrap(), child: None };
    fs::write(m.mp.join("g"), b"written").unwrap();
    m.umount();
    drop(dev);
    fsck_clean(&img);
}

/// The kernel's writeback settings for the mount (`lanefs_fuse::mount` `dirty`): the whole
/// dirty budget by default, the kernel's strict 1% with `-o dirty_limit=strict`.
#[test]
fn the_mount_shares_the_dirty_budget_unless_asked_not_to() {
    if !fuse_available() {
        return;
    }
    for (extra, strict, ratio) in [(None, "0", "100"), (Some("dirty_limit=strict"), "1", "1")] {
        let (_dir, img, mp) = scratch_image();
        let opts: Vec<&str> = extra.map(|o| vec!["-o", o]).unwrap_or_default();
        let m = Mounted::daemon(&img, &mp, &opts);
        let dev = mount_entry(&m.mp).dev;
        let bdi = Path::new("/sys/class/bdi").join(&dev);
        let read = |n: &str| fs::read_to_string(bdi.join(n)).unwrap().trim().to_string();
        assert_eq!(read("strict_limit"), strict, "{extra:?}: strict_limit of {}", bdi.display());
        assert_eq!(read("max_ratio"), ratio, "{extra:?}: max_ratio of {}", bdi.display());
        m.umount();
    }
}

/// A request handler that panics (a bug; injected here with `LANEFS_TEST_PANIC_LOOKUP`) answers
/// its request EIO and shuts the file system down: the application gets an error, never a
/// hang (over io_uring the panicking worker was its CPU's only one), every later request gets
/// EIO too, the mount comes down, and the next mount has everything fsynced before.
#[test]
fn a_panicking_handler_fails_its_request_and_shuts_down_without_a_hang() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let none: &[&str] = &[];
    let child = Command::new(BIN)
        .args([os("mount"), img.as_os_str(), mp.as_os_str(), os("--foreground"), os("--threads"), os("2")])
        .args(nvm_args(&img, none))
        .args(transport_args(none))
        .env("LANEFS_TEST_PANIC_LOOKUP", "boom")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn lanefs mount");
    let mut m = Mounted { mp: mp.canonicalize().unwrap(), child: Some(child) };
    let start = std::time::Instant::now();
    while !is_mounted(&m.mp) {
        assert!(start.elapsed() < Duration::from_secs(60), "mount did not come up");
        std::thread::sleep(Duration::from_millis(5));
    }
    let kept = data(7, 10_000);
    {
        let f = File::create(m.mp.join("kept")).unwrap();
        f.write_all_at(&kept, 0).unwrap();
        f.sync_all().unwrap();
    }
    // Each stat in a thread of its own, with a deadline: a hang is the failure looked for.
    let stat = |name: &str| {
        let p = m.mp.join(name);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(fs::symlink_metadata(&p).map(|_| ()).map_err(|e| e.raw_os_error()));
        });
        rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("stat of {name} hung"))
    };
    assert_eq!(stat("boom"), Err(Some(libc::EIO)), "the panicking lookup answers EIO");
    // Later requests, from both CPUs' queues: the file system is shut down.
    for i in 0..8 {
        assert_eq!(stat(&format!("other{i}")), Err(Some(libc::EIO)), "after the panic");
    }
    let out = run(&[os("umount"), m.mp.as_os_str()], Duration::from_secs(120));
    assert!(!is_mounted(&m.mp), "umount after the panic: {}", String::from_utf8_lossy(&out.stderr));
    // It exits (its final checkpoint refused: nothing is written after a shutdown).
    wait_child(m.child.as_mut().unwrap(), Duration::from_secs(60));
    m.child = None;
    let m = Mounted::daemon(&img, &mp, &[]);
    assert_eq!(fs::read(m.mp.join("kept")).unwrap(), kept, "fsynced before the panic");
    m.umount();
    fsck_clean(&img);
}
