//! Repeated real-process crashes: a writer process works on a lanefs mount (creates, appends,
//! overwrites, direct I/O, truncates, chmod, renames, unlinks, mkdir, rmdir, fsync and fdatasync
//! of files, fsync of directories), the `lanefs mount --foreground` daemon is SIGKILLed at a random
//! moment, the writer stops on ENOTCONN, the dead mount is detached (fusermount3 -u -z on its
//! path), `lanefs fsck` must find the image clean, and a new mount must hold everything the
//! durability contract (ARCHITECTURE.md) promised. The next round continues on the same image, so the
//! state accumulates across crashes (and the cleaner gets to run).
//!
//! The writer (this test binary re-executed, see `sigkill_writer`) runs two threads, each in a
//! subtree of its own and with names of its own in one shared directory, and logs every operation
//! to a file outside the mount before it makes it; after an fsync returns it logs that too and
//! fsyncs the log. From the logs the test knows what may be there after the crash:
//!
//! - a file's content: after fsync or fdatasync returns, its data and size are durable. Every byte
//!   must be the fsynced byte or a byte written there since (never anything else), and the size
//!   lies between the smallest and largest size it had since. After fsync, its mode and mtime
//!   too (the mtime exactly, while nothing has written to the file since);
//! - a name: after fsync(f) returns, f's name; after fsync(d), every entry of d and both sides of
//!   the renames into or out of d (in the shared directory: the entries of the thread that called
//!   fsync). A name may hold the value it had at its last durable point or any value it held
//!   since; a name the writer never made must not exist;
//! - a file or directory whose name was durable must be found somewhere unless it was unlinked,
//!   removed or renamed over since: a rename never loses a file.
//!
//! What a remount shows becomes the durable base of the next round (mount checkpoints after
//! recovery). The operations and the kill delays come from a seeded generator; the seed and the
//! round are printed on failure (`LANEFS_SIGKILL_SEED` replays the choices; the timing is the
//! machine's), and the image and the writer's logs are kept.
//!
//! `cargo test` runs a quick count of rounds; `LANEFS_SIGKILL_ROUNDS=200` runs the full mode, for
//! example: `LANEFS_SIGKILL_ROUNDS=200 cargo test -p lanefs-cli --test fuse_sigkill -- --nocapture`.
//! `LANEFS_SIGKILL_KEEP=1` keeps the image and the logs of a passing run too. Needs root,
//! /dev/fuse and fusermount3; skipped with a note otherwise. Every mount is undone by its exact
//! path, every process stopped by its PID.

#[path = "../common/mod.rs"]
mod common;
mod model;
mod writer;

use common::*;
use model::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use writer::*;

const WRITER_ENV: &str = "LANEFS_SIGKILL_WRITER";
const SEED_ENV: &str = "LANEFS_SIGKILL_SEED";
const ROUNDS_ENV: &str = "LANEFS_SIGKILL_ROUNDS";
const KEEP_ENV: &str = "LANEFS_SIGKILL_KEEP";
const AVOID_ENV: &str = "LANEFS_SIGKILL_AVOID";
const FAST_CHECKPOINT_ENV: &str = "LANEFS_SIGKILL_FAST_CHECKPOINT_PERCENT";

/// Rounds of the default `cargo test`.
const QUICK_ROUNDS: u64 = 8;
/// Writer threads.
const THREADS: usize = 2;
/// How long the writer works in a round, from its start.
const BUSY_MS: u64 = 2000;
/// Kill delays are drawn from 0..=KILL_MAX_MS after the writer starts: most land while it works,
/// some after it has finished (everything it fsynced must be there all the same).
const KILL_MAX_MS: u64 = BUSY_MS + BUSY_MS / 5;
/// Mounts (in percent) with a checkpoint every second (`-o checkpoint_secs=1`); the others take
/// one only after recovery (the default timer is 30 s). `LANEFS_SIGKILL_FAST_CHECKPOINT_PERCENT`
/// sets another share (100: every mount).
const FAST_CHECKPOINT_PERCENT: u64 = 60;
/// Rounds (in percent) that also kill a mount during recovery.
const RECOVERY_KILL_PERCENT: u64 = 15;
/// Operations per writer thread and round at most (a bound; the time budget ends a round).
const MAX_OPS: u64 = 100_000;
/// Files and directories per subtree at most; the largest file.
const MAX_FILES: usize = 40;
const MAX_DIRS: usize = 12;
const MAX_FILE: u64 = 512 << 10;

/// The directory all writer threads put files in (each only its own names); each thread also
/// has a subtree of its own, `t0`, `t1`, ...
const SHARED: &str = "shared";
/// Modes the writer gives its files (it runs with umask 0).
const MODES: [u32; 5] = [0o600, 0o640, 0o644, 0o664, 0o755];

/// Errors a writer sees once the daemon is gone: the connection is aborted. Over FUSE over
/// io_uring the requests the dead daemon's rings held end with ECANCELED (the kernel cancels
/// the ring commands when the rings close).
const GONE: [i32; 3] = [libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED];

/// Entry point of the writer process: a no-op unless the test started this binary as one.
#[test]
fn sigkill_writer() {
    let Ok(spec) = std::env::var(WRITER_ENV) else { return };
    let v: Vec<&str> = spec.split('\t').collect();
    let (root, logdir) = (Path::new(v[0]), Path::new(v[1]));
    let (seed, round, busy): (u64, u64, u64) =
        (v[2].parse().unwrap(), v[3].parse().unwrap(), v[4].parse().unwrap());
    let deadline = Instant::now() + Duration::from_millis(busy);
    // Modes are exactly what the writer asks for.
    rustix::process::umask(rustix::fs::Mode::empty());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || writer_thread(root, logdir, seed, round, t, deadline));
        }
    });
}

/// The writer process, killed by its PID if the test ends before it does.
struct WriterProc {
    child: Option<Child>,
}

impl WriterProc {
    fn spawn(root: &Path, logdir: &Path, seed: u64, round: u64) -> WriterProc {
        let spec = format!("{}\t{}\t{seed}\t{round}\t{BUSY_MS}", root.display(), logdir.display());
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "sigkill_writer", "--nocapture", "--test-threads", "1"])
            .env(WRITER_ENV, spec)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn writer");
        WriterProc { child: Some(child) }
    }

    fn exited(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_some()
    }

    fn wait(mut self, limit: Duration) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        wait_child(&mut c, limit)
    }
}

impl Drop for WriterProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The test's directory: removed when the test passes, kept when it fails (or with
/// LANEFS_SIGKILL_KEEP). Declared before the mounts, so dropped after them.
struct Keep(Option<tempfile::TempDir>);

impl Drop for Keep {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(t) = self.0.take() {
                eprintln!("sigkill: image and writer logs kept in {}", t.keep().display());
            }
        }
    }
}

/// Prints how to replay a failing round.
struct Ctx {
    seed: u64,
    round: u64,
    rounds: u64,
    dir: PathBuf,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "sigkill test FAILED in round {} of {} with seed {} (image and logs in {}); replay: \
                 {SEED_ENV}={} {ROUNDS_ENV}={} cargo test -p lanefs-cli --test fuse_sigkill -- --nocapture",
                self.round,
                self.rounds,
                self.seed,
                self.dir.display(),
                self.seed,
                self.round + 1
            );
        }
    }
}

/// `lanefs inspect --json`.
fn inspect(img: &Path) -> serde_json::Value {
    let out = run(&[os("inspect"), img.as_os_str(), os("--json")], Duration::from_secs(60));
    assert!(out.status.success(), "inspect: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("inspect --json")
}

fn checkpoint_version(img: &Path) -> u64 {
    inspect(img)["checkpoint"]["version"].as_u64().expect("checkpoint version")
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")))
}

#[derive(Default)]
struct Stats {
    ops: u64,
    bytes_written: u64,
    fsyncs: u64,
    busy_kills: u64,
    idle_kills: u64,
    recovery_kills_down: u64,
    recovery_kills_up: u64,
    /// Checkpoints taken while the writer worked (not those of recovery).
    checkpoints: u64,
    stops: BTreeMap<String, u64>,
    files_checked: u64,
    bytes_checked: u64,
}

fn count(obs: &BTreeMap<String, Obs>, st: &mut Stats) {
    for o in obs.values() {
        match o {
            Obs::Dir(sub) => count(sub, st),
            Obs::File { content, .. } => {
                st.files_checked += 1;
                st.bytes_checked += content.len() as u64;
            }
            Obs::Other(_) => {}
        }
    }
}

#[test]
fn sigkill_at_random_moments_loses_nothing_fsynced() {
    if !fuse_available() {
        return;
    }
    let seed = env_u64(SEED_ENV).unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        mix(t.as_nanos() as u64, std::process::id() as u64) % 1_000_000_000
    });
    let rounds = env_u64(ROUNDS_ENV).unwrap_or(QUICK_ROUNDS);
    let fast_checkpoints = env_u64(FAST_CHECKPOINT_ENV).unwrap_or(FAST_CHECKPOINT_PERCENT);
    assert!(fast_checkpoints <= 100, "{FAST_CHECKPOINT_ENV}={fast_checkpoints}: a percentage");
    eprintln!(
        "sigkill: seed {seed}, {rounds} rounds, {fast_checkpoints}% of mounts with a checkpoint every \
         second ({SEED_ENV}={seed} replays the choices)"
    );
    let mut keep = Keep(Some(tempfile::tempdir().unwrap()));
    let dir = keep.0.as_ref().unwrap().path().to_path_buf();
    if std::env::var_os(KEEP_ENV).is_some() {
        let _kept: PathBuf = keep.0.take().unwrap().keep();
    }
    let img = dir.join("disk.img");
    let mp = dir.join("mnt");
    fs::create_dir(&mp).unwrap();
    mkfs(&img);
    let started = Instant::now();

    let mut m = Mounted::foreground_with(&img, &mp, &["-o", "checkpoint_secs=1"]);
    let root = m.mp.clone();
    fs::create_dir(root.join(SHARED)).unwrap();
    for t in 0..THREADS {
        fs::create_dir(root.join(format!("t{t}"))).unwrap();
    }
    File::open(&root).unwrap().sync_all().unwrap();
    let mut model = Model::baseline(&observe(&root).unwrap());
    let mut st = Stats::default();
    let mut mount_ms = 50;
    let mut up_version = checkpoint_version(&img);

    for round in 0..rounds {
        let _ctx = Ctx { seed, round, rounds, dir: dir.clone() };
        let mut rng = Rng::new(splitmix(mix(seed, round)));
        let delay = rng.below(KILL_MAX_MS + 1);
        let logdir = dir.join(format!("logs/r{round}"));
        fs::create_dir_all(&logdir).unwrap();

        let mut writer = WriterProc::spawn(&root, &logdir, seed, round);
        std::thread::sleep(Duration::from_millis(delay));
        if let Some(s) = m.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("round {round}: the daemon exited on its own before the kill: {s}");
        }
        if writer.exited() {
            st.idle_kills += 1;
        } else {
            st.busy_kills += 1;
        }
        // The dead mount stays attached until the writer has stopped: its next call gets
        // ENOTCONN, not the empty directory below the mount.
        let killed_at = now_us();
        m.sigkill();
        let status = writer.wait(Duration::from_secs(60));
        assert!(status.success(), "round {round}: the writer process failed: {status}");
        m.detach();
        assert!(
            fs::read_dir(&mp).unwrap().next().is_none(),
            "round {round}: something was written below the mount point"
        );

        for t in 0..THREADS {
            let text = fs::read_to_string(logdir.join(format!("t{t}.log"))).unwrap_or_default();
            let mut end = None;
            for line in text.lines() {
                model.apply(t, line);
                match line.as_bytes()[0] {
                    b'E' | b'Z' => end = Some(line.to_string()),
                    b's' | b'd' | b'y' => st.fsyncs += 1,
                    b'S' | b'D' | b'Y' | b'm' => {}
                    b'W' => {
                        st.ops += 1;
                        st.bytes_written += line.split(' ').nth(3).unwrap().parse::<u64>().unwrap();
                    }
                    _ => st.ops += 1,
                }
            }
            let end = end.unwrap_or_else(|| panic!("round {round}: writer thread {t} left no last line"));
            let code: i32 =
                if end.starts_with('Z') { 0 } else { end.split(' ').nth(1).unwrap().parse().unwrap() };
            if code != 0 && !GONE.contains(&code) {
                let lines: Vec<&str> = text.lines().collect();
                let at: i64 = end.split(' ').nth(2).and_then(|t| t.parse().ok()).unwrap_or(0);
                panic!(
                    "round {round}: writer thread {t} stopped on an error that is not the daemon's death, \
                     {:.1} ms {} the kill; its last log lines:\n{}",
                    (at - killed_at as i64).abs() as f64 / 1000.0,
                    if at < killed_at as i64 { "before" } else { "after" },
                    lines[lines.len().saturating_sub(8)..].join("\n")
                );
            }
            let what = if code == 0 { "finished".to_string() } else { format!("errno {code}") };
            *st.stops.entry(what).or_default() += 1;
        }

        st.checkpoints += checkpoint_version(&img).saturating_sub(up_version);
        fsck_clean_when(&img, &format!("round {round}: fsck after the kill"));

        // Now and then a crash during recovery: a mount killed before or just after it is up.
        if rng.chance(RECOVERY_KILL_PERCENT, 100) {
            let delay = rng.below(mount_ms + 1);
            let mut r = Mounted::start_foreground(&img, &mp, &[]);
            std::thread::sleep(Duration::from_millis(delay));
            if is_mounted(&r.mp) {
                st.recovery_kills_up += 1;
            } else {
                st.recovery_kills_down += 1;
            }
            r.sigkill();
            r.detach();
            fsck_clean_when(
                &img,
                &format!("round {round}: fsck after a kill during recovery ({delay} ms after the start)"),
            );
        }
        // First a read-only mount: recovery replays into memory only, so that the image stays the
        // crash image if the check fails (kept for a replay).
        let t = Instant::now();
        let ro = Mounted::foreground_with(&img, &mp, &["-o", "ro"]);
        mount_ms = t.elapsed().as_millis() as u64;
        let obs =
            observe(&ro.mp).unwrap_or_else(|e| panic!("round {round}: walking the recovered tree: {e}"));
        let problems = model.check(&obs);
        assert!(
            problems.is_empty(),
            "round {round} (seed {seed}, kill after {delay} ms): {} problems after recovery (read-only mount; \
             {} is still the crash image):\n{}",
            problems.len(),
            img.display(),
            problems.iter().take(30).cloned().collect::<Vec<_>>().join("\n")
        );
        ro.terminate();

        // Then recovery for real (it checkpoints), a clean unmount, and fsck of what it wrote.
        m = Mounted::foreground(&img, &mp);
        m.terminate();
        fsck_clean_when(&img, &format!("round {round}: fsck after recovery and a clean unmount"));

        // The mount the next round's writer works on. Most take a checkpoint every second, so
        // that kills land in checkpoints too. It must show what the read-only mount showed.
        let opts: &[&str] =
            if rng.chance(fast_checkpoints, 100) { &["-o", "checkpoint_secs=1"] } else { &[] };
        m = Mounted::foreground_with(&img, &mp, opts);
        up_version = checkpoint_version(&img);
        let rw = observe(&m.mp).unwrap_or_else(|e| panic!("round {round}: walking the remounted tree: {e}"));
        if let Some(diff) = first_difference("", &obs, &rw) {
            panic!("round {round}: the read-write mount differs from the read-only one: {diff}");
        }
        count(&obs, &mut st);
        model = Model::baseline(&obs);
        if rounds > QUICK_ROUNDS && (round + 1) % 50 == 0 {
            eprintln!("sigkill: {} of {rounds} rounds, {:.0} s", round + 1, started.elapsed().as_secs_f64());
        }
    }
    m.terminate();
    fsck_clean(&img);
    let end = inspect(&img);
    eprintln!(
        "sigkill: seed {seed}: {rounds} rounds, {} kills ({} while the writer worked, {} after it \
         finished) and {} more during recovery ({} once the mount was up); {} operations, {} MiB \
         written, {} fsyncs returned, writer stops {:?}; {} checkpoints while it worked; \
         {} files / {} MiB checked after remounts; {:.1} s. Image at the end: {} MiB valid, segments {}",
        st.busy_kills + st.idle_kills,
        st.busy_kills,
        st.idle_kills,
        st.recovery_kills_down + st.recovery_kills_up,
        st.recovery_kills_up,
        st.ops,
        st.bytes_written >> 20,
        st.fsyncs,
        st.stops,
        st.checkpoints,
        st.files_checked,
        st.bytes_checked >> 20,
        started.elapsed().as_secs_f64(),
        (end["segments"]["valid_blocks"].as_u64().unwrap_or(0) * 4096) >> 20,
        end["segments"],
    );
}

/// The model alone (no mount): the states it accepts after a crash, and those it refuses.
#[test]
fn model_accepts_old_or_new_states_and_refuses_the_rest() {
    let base = BTreeMap::from([("t0".to_string(), Obs::Dir(BTreeMap::new()))]);
    let mut m = Model::baseline(&base);
    let (a, b, c) = ("f0x0n1", "f0x0n2", "f0x0n3");
    for line in [
        "C t0/f0x0n1",
        "W t0/f0x0n1 0 10000 7",
        "S t0/f0x0n1",
        "s t0/f0x0n1",
        "m t0/f0x0n1 100 5",
        "M t0/d0x0n4",
        "Y t0",
        "y t0",
        "W t0/f0x0n1 5000 10000 8",
        "R t0/f0x0n1 t0/f0x0n2",
        "P t0/f0x0n2 384",
        "C t0/f0x0n3",
        "W t0/f0x0n3 0 100 9",
        "T t0/f0x0n3 50",
        "E 103 Software caused connection abort",
    ] {
        m.apply(0, line);
    }
    let fsynced = pattern(7, 0, 10_000);
    let mut last = fsynced.clone();
    last.resize(15_000, 0);
    last[5000..].copy_from_slice(&pattern(8, 5000, 10_000));
    let mut half = last.clone();
    half[9000..].copy_from_slice(&fsynced[9000..10_000].iter().copied().chain([0; 5000]).collect::<Vec<_>>());
    let c_all = pattern(9, 0, 100);
    let t = (100, 5);
    // (name, content, mode, mtime) of the files found in t0.
    type Found<'a> = Vec<(&'a str, Vec<u8>, u32, (i64, u32))>;
    let problems = |entries: Found, dir: bool| {
        let mut t0: BTreeMap<String, Obs> = entries
            .into_iter()
            .enumerate()
            .map(|(i, (n, content, mode, mtime))| {
                (n.to_string(), Obs::File { ino: i as u64 + 10, nlink: 1, mode, mtime, content })
            })
            .collect();
        if dir {
            t0.insert("d0x0n4".to_string(), Obs::Dir(BTreeMap::new()));
        }
        m.check(&BTreeMap::from([("t0".to_string(), Obs::Dir(t0))]))
    };
    let none = Vec::<String>::new();
    // Accepted: the fsynced state under the old name, the last state under the new one, part of
    // the last write, the unsynced file in any of its states or not at all.
    assert_eq!(problems(vec![(a, fsynced.clone(), 0o644, t)], true), none);
    assert_eq!(
        problems(vec![(b, last.clone(), 0o600, (101, 0)), (c, c_all[..50].to_vec(), 0o644, (1, 1))], true),
        none
    );
    assert_eq!(problems(vec![(b, half.clone(), 0o644, t), (c, c_all.clone(), 0o644, t)], true), none);
    assert_eq!(problems(vec![(a, last.clone(), 0o600, t), (c, Vec::new(), 0o644, t)], true), none);
    // Refused: the file lost (its name was durable, the rename moves it), the new directory lost
    // (fsync of its parent), a byte of the fsynced range changed, a shorter file, a mode never
    // given, an mtime before the fsynced one, a name never made, a file longer than it ever was.
    assert_eq!(problems(vec![], true).len(), 1);
    assert_eq!(problems(vec![(a, fsynced.clone(), 0o644, t)], false).len(), 2, "name and directory lost");
    let mut bad = fsynced.clone();
    bad[1234] ^= 0x55;
    assert_eq!(
        problems(vec![(a, bad, 0o644, t)], true).len(),
        2,
        "a bad byte: no file fits, the file is nowhere"
    );
    assert!(!problems(vec![(a, fsynced[..9999].to_vec(), 0o644, t)], true).is_empty());
    assert!(!problems(vec![(a, fsynced.clone(), 0o755, t)], true).is_empty());
    assert!(!problems(vec![(a, fsynced.clone(), 0o644, (100, 4))], true).is_empty());
    let both = problems(vec![(a, fsynced.clone(), 0o644, t), (b, last.clone(), 0o644, t)], true);
    assert!(both.is_empty(), "two inodes with the old and the new state are each possible: {both:?}");
    assert_eq!(
        problems(vec![(a, fsynced.clone(), 0o644, t), ("f9x0n9", Vec::new(), 0o644, t)], true).len(),
        1
    );
    assert_eq!(
        problems(vec![(a, fsynced.clone(), 0o644, t), (c, pattern(9, 0, 101), 0o644, t)], true).len(),
        1
    );

    // An exact mtime: fsynced and not written since.
    let mut m = Model::baseline(&base);
    for line in ["C t0/f0x0n1", "W t0/f0x0n1 0 10 7", "S t0/f0x0n1", "s t0/f0x0n1", "m t0/f0x0n1 100 5"] {
        m.apply(0, line);
    }
    let one = |mtime| {
        let f = Obs::File { ino: 1, nlink: 1, mode: 0o644, mtime, content: pattern(7, 0, 10) };
        m.check(&BTreeMap::from([("t0".to_string(), Obs::Dir(BTreeMap::from([(a.to_string(), f)])))]))
    };
    assert_eq!(one(t), none);
    assert_eq!(one((100, 6)).len(), 2);
}
