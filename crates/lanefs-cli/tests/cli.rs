//! The `lanefs` binary end to end: mkfs, fsck exit codes, checkpoint fallback, inspect.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Output};

fn lanefs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lanefs")).args(args).output().expect("run lanefs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn inspect_json(img: &str) -> serde_json::Value {
    let o = lanefs(&["inspect", img, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).expect("inspect --json prints JSON")
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
    let o = lanefs(&["fsck", s]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("clean"));

    // One byte in the active checkpoint pack: mount-time selection takes the other pack.
    let v = inspect_json(s);
    let g = &v["geometry"];
    let pack = v["checkpoint"]["pack"].as_u64().unwrap();
    let version = v["checkpoint"]["version"].as_u64().unwrap();
    let pack_addr = |p: u64| g["cp_blkaddr"].as_u64().unwrap() + p * g["cp_pack_blocks"].as_u64().unwrap();
    flip_byte(&img, pack_addr(pack) * 4096 + 4096 + 77);
    let v2 = inspect_json(s);
    assert_eq!(v2["checkpoint"]["pack"].as_u64().unwrap(), 1 - pack);
    assert!(v2["checkpoint"]["version"].as_u64().unwrap() < version);
    let o = lanefs(&["fsck", s]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("not usable"), "{}", text(&o));

    // Both packs broken: fsck exits 4 and names the structure.
    flip_byte(&img, pack_addr(1 - pack) * 4096 + 12);
    let o = lanefs(&["fsck", s]);
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
