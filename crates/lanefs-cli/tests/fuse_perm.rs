//! Permissions through a real mount, checked from other users' processes (`setpriv` with a
//! numeric uid, so no account is needed): a write, direct write, truncate, fallocate or punch by
//! a user without CAP_FSETID drops set-ID bits (FUSE_HANDLE_KILLPRIV_V2), and the kernel does not
//! exec the file with its stale mode; default ACLs are inherited without the umask and
//! `getfacl` shows what ext4 shows; chmod rewrites the ACL mask and the kernel enforces the
//! result; an ACL set by someone outside the file's group drops set-group-ID. Needs root,
//! /dev/fuse, fusermount3 and the acl and util-linux tools; fails rather than skips where FUSE
//! tests must run (see `fuse_available`).

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// A user and groups no account has (setpriv takes numbers).
const USER: u32 = 4242;
const OTHER_GROUP: u32 = 4243;

fn sh(cwd: &Path, script: &str) -> Output {
    let out = Command::new("sh").arg("-c").arg(script).current_dir(cwd).stdin(Stdio::null()).output();
    out.unwrap_or_else(|e| panic!("sh -c {script:?}: {e}"))
}

/// Runs `script` as uid `uid`, gid `gid` and supplementary `groups`, without capabilities.
fn sh_as(cwd: &Path, uid: u32, gid: u32, groups: &[u32], script: &str) -> Output {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}")).arg(format!("--regid={gid}"));
    if groups.is_empty() {
        c.arg("--clear-groups");
    } else {
        let g: Vec<String> = groups.iter().map(u32::to_string).collect();
        c.arg(format!("--groups={}", g.join(",")));
    }
    let out = c.args(["sh", "-c", script]).current_dir(cwd).stdin(Stdio::null()).output();
    out.unwrap_or_else(|e| panic!("setpriv sh -c {script:?}: {e}"))
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o7777
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

/// A scratch image whose mount point other users can reach, mounted with `opts`.
fn mounted(opts: &str) -> (tempfile::TempDir, std::path::PathBuf, Mounted) {
    let (dir, img, mp) = scratch_image();
    chmod(dir.path(), 0o755);
    let m = Mounted::daemon(&img, &mp, &["-o", opts]);
    chmod(&m.mp, 0o777);
    (dir, img, m)
}

#[test]
fn changes_by_another_user_drop_set_id_bits() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, m) = mounted("allow_other,suid");
    let mp = m.mp.clone();
    let s = mp.join("s");
    ok(sh(&mp, "printf 0123456789 > s"), "create");
    let as_user = |what: &str, script: &str| ok(sh_as(&mp, USER, USER, &[], script), what);
    let cases = [
        ("buffered append", "printf x >> s"),
        ("direct write", "dd if=/dev/zero of=s bs=4096 count=1 oflag=direct conv=notrunc status=none"),
        ("truncate", "truncate -s 100 s"),
        ("fallocate", "fallocate -l 65536 s"),
        ("punch", "fallocate -p -o 0 -l 4096 s"),
    ];
    for (what, script) in cases {
        for before in [0o6666, 0o6676, 0o2676] {
            chmod(&s, before);
            as_user(what, script);
            assert_eq!(mode(&s), before & 0o777, "{what} by uid {USER} of a {before:o} file");
        }
        // Root (CAP_FSETID) keeps them.
        chmod(&s, 0o6666);
        ok(sh(&mp, script), what);
        assert_eq!(mode(&s), 0o6666, "{what} by root");
    }
    // Root without CAP_FSETID drops them on a truncate (the kernel says so in the SETATTR)
    // and on a write, as ext4 does: set-user-ID always, set-group-ID where the group may
    // execute (root is in the file's group 0, which keeps it otherwise).
    for (what, script) in [("truncate", "truncate -s 50 s"), ("buffered append", "printf x >> s")] {
        for (before, after) in [(0o6666, 0o2666), (0o6676, 0o676)] {
            chmod(&s, before);
            let out = Command::new("capsh")
                .args(["--drop=cap_fsetid", "--", "-c", script])
                .current_dir(&mp)
                .output()
                .expect("capsh");
            assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(mode(&s), after, "{what} of a {before:o} file by root without CAP_FSETID");
        }
    }
    // A member of the file's group (a supplementary group, read from /proc) keeps
    // set-group-ID on a file it cannot execute as group.
    chmod(&s, 0o6666);
    ok(sh_as(&mp, USER, USER, &[0], "printf x >> s"), "append by a group member");
    assert_eq!(mode(&s), 0o2666);
    // chown drops set-user-ID even for root.
    chmod(&s, 0o6755);
    std::os::unix::fs::chown(&s, Some(USER), None).unwrap();
    assert_eq!(mode(&s), 0o755);

    // The kernel must not go on using the mode it cached: a set-user-ID-root copy of id(1),
    // written to by the user and run at once, runs as the user.
    fs::copy("/usr/bin/id", mp.join("idx")).unwrap();
    chmod(&mp.join("idx"), 0o4777);
    assert_eq!(as_user("exec", "./idx -u").trim(), "0", "a set-user-ID root file runs as root");
    let after = as_user("write and exec", "printf x >> idx && ./idx -u");
    assert_eq!(after.trim(), USER.to_string(), "exec right after the write saw the old mode");
    assert_eq!(mode(&mp.join("idx")), 0o777);
    m.umount();
    fsck_clean(&img);
}

#[test]
fn default_acls_are_inherited_and_getfacl_shows_what_ext4_shows() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, m) = mounted("allow_other");
    let mp = m.mp.clone();
    ok(sh(&mp, "umask 022 && mkdir d && setfacl -d -m u:4242:rwx d"), "setfacl -d");
    ok(sh(&mp, "umask 077 && touch d/f && mkdir d/sub && touch plain"), "create");
    let getfacl = ok(sh(&mp, "getfacl -n d d/f d/sub"), "getfacl");
    let want = "\
# file: d
# owner: 0
# group: 0
user::rwx
group::r-x
other::r-x
default:user::rwx
default:user:4242:rwx
default:group::r-x
default:mask::rwx
default:other::r-x

# file: d/f
# owner: 0
# group: 0
user::rw-
user:4242:rwx\t#effective:rw-
group::r-x\t#effective:r--
mask::rw-
other::r--

# file: d/sub
# owner: 0
# group: 0
user::rwx
user:4242:rwx
group::r-x
mask::rwx
other::r-x
default:user::rwx
default:user:4242:rwx
default:group::r-x
default:mask::rwx
default:other::r-x

";
    assert_eq!(getfacl, want);
    // The default ACL replaces the umask (077 here); without one the umask applies.
    assert_eq!(mode(&mp.join("d/f")), 0o664);
    assert_eq!(mode(&mp.join("d/sub")), 0o775);
    assert_eq!(mode(&mp.join("plain")), 0o600);
    // The named user's entry is enforced by the kernel: it may create in the new directory.
    ok(sh_as(&mp, USER, USER, &[], "touch d/sub/mine"), "create as the named user");
    ok(sh_as(&mp, USER + 1, USER + 1, &[], "test ! -w d/sub"), "another user may not write");
    // Across a remount.
    m.umount();
    let m = Mounted::daemon(&img, &mp, &["-o", "allow_other"]);
    assert_eq!(ok(sh(&m.mp, "getfacl -n d d/f d/sub"), "getfacl after remount"), want);
    m.umount();
    fsck_clean(&img);
}

#[test]
fn chmod_rewrites_the_acl_mask_and_the_kernel_enforces_it() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, m) = mounted("allow_other");
    let mp = m.mp.clone();
    ok(sh(&mp, "umask 022 && touch f && setfacl -m u:4242:rw f"), "setfacl");
    assert_eq!(mode(&mp.join("f")), 0o664, "the group bits show the mask");
    ok(sh_as(&mp, USER, USER, &[], "echo one >> f"), "write allowed by the ACL");
    chmod(&mp.join("f"), 0o644);
    let acl = ok(sh(&mp, "getfacl -n -c f"), "getfacl");
    assert_eq!(acl, "user::rw-\nuser:4242:rw-\t#effective:r--\ngroup::r--\nmask::r--\nother::r--\n\n");
    let denied = sh_as(&mp, USER, USER, &[], "echo two >> f");
    assert!(!denied.status.success(), "the mask (r--) must deny the write");
    assert!(String::from_utf8_lossy(&denied.stderr).contains("Permission denied"));
    ok(sh_as(&mp, USER, USER, &[], "cat f >/dev/null"), "read allowed");
    chmod(&mp.join("f"), 0o664);
    ok(sh_as(&mp, USER, USER, &[], "echo three >> f"), "write allowed again");
    assert_eq!(fs::read_to_string(mp.join("f")).unwrap(), "one\nthree\n");
    // setfacl sets the mode; an ACL the mode says all of is not stored.
    ok(sh(&mp, "setfacl -b f && setfacl -m u::rwx,g::r-x,o::--x f"), "minimal ACL");
    assert_eq!(mode(&mp.join("f")), 0o751);
    let mut names = [0u8; 256];
    assert_eq!(rustix::fs::listxattr(mp.join("f"), &mut names).unwrap(), 0, "no xattr stored");
    m.umount();
    fsck_clean(&img);
}

#[test]
fn an_acl_set_outside_the_files_group_drops_set_group_id() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, m) = mounted("allow_other");
    let mp = m.mp.clone();
    for (name, mkdir) in [("file", false), ("dir", true)] {
        let p = mp.join(name);
        if mkdir {
            fs::create_dir(&p).unwrap();
        } else {
            fs::write(&p, b"").unwrap();
        }
        std::os::unix::fs::chown(&p, Some(USER), Some(USER)).unwrap();
        let set = format!("setfacl -m u::rwx,g::rwx,o::rwx {name}");
        chmod(&p, 0o2755);
        ok(sh_as(&mp, USER, USER, &[], &set), "setfacl in the group");
        assert_eq!(mode(&p), 0o2777, "{name}: kept by a member of the group");
        chmod(&p, 0o2755);
        ok(sh_as(&mp, USER, OTHER_GROUP, &[], &set), "setfacl outside the group");
        assert_eq!(mode(&p), 0o777, "{name}: dropped for a caller outside the group");
    }
    m.umount();
    fsck_clean(&img);
}

/// With allow_other and default_permissions the mount allows idmapping, and the kernel then
/// sends no uid (FUSE_INVALID_UIDGID) with requests that create nothing: the privileged
/// ioctls go by the caller's capabilities, so root may set the immutable flag and trim, and a
/// user without capabilities may not (fstests found these refused to root once).
#[test]
fn privileged_ioctls_go_by_capabilities_where_the_kernel_sends_no_uid() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, m) = mounted("allow_other");
    let mp = m.mp.clone();
    ok(sh(&mp, &format!("touch f g && chmod 666 g && chown {USER} g")), "create");
    ok(sh(&mp, "chattr +i f && lsattr f | grep -q '^....i'"), "root sets the immutable flag");
    ok(sh(&mp, "fstrim ."), "root trims");
    for (what, script) in [("chattr +a on its own file", "chattr +a g"), ("fstrim", "fstrim .")] {
        let out = sh_as(&mp, USER, USER, &[], script);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("Operation not permitted"), "{what} by a user: {err}");
    }
    assert_eq!(fs::write(mp.join("f"), b"x").unwrap_err().raw_os_error(), Some(libc::EPERM));
    ok(sh(&mp, "chattr -i f && rm f"), "root clears the immutable flag");
    m.umount();
    fsck_clean(&img);
}
