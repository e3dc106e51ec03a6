//! The `lanefs` binary end to end: mkfs, fsck exit codes, checkpoint fallback, inspect.
//!
//! With `LANEFS_TEST_NVM=1` (read only here) the images whose checkpoints these tests check are
//! first mounted through the library with a persistent-memory region (`IMAGE.nvm`, next to the
//! image in the test's temporary directory), so that their NAT and lane journals live in it, and
//! fsck and inspect get `--nvm REGION`.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Output};

fn lanefs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lanefs")).args(args).output().expect("run lanefs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn nvm_mode() -> bool {
    matches!(std::env::var("LANEFS_TEST_NVM").as_deref(), Ok("1" | "true" | "yes"))
}

/// nvm mode: mounts `img` through the library with a new region `IMAGE.nvm`, fsyncs a file into
/// the region's journal and unmounts, so the image's checkpoints keep their NAT in the region from
/// now on. Returns the region (none outside nvm mode).
fn put_in_region(img: &Path) -> Option<String> {
    if !nvm_mode() {
        return None;
    }
    use lanefs::device::{BlockDevice, DeviceOptions, FileDevice};
    let region = format!("{}.nvm", img.display());
    let dev = std::sync::Arc::new(FileDevice::open(img, DeviceOptions::default()).unwrap());
    let fs = lanefs::Fs::open(
        dev as std::sync::Arc<dyn BlockDevice>,
        lanefs::FsOptions { nvm: Some(region.clone().into()), ..Default::default() },
    )
    .unwrap();
    let f = fs.create(lanefs::ROOT, b"in-region", 0o644, 0, 0).unwrap();
    fs.write_at(f.ino, 0, b"journaled in the region").unwrap();
    fs.fsync(f.ino, false).unwrap();
    assert!(fs.io_stats().nvm_journal_bytes > 0, "the fsync went to the region");
    fs.unmount().unwrap();
    Some(region)
}

/// `ARGS` followed by `--nvm REGION` when there is a region.
fn with_nvm<'a>(args: &[&'a str], region: &'a Option<String>) -> Vec<&'a str> {
    let mut v = args.to_vec();
    if let Some(r) = region {
        v.extend(["--nvm", r.as_str()]);
    }
    v
}

fn inspect_json(img: &str) -> serde_json::Value {
    inspect_json_nvm(img, &None)
}

fn inspect_json_nvm(img: &str, region: &Option<String>) -> serde_json::Value {
    let o = lanefs(&with_nvm(&["inspect", img, "--json"], region));
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("inspect --json prints JSON");
    if region.is_some() {
        assert_eq!(v["nat_in_region"], true, "nvm mode: the NAT is in the region");
        assert!(v["region"]["nat"].as_str().unwrap_or("").starts_with("NAT of checkpoint"), "{v}");
    }
    v
}

fn flip_byte(path: &Path, offset: u64) {
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0xFF;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
}

#[test]
fn mkfs_fsck_and_checkpoint_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("x.img");
    let s = img.to_str().unwrap();
    let o = lanefs(&["mkfs", s, "--size", "1G"]);
    assert!(o.status.success(), "{}", text(&o));
    let region = put_in_region(&img);
    let o = lanefs(&with_nvm(&["fsck", s], &region));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("clean"));
    if region.is_some() {
        assert!(text(&o).contains("note: region "), "{}", text(&o));
        // An image whose NAT is in a region cannot be checked without it.
        let o = lanefs(&["fsck", s]);
        assert_eq!(o.status.code(), Some(8), "{}", text(&o));
        assert!(text(&o).contains("--nvm"), "{}", text(&o));
    }

    // One byte in the active checkpoint pack: mount-time selection takes the other pack.
    let v = inspect_json_nvm(s, &region);
    let g = &v["geometry"];
    let pack = v["checkpoint"]["pack"].as_u64().unwrap();
    let version = v["checkpoint"]["version"].as_u64().unwrap();
    let pack_addr = |p: u64| g["cp_blkaddr"].as_u64().unwrap() + p * g["cp_pack_blocks"].as_u64().unwrap();
    flip_byte(&img, pack_addr(pack) * 4096 + 4096 + 77);
    let v2 = inspect_json(s);
    assert_eq!(v2["checkpoint"]["pack"].as_u64().unwrap(), 1 - pack);
    assert!(v2["checkpoint"]["version"].as_u64().unwrap() < version);
    let o = lanefs(&with_nvm(&["fsck", s], &region));
    assert!(text(&o).contains("not usable"), "{}", text(&o));
    match &region {
        None => assert_eq!(o.status.code(), Some(0), "{}", text(&o)),
        // nvm mode: the lost checkpoint changed NAT entries, which its region already holds in
        // place: the region cannot give the older checkpoint's NAT, and says so.
        Some(r) => {
            assert_eq!(o.status.code(), Some(4), "{}", text(&o));
            assert!(text(&o).contains(r.as_str()) && text(&o).contains("unreadable"), "{}", text(&o));
        }
    }

    // Both packs broken: fsck exits 4 and names the structure.
    flip_byte(&img, pack_addr(1 - pack) * 4096 + 12);
    let o = lanefs(&with_nvm(&["fsck", s], &region));
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("checkpoint pack"), "{}", text(&o));
    assert!(lanefs(&["inspect", s]).status.code() != Some(0));
}

#[test]
fn mkfs_refuses_what_it_should() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("y.img");
    let s = img.to_str().unwrap();
    let o = lanefs(&["mkfs", s, "--size", "1M"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("minimum"), "{}", text(&o));
    let o = lanefs(&["mkfs", s]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--size"), "{}", text(&o));
    assert!(lanefs(&["mkfs", s, "--size", "128M", "--lanes", "2"]).status.success());
    let o = lanefs(&["mkfs", s, "--size", "128M"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("holds lanefs") && text(&o).contains("--force"), "{}", text(&o));
    // A label holds 31 bytes: more are refused, not cut (the image keeps what it had).
    let long = "l".repeat(32);
    let o = lanefs(&["mkfs", s, "--size", "256M", "--force", "--lanes", "1", "--label", &long]);
    assert!(!o.status.success());
    assert!(text(&o).contains("at most 31"), "{}", text(&o));
    let o = lanefs(&["mkfs", s, "--size", "256M", "--force", "--lanes", "1", "--label", "data"]);
    assert!(o.status.success(), "{}", text(&o));
    let v = inspect_json(s);
    assert_eq!(v["geometry"]["lanes"], 1);
    assert_eq!(v["label"], "data");
    assert_eq!(v["geometry"]["total_blocks"].as_u64().unwrap(), 256 * 256);
    assert_eq!(v["segments"]["active"], 6);
    assert_eq!(v["segments"]["valid_blocks"], 1);
    assert!(v["io_mode"].as_str().is_some());
    let o = lanefs(&["inspect", s]);
    assert!(o.status.success());
    assert!(text(&o).contains("lane 0"), "{}", text(&o));
}

#[test]
fn fsck_operational_errors_exit_8() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![0xA5u8; 1 << 20]).unwrap();
    let o = lanefs(&["fsck", junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(8), "{}", text(&o));
    assert!(text(&o).contains("not a lanefs image"), "{}", text(&o));
    let o = lanefs(&["fsck", dir.path().join("missing").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(8));
    // One line, no panic.
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1, "{}", text(&o));
}

#[test]
fn inspect_into_a_closed_pipe_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("i.img");
    let img = img.to_str().unwrap();
    assert!(lanefs(&["mkfs", img, "--size", "64M"]).status.success());
    for json in [true, false] {
        let mut args = vec!["inspect", img];
        if json {
            args.push("--json");
        }
        // The reading end is closed before the child writes (it has not even started): its
        // write fails with EPIPE, as under `lanefs inspect | head -1` with a long output.
        let mut child = Command::new(env!("CARGO_BIN_EXE_lanefs"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && err.is_empty(), "json {json}: {:?} {err}", o.status);
    }
}
