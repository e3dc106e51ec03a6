//! `mount:` targets: a short run of a few workloads through a real lanefs FUSE mount, which must
//! count operations (DWOM with O_DIRECT, not buffered) and leave no mount, mount point or daemon
//! behind, whether the target is closed or only dropped.
//!
//! Needs root, /dev/fuse, fusermount3 and the `lanefs` executable (`$LANEFS_BIN`, else the one
//! cargo built next to this test, as `cargo test --workspace` does); skipped with a note without
//! them.

use lanefs_bench::target::mount::{is_lanefs_mount, unavailable, MountTarget, BIN_ENV};
use lanefs_bench::target::Target;
use lanefs_bench::{run_one, RunConfig, Workload};
use std::path::{Path, PathBuf};

/// The lanefs executable, or None (with the reason printed) when this test cannot mount.
fn lanefs_bin() -> Option<PathBuf> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mount: targets are tested as root");
        return None;
    }
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return None;
    }
    if let Some(p) = std::env::var_os(BIN_ENV) {
        return Some(PathBuf::from(p));
    }
    // target/<profile>/deps/mount-HASH -> target/<profile>/lanefs
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("lanefs");
    if bin.is_file() {
        Some(bin)
    } else {
        eprintln!("skipped: no lanefs executable at {} (build it, or set {BIN_ENV})", bin.display());
        None
    }
}

fn gone(mp: &Path) -> bool {
    !is_lanefs_mount(mp) && !mp.exists()
}

#[test]
fn workloads_run_through_a_mount_and_it_goes_away() {
    let Some(bin) = lanefs_bin() else { return };
    let dir = tempfile::tempdir().unwrap();

    // Not a lanefs image: `lanefs mount` refuses it, its reason comes back in one line, and the
    // mount point is gone again. (One test, so that no other mount comes and goes meanwhile.)
    let junk = dir.path().join("junk.img");
    std::fs::write(&junk, vec![0x5Au8; 1 << 20]).unwrap();
    let e = MountTarget::open_with(&junk, &bin).err().expect("a junk image must not mount");
    assert!(e.starts_with(&format!("mount:{}: lanefs mount failed: ", junk.display())), "{e}");
    assert!(!e.contains('\n'), "{e}");
    assert!(mount_dirs().is_empty(), "left {:?}", mount_dirs());

    let img = dir.path().join("m.img");
    // A missing image is created with the default geometry.
    let t = MountTarget::open_with(&img, &bin).unwrap_or_else(|e| panic!("{e}"));
    assert!(img.is_file());
    let mp = t.mount_point().unwrap();
    assert!(is_lanefs_mount(&mp), "{} is not a lanefs mount", mp.display());
    // The type names the FUSE transport the daemon serves with (the default: io_uring where
    // the kernel offers it, which the suite's run as root turns on).
    let transport = t.fs_type();
    assert!(transport.starts_with("fuse.lanefs (") && transport.ends_with(')'), "{transport}");
    if std::env::var("LANEFS_TEST_TRANSPORT").as_deref() == Ok("uring") {
        assert_eq!(transport, "fuse.lanefs (io_uring)");
    }
    assert_eq!(t.spec(), format!("mount:{}", img.display()));

    let cfg = RunConfig { seconds: 0.5, warmup: 0.1, scale: 0.05 };
    for w in [Workload::Mwcm, Workload::Dwsl, Workload::Dwom] {
        let r = run_one(&t, "lanefs-mount", w, 1, &cfg).unwrap_or_else(|e| panic!("{w}: {e}"));
        assert!(r.ops > 0, "{w}: no op counted");
        assert_eq!(r.fs_type, transport);
        assert!(r.notes.is_empty(), "{w}: {:?}", r.notes);
        if w.has_fsync() {
            assert!(r.fsync.as_ref().is_some_and(|f| f.count() > 0), "{w}: no fsync recorded");
        }
    }
    assert!(t.readdir(Path::new("")).unwrap().is_empty(), "runs clean up after themselves");

    t.close().unwrap();
    assert!(gone(&mp), "{} still there after close", mp.display());
    t.close().unwrap(); // idempotent
    drop(t);

    // An existing image mounts again; dropping without close unmounts as well.
    let t = MountTarget::open_with(&img, &bin).unwrap_or_else(|e| panic!("remount: {e}"));
    let mp = t.mount_point().unwrap();
    t.mkdir(Path::new("kept")).unwrap();
    drop(t);
    assert!(gone(&mp), "{} still there after drop", mp.display());

    // lanefs umount waited for the final checkpoint: the image holds the directory.
    let t = MountTarget::open_with(&img, &bin).unwrap();
    assert!(t.stat(Path::new("kept")).unwrap().is_dir);
    t.rmdir(Path::new("kept")).unwrap();
    t.close().unwrap();
    assert!(mount_dirs().is_empty(), "left {:?}", mount_dirs());
}

/// This process's `lanefs-bench-mnt-PID-*` directories in the temporary directory.
fn mount_dirs() -> Vec<PathBuf> {
    let prefix = format!("lanefs-bench-mnt-{}-", std::process::id());
    let mut v: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}
