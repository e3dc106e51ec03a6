//! POSIX ACLs and set-ID bits through the library: default ACLs inherited by new inodes (and
//! kept by a crash after an fsync of their directory), the mode and the access ACL kept in
//! step, malformed ACLs refused, and the privileges a write, truncate, fallocate, chown or ACL
//! change by an unprivileged caller takes away.

use lanefs::device::MemDevice;
use lanefs::testing::acl::{self, Acl, Entry, Tag};
use lanefs::FallocMode;
use lanefs::XattrFlags;
use lanefs::{fsck, FsckOptions};
use lanefs::{Caller, Fs, FsOptions, Ino, MkfsOptions, New, SetAttr, ROOT};
use std::cell::Cell;
use std::sync::Arc;

fn fresh() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(64 << 20));
    Fs::format(&*dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
    dev
}

fn open(dev: &Arc<MemDevice>) -> Fs {
    Fs::open(dev.clone(), FsOptions { checkpoint_interval: None, ..Default::default() }).unwrap()
}

fn fsck_clean(dev: &MemDevice) {
    let r = fsck(dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "fsck: {:#?}", r.problems);
}

const U: u32 = u32::MAX;

fn e(tag: Tag, perm: u16, id: u32) -> Entry {
    Entry { tag, perm, id }
}

/// u::rwx, u:1001:rwx, g::r-x, m::rwx, o::r-x (what `setfacl -d -m u:1001:rwx` leaves on a
/// 0755 directory).
fn named_default() -> Acl {
    Acl::new(vec![
        e(Tag::UserObj, 7, U),
        e(Tag::User, 7, 1001),
        e(Tag::GroupObj, 5, U),
        e(Tag::Mask, 7, U),
        e(Tag::Other, 5, U),
    ])
    .unwrap()
}

fn acl_of(fs: &Fs, ino: Ino, name: &[u8]) -> Option<Acl> {
    match fs.getxattr(ino, name) {
        Ok(v) => Some(Acl::decode(&v).unwrap().expect("a stored ACL has entries")),
        Err(e) if e.to_errno() == libc::ENODATA => None,
        Err(e) => panic!("getxattr: {e}"),
    }
}

fn perms(a: &Acl) -> Vec<(Tag, u16)> {
    a.entries().iter().map(|e| (e.tag, e.perm)).collect()
}

#[test]
fn default_acls_are_inherited_without_the_umask_and_survive_a_crash() {
    let dev = fresh();
    let fs = open(&dev);
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap();
    fs.setxattr(d.ino, acl::DEFAULT, &named_default().encode(), XattrFlags::empty()).unwrap();
    // A default ACL does not change the directory's own mode or access ACL.
    assert_eq!(fs.getattr(d.ino).unwrap().mode, 0o040755);
    assert_eq!(acl_of(&fs, d.ino, acl::ACCESS), None);

    let f = fs.make(d.ino, b"f", &New { mode: 0o100666, umask: 0o022, ..Default::default() }).unwrap();
    // The umask is not applied; the mask and other:: keep what 0666 allows.
    assert_eq!(f.mode, 0o100664);
    let fa = acl_of(&fs, f.ino, acl::ACCESS).expect("the file gets an access ACL");
    assert_eq!(
        perms(&fa),
        vec![(Tag::UserObj, 6), (Tag::User, 7), (Tag::GroupObj, 5), (Tag::Mask, 6), (Tag::Other, 4)]
    );
    assert_eq!(acl_of(&fs, f.ino, acl::DEFAULT), None, "only directories keep a default ACL");

    let sub = fs.make(d.ino, b"sub", &New { mode: 0o040777, umask: 0o077, ..Default::default() }).unwrap();
    assert_eq!(sub.mode, 0o040775);
    assert_eq!(acl_of(&fs, sub.ino, acl::DEFAULT), Some(named_default()));
    assert!(acl_of(&fs, sub.ino, acl::ACCESS).is_some());
    // ... and passes it on.
    let g = fs.make(sub.ino, b"g", &New { mode: 0o100600, ..Default::default() }).unwrap();
    assert_eq!(g.mode, 0o100600);
    assert_eq!(perms(&acl_of(&fs, g.ino, acl::ACCESS).unwrap())[3], (Tag::Mask, 0));

    // A minimal default ACL gives the mode and no access ACL (generic/319).
    let m = fs.mkdir(ROOT, b"m", 0o755, 0, 0).unwrap();
    fs.setxattr(m.ino, acl::DEFAULT, &Acl::from_mode(0o770).encode(), XattrFlags::empty()).unwrap();
    let ms = fs.make(m.ino, b"s", &New { mode: 0o040777, umask: 0o022, ..Default::default() }).unwrap();
    assert_eq!(ms.mode, 0o040770);
    assert_eq!(acl_of(&fs, ms.ino, acl::ACCESS), None);

    // No default ACL: the umask applies; symlinks get nothing.
    let plain = fs.make(ROOT, b"plain", &New { mode: 0o100666, umask: 0o027, ..Default::default() }).unwrap();
    assert_eq!(plain.mode, 0o100640);
    let l = fs.symlink(d.ino, b"l", b"f", 0, 0).unwrap();
    assert_eq!(l.mode, 0o120777);
    assert!(fs.listxattr(l.ino).unwrap().is_empty());

    // An fsync of the directory alone, then a crash: the names come back with their ACLs.
    fs.fsync(d.ino, false).unwrap();
    fs.fsync(sub.ino, false).unwrap();
    std::mem::forget(fs);
    let fs = open(&dev);
    let f2 = fs.lookup(d.ino, b"f").unwrap();
    assert_eq!(f2.mode, 0o100664);
    assert_eq!(acl_of(&fs, f2.ino, acl::ACCESS), Some(fa));
    let sub2 = fs.lookup(d.ino, b"sub").unwrap();
    assert_eq!(acl_of(&fs, sub2.ino, acl::DEFAULT), Some(named_default()));
    fs.unmount().unwrap();
    fsck_clean(&dev);
}

#[test]
fn the_mode_and_the_access_acl_follow_each_other() {
    let dev = fresh();
    let fs = open(&dev);
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    let acl = Acl::new(vec![
        e(Tag::UserObj, 6, U),
        e(Tag::User, 5, 1001),
        e(Tag::GroupObj, 4, U),
        e(Tag::Mask, 7, U),
        e(Tag::Other, 0, U),
    ])
    .unwrap();
    fs.setxattr(f.ino, acl::ACCESS, &acl.encode(), XattrFlags::empty()).unwrap();
    // The group bits show the mask.
    assert_eq!(fs.getattr(f.ino).unwrap().mode, 0o100670);
    // chmod rewrites the mask (not group::), user:: and other::; named entries stay.
    fs.setattr(f.ino, &SetAttr { mode: Some(0o751), ..Default::default() }).unwrap();
    let after = acl_of(&fs, f.ino, acl::ACCESS).unwrap();
    assert_eq!(
        perms(&after),
        vec![(Tag::UserObj, 7), (Tag::User, 5), (Tag::GroupObj, 4), (Tag::Mask, 5), (Tag::Other, 1)]
    );
    // An ACL the mode says all of is not kept, and sets the mode.
    fs.setxattr(f.ino, acl::ACCESS, &Acl::from_mode(0o604).encode(), XattrFlags::empty()).unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().mode, 0o100604);
    assert_eq!(acl_of(&fs, f.ino, acl::ACCESS), None);
    // Removing an ACL there is not is no error (as ext4), and leaves the mode.
    fs.removexattr(f.ino, acl::ACCESS).unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().mode, 0o100604);
    // Across a remount.
    fs.setxattr(f.ino, acl::ACCESS, &acl.encode(), XattrFlags::empty()).unwrap();
    fs.setattr(f.ino, &SetAttr { mode: Some(0o700), ..Default::default() }).unwrap();
    fs.unmount().unwrap();
    let fs = open(&dev);
    assert_eq!(fs.getattr(f.ino).unwrap().mode, 0o100700);
    assert_eq!(perms(&acl_of(&fs, f.ino, acl::ACCESS).unwrap())[3], (Tag::Mask, 0));
    fs.unmount().unwrap();
    fsck_clean(&dev);
}

#[test]
fn malformed_or_misplaced_acls_are_refused_and_change_nothing() {
    let dev = fresh();
    let fs = open(&dev);
    let f = fs.create(ROOT, b"f", 0o640, 0, 0).unwrap();
    let good = Acl::from_mode(0o777).encode();
    let mut bad_version = good.clone();
    bad_version[0] = 1;
    let mut bad_perm = good.clone();
    bad_perm[6] = 8;
    for (what, v) in [
        ("empty", vec![]),
        ("version", bad_version),
        ("permission", bad_perm),
        ("torn entry", good[..good.len() - 3].to_vec()),
        ("no other::", good[..good.len() - 8].to_vec()),
    ] {
        for name in [acl::ACCESS, acl::DEFAULT] {
            let err = fs.setxattr(ROOT, name, &v, XattrFlags::empty()).unwrap_err();
            assert_eq!(err.to_errno(), libc::EINVAL, "{what}");
        }
        assert_eq!(
            fs.setxattr(f.ino, acl::ACCESS, &v, XattrFlags::empty()).unwrap_err().to_errno(),
            libc::EINVAL,
            "{what}"
        );
    }
    assert_eq!(fs.getattr(f.ino).unwrap().mode, 0o100640);
    assert!(fs.listxattr(f.ino).unwrap().is_empty());
    // A default ACL belongs to directories; symlinks have none at all.
    assert_eq!(
        fs.setxattr(f.ino, acl::DEFAULT, &good, XattrFlags::empty()).unwrap_err().to_errno(),
        libc::EACCES
    );
    let l = fs.symlink(ROOT, b"l", b"f", 0, 0).unwrap();
    assert_eq!(
        fs.setxattr(l.ino, acl::ACCESS, &good, XattrFlags::empty()).unwrap_err().to_errno(),
        libc::EOPNOTSUPP
    );
    // An ACL with no entries removes it.
    fs.setxattr(ROOT, acl::DEFAULT, &good, XattrFlags::empty()).unwrap();
    fs.setxattr(ROOT, acl::DEFAULT, &[2, 0, 0, 0], XattrFlags::empty()).unwrap();
    assert_eq!(acl_of(&fs, ROOT, acl::DEFAULT), None);
    fs.unmount().unwrap();
}

/// A caller as the kernel describes one: whether it has CAP_FSETID, its groups; it counts the
/// times it is told bits were dropped.
struct As {
    fsetid: bool,
    groups: Vec<u32>,
    told: Cell<u32>,
}

impl As {
    fn user(groups: &[u32]) -> As {
        As { fsetid: false, groups: groups.to_vec(), told: Cell::new(0) }
    }
    fn root() -> As {
        As { fsetid: true, groups: vec![0], told: Cell::new(0) }
    }
}

impl Caller for As {
    fn fsetid(&self) -> bool {
        self.fsetid
    }
    fn in_group(&self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }
    fn dropped(&self, _ino: u64, mode: u32) {
        assert_eq!(mode & 0o4000, 0, "told once set-user-ID is gone");
        self.told.set(self.told.get() + 1);
    }
}

#[test]
fn changes_by_an_unprivileged_caller_drop_set_id_bits_first() {
    let dev = fresh();
    let fs = open(&dev);
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    let mode = |m: u32| fs.setattr(f.ino, &SetAttr { mode: Some(m), ..Default::default() }).unwrap();
    let now = || fs.getattr(f.ino).unwrap().mode & 0o7777;

    // Root (CAP_FSETID) keeps them; a user not in the group loses both, even without g+x.
    mode(0o6666);
    fs.write_at_as(f.ino, 0, b"root", &As::root()).unwrap();
    assert_eq!(now(), 0o6666);
    let user = As::user(&[1001]);
    fs.write_at_as(f.ino, 0, b"user", &user).unwrap();
    assert_eq!(now(), 0o666);
    assert_eq!(user.told.get(), 1);
    // Nothing to drop: not told again. A write of no bytes drops nothing.
    fs.write_at_as(f.ino, 0, b"again", &user).unwrap();
    assert_eq!(user.told.get(), 1);
    mode(0o6666);
    fs.write_at_as(f.ino, 0, b"", &user).unwrap();
    assert_eq!(now(), 0o6666);
    // A member of the group keeps set-group-ID on a file it cannot execute as group.
    fs.write_at_as(f.ino, 0, b"member", &As::user(&[0])).unwrap();
    assert_eq!(now(), 0o2666);
    // Truncate, fallocate (any mode) likewise.
    mode(0o6755);
    fs.setattr_as(f.ino, &SetAttr { size: Some(1), ..Default::default() }, &As::user(&[1001])).unwrap();
    assert_eq!(now(), 0o755);
    mode(0o6755);
    fs.setattr_as(f.ino, &SetAttr { size: Some(1), ..Default::default() }, &As::root()).unwrap();
    assert_eq!(now(), 0o6755);
    for falloc_mode in
        [FallocMode::empty(), FallocMode::KEEP_SIZE, FallocMode::PUNCH_HOLE | FallocMode::KEEP_SIZE]
    {
        mode(0o6755);
        fs.fallocate_as(f.ino, falloc_mode, 0, 8192, &As::user(&[1001])).unwrap();
        assert_eq!(now(), 0o755, "fallocate mode {falloc_mode:#x}");
    }
    // The plain calls are a privileged library caller's.
    mode(0o6755);
    fs.write_at(f.ino, 0, b"lib").unwrap();
    assert_eq!(now(), 0o6755);
    // chown drops set-user-ID whoever asks, and set-group-ID with group-exec.
    fs.setattr_as(f.ino, &SetAttr { uid: Some(5), ..Default::default() }, &As::root()).unwrap();
    assert_eq!(now(), 0o755);
    mode(0o2745);
    fs.setattr_as(f.ino, &SetAttr { gid: Some(0), ..Default::default() }, &As::root()).unwrap();
    assert_eq!(now(), 0o2745);
    // File capabilities go with any write, privileged or not.
    fs.setxattr(f.ino, b"security.capability", b"caps", XattrFlags::empty()).unwrap();
    fs.write_at_as(f.ino, 0, b"x", &As::root()).unwrap();
    assert!(fs.getxattr(f.ino, b"security.capability").is_err());
    // An access ACL set by someone outside the group drops set-group-ID (generic/375).
    mode(0o2755);
    let acl = Acl::from_mode(0o777).encode();
    fs.setxattr_as(f.ino, acl::ACCESS, &acl, XattrFlags::empty(), &As::user(&[0])).unwrap();
    assert_eq!(now(), 0o2777);
    mode(0o2755);
    fs.setxattr_as(f.ino, acl::ACCESS, &acl, XattrFlags::empty(), &As::user(&[101])).unwrap();
    assert_eq!(now(), 0o777);
    // Directories keep their bits on a chown.
    let d = fs.mkdir(ROOT, b"d", 0o2775, 0, 0).unwrap();
    fs.setattr_as(d.ino, &SetAttr { uid: Some(7), ..Default::default() }, &As::user(&[1001])).unwrap();
    assert_eq!(fs.getattr(d.ino).unwrap().mode, 0o042775);
    fs.unmount().unwrap();
    let fs = open(&dev);
    assert_eq!(fs.getattr(f.ino).unwrap().mode, 0o100777);
    fs.unmount().unwrap();
    fsck_clean(&dev);
}
