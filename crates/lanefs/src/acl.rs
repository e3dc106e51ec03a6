//! POSIX ACLs: the xattr codec and the rules that tie an ACL to the mode.
//!
//! An ACL lives in the xattrs `system.posix_acl_access` and `system.posix_acl_default` in the
//! kernel's format (`posix_acl_xattr_header` version 2, then 8-byte entries of tag, permission
//! and id, little-endian). Whatever bytes arrive, [`Acl::decode`] validates them as the kernel's
//! `posix_acl_from_xattr` and `posix_acl_valid` do, and fails with EINVAL, never a panic.
//!
//! The rules are those of the kernel's fs/posix_acl.c, which ext4 applies and the FUSE kernel
//! module leaves to the server once FUSE_POSIX_ACL is negotiated:
//! - the mode's permission bits mirror the access ACL: owner = `user::`, group = `mask::` if
//!   there is one (else `group::`), other = `other::` ([`Acl::equiv_mode`]); an ACL that says no
//!   more than the mode is not stored;
//! - chmod rewrites those entries of the access ACL ([`Acl::chmod`]);
//! - a new inode in a directory with a default ACL gets it as its access ACL, masked by the mode
//!   it was created with, and no umask ([`Acl::create_masq`]); a new directory also keeps it as
//!   its own default ACL.
//!
//! Invariant: an [`Acl`] held in memory is valid (one `user::`, `group::` and `other::` entry,
//! a `mask::` exactly when there are named entries or one was given, tags in canonical order,
//! permissions within rwx), so the rules never meet a malformed list.

use crate::error::{Error, Result};

/// The access ACL's xattr name.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's xattr name (directories only).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

/// `POSIX_ACL_XATTR_VERSION`.
const VERSION: u32 = 2;
const HEADER_LEN: usize = 4;
const ENTRY_LEN: usize = 8;
/// The id written for entries that name no one (`ACL_UNDEFINED_ID`).
const UNDEFINED_ID: u32 = u32::MAX;
/// Entries the kernel accepts in one ACL (`fuse_get_acl` reads at most a page).
const MAX_ENTRIES: usize = (4096 - HEADER_LEN) / ENTRY_LEN;

/// An entry's tag, in the kernel's canonical order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    /// ACL_USER_OBJ: the file's owner.
    UserObj,
    /// ACL_USER: a named user (the entry's id).
    User,
    /// ACL_GROUP_OBJ: the file's group.
    GroupObj,
    /// ACL_GROUP: a named group (the entry's id).
    Group,
    /// ACL_MASK: the most a named entry or the group may grant.
    Mask,
    /// ACL_OTHER: everyone else.
    Other,
}

impl Tag {
    fn code(self) -> u16 {
        match self {
            Tag::UserObj => 0x01,
            Tag::User => 0x02,
            Tag::GroupObj => 0x04,
            Tag::Group => 0x08,
            Tag::Mask => 0x10,
            Tag::Other => 0x20,
        }
    }

    fn of(code: u16) -> Option<Tag> {
        Some(match code {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }
}

/// One entry: who, and what they may do (bits r=4, w=2, x=1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Whom the entry is about.
    pub tag: Tag,
    /// Permission bits: read 4, write 2, execute 1.
    pub perm: u16,
    /// The user or group of a `User` or `Group` entry; [`u32::MAX`] for the others.
    pub id: u32,
}

/// A valid ACL (see the module's invariant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

fn einval(why: &str) -> Error {
    Error::errno(libc::EINVAL, format!("POSIX ACL: {why}"))
}

impl Acl {
    /// Decodes and validates an ACL xattr value. `Ok(None)` is an ACL with no entries, which the
    /// kernel treats as removing the ACL.
    pub fn decode(b: &[u8]) -> Result<Option<Acl>> {
        if b.len() < HEADER_LEN {
            return Err(einval("shorter than its header"));
        }
        let version = u32::from_le_bytes(b[..HEADER_LEN].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(einval("not version 2"));
        }
        let body = &b[HEADER_LEN..];
        if !body.len().is_multiple_of(ENTRY_LEN) {
            return Err(einval("not a whole number of entries"));
        }
        if body.is_empty() {
            return Ok(None);
        }
        if body.len() / ENTRY_LEN > MAX_ENTRIES {
            return Err(einval("too many entries"));
        }
        let entries = body
            .chunks_exact(ENTRY_LEN)
            .map(|e| {
                let tag = Tag::of(u16::from_le_bytes([e[0], e[1]])).ok_or_else(|| einval("unknown tag"))?;
                let perm = u16::from_le_bytes([e[2], e[3]]);
                let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
                let id = if matches!(tag, Tag::User | Tag::Group) { id } else { UNDEFINED_ID };
                Ok(Entry { tag, perm, id })
            })
            .collect::<Result<Vec<_>>>()?;
        Acl::new(entries).map(Some)
    }

    /// An ACL of `entries`, which must be valid as the kernel's `posix_acl_valid` checks: each
    /// permission within rwx; `user::`, then named users, `group::`, named groups, `mask::`,
    /// `other::`, in that order; one of each unnamed entry, the mask required by named ones.
    pub fn new(entries: Vec<Entry>) -> Result<Acl> {
        let mut seen = [0usize; 6];
        let mut last = Tag::UserObj;
        for e in &entries {
            if e.perm & !7 != 0 {
                return Err(einval("a permission beyond rwx"));
            }
            if e.tag < last {
                return Err(einval("entries out of order"));
            }
            last = e.tag;
            seen[e.tag as usize] += 1;
        }
        let [user_obj, users, group_obj, groups, mask, other] = seen;
        if user_obj != 1 || group_obj != 1 || other != 1 || mask > 1 {
            return Err(einval("needs one user::, group:: and other:: entry, and at most one mask"));
        }
        if (users > 0 || groups > 0) && mask == 0 {
            return Err(einval("named entries need a mask"));
        }
        Ok(Acl { entries })
    }

    /// The ACL that says exactly what permission bits `mode` say.
    pub fn from_mode(mode: u32) -> Acl {
        let p = |shift: u32| ((mode >> shift) & 7) as u16;
        Acl {
            entries: vec![
                Entry { tag: Tag::UserObj, perm: p(6), id: UNDEFINED_ID },
                Entry { tag: Tag::GroupObj, perm: p(3), id: UNDEFINED_ID },
                Entry { tag: Tag::Other, perm: p(0), id: UNDEFINED_ID },
            ],
        }
    }

    /// The entries, in the canonical order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The xattr value (what `posix_acl_to_xattr` writes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + ENTRY_LEN * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.code().to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    fn find(&mut self, tag: Tag) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.tag == tag)
    }

    /// `mode` with its permission bits taken from this (access) ACL, and whether the ACL says
    /// more than those bits (then it must be stored; else it is dropped). The kernel's
    /// `posix_acl_equiv_mode`.
    pub fn equiv_mode(&self, mode: u32) -> (u32, bool) {
        let mut bits = 0u32;
        let mut extended = false;
        for e in &self.entries {
            let p = u32::from(e.perm & 7);
            match e.tag {
                Tag::UserObj => bits |= p << 6,
                Tag::GroupObj => bits |= p << 3,
                Tag::Other => bits |= p,
                Tag::Mask => {
                    bits = (bits & !0o070) | (p << 3);
                    extended = true;
                }
                Tag::User | Tag::Group => extended = true,
            }
        }
        ((mode & !0o777) | bits, extended)
    }

    /// Rewrites the entries the mode mirrors after a chmod to `mode` (`posix_acl_chmod`): the
    /// group bits go to the mask if there is one, else to `group::`.
    pub fn chmod(&mut self, mode: u32) {
        let p = |shift: u32| ((mode >> shift) & 7) as u16;
        self.find(Tag::UserObj).expect("valid ACL has user::").perm = p(6);
        self.find(Tag::Other).expect("valid ACL has other::").perm = p(0);
        let group = if self.entries.iter().any(|e| e.tag == Tag::Mask) { Tag::Mask } else { Tag::GroupObj };
        self.find(group).expect("valid ACL has group::").perm = p(3);
    }

    /// Turns a directory's default ACL into a new inode's access ACL (`posix_acl_create_masq`):
    /// each mirrored entry keeps only what the requested `mode` allows, and the mode only what
    /// the ACL allows. Returns the new mode and whether the ACL says more than it (then the
    /// inode gets it as its access ACL).
    pub fn create_masq(&mut self, mode: u32) -> (u32, bool) {
        let mut bits = mode & 0o777;
        let mut extended = false;
        for e in self.entries.iter_mut() {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= ((bits >> 6) & 7) as u16;
                    bits &= (u32::from(e.perm) << 6) | !0o700;
                }
                Tag::Other => {
                    e.perm &= (bits & 7) as u16;
                    bits &= u32::from(e.perm) | !0o007;
                }
                Tag::User | Tag::Group | Tag::Mask => extended = true,
                Tag::GroupObj => {}
            }
        }
        let group = if self.entries.iter().any(|e| e.tag == Tag::Mask) { Tag::Mask } else { Tag::GroupObj };
        let g = self.find(group).expect("valid ACL has group::");
        g.perm &= ((bits >> 3) & 7) as u16;
        bits &= (u32::from(g.perm) << 3) | !0o070;
        ((mode & !0o777) | (bits & 0o777), extended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: Tag, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    const U: u32 = UNDEFINED_ID;

    /// u::rw-, u:1001:r-x, g::r--, g:27:rwx, m::rwx, o::---
    fn extended() -> Acl {
        Acl::new(vec![
            e(Tag::UserObj, 6, U),
            e(Tag::User, 5, 1001),
            e(Tag::GroupObj, 4, U),
            e(Tag::Group, 7, 27),
            e(Tag::Mask, 7, U),
            e(Tag::Other, 0, U),
        ])
        .unwrap()
    }

    #[test]
    fn encode_decode_round_trip_byte_for_byte() {
        for acl in [extended(), Acl::from_mode(0o754)] {
            let bytes = acl.encode();
            assert_eq!(bytes.len(), 4 + 8 * acl.entries().len());
            assert_eq!(&bytes[..4], &[2, 0, 0, 0]);
            let back = Acl::decode(&bytes).unwrap().unwrap();
            assert_eq!(back, acl);
            assert_eq!(back.encode(), bytes);
        }
        // The layout, as setfacl writes it: tag, perm, id, little-endian.
        let b = extended().encode();
        assert_eq!(&b[12..20], &[0x02, 0, 5, 0, 0xe9, 0x03, 0, 0]);
    }

    #[test]
    fn an_empty_acl_means_none_and_base_entry_ids_are_ignored() {
        assert_eq!(Acl::decode(&[2, 0, 0, 0]).unwrap(), None);
        let mut b = Acl::from_mode(0o640).encode();
        b[8..12].copy_from_slice(&7u32.to_le_bytes()); // user:: with an id
        let a = Acl::decode(&b).unwrap().unwrap();
        assert_eq!(a, Acl::from_mode(0o640));
    }

    #[test]
    fn malformed_values_are_einval_never_a_panic() {
        let good = extended().encode();
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![2, 0],
            vec![1, 0, 0, 0],
            good[..good.len() - 1].to_vec(),
            [&good[..], &[0u8; 4]].concat(),
        ];
        let with = |at: usize, v: &[u8]| {
            let mut b = good.clone();
            b[at..at + v.len()].copy_from_slice(v);
            b
        };
        cases.push(with(4, &[0x40, 0])); // unknown tag
        cases.push(with(6, &[8, 0])); // permission beyond rwx
        cases.push(with(4, &[0x20, 0])); // other:: first: out of order
        cases.push(with(36, &[0x08, 0])); // the mask made a named group: no mask left
        cases.push(with(44, &[0x10, 0])); // two masks, no other::
                                          // Too many entries for a page.
        let mut big = vec![2, 0, 0, 0];
        for _ in 0..600 {
            big.extend_from_slice(&[0x02, 0, 7, 0, 1, 0, 0, 0]);
        }
        cases.push(big);
        for (i, c) in cases.iter().enumerate() {
            match Acl::decode(c) {
                Err(err) => assert_eq!(err.to_errno(), libc::EINVAL, "case {i}"),
                Ok(a) => panic!("case {i} decoded as {a:?}"),
            }
        }
        // Every truncation and every single-byte change of a valid value: an answer, never a
        // panic, and anything accepted is valid (it encodes back to what was decoded).
        for n in 0..good.len() {
            let _ = Acl::decode(&good[..n]);
        }
        for i in 0..good.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                if let Ok(Some(a)) = Acl::decode(&with(i, &[v])) {
                    assert_eq!(Acl::decode(&a.encode()).unwrap().unwrap(), a);
                }
            }
        }
    }

    #[test]
    fn equiv_mode_takes_group_bits_from_the_mask() {
        assert_eq!(Acl::from_mode(0o751).equiv_mode(0o100000), (0o100751, false));
        // Set-ID and type bits are kept; group bits come from the mask (rwx), not group:: (r--).
        assert_eq!(extended().equiv_mode(0o102000), (0o102670, true));
    }

    #[test]
    fn chmod_rewrites_the_mask_not_the_group_entry() {
        let mut a = extended();
        a.chmod(0o750);
        let perms: Vec<(Tag, u16)> = a.entries().iter().map(|e| (e.tag, e.perm)).collect();
        assert_eq!(
            perms,
            vec![
                (Tag::UserObj, 7),
                (Tag::User, 5),
                (Tag::GroupObj, 4),
                (Tag::Group, 7),
                (Tag::Mask, 5),
                (Tag::Other, 0)
            ]
        );
        assert_eq!(a.equiv_mode(0).0, 0o750);
        let mut m = Acl::from_mode(0o644);
        m.chmod(0o705);
        assert_eq!(m, Acl::from_mode(0o705));
    }

    #[test]
    fn create_masq_as_the_kernel() {
        // generic/319: default u::rwx,g::rwx,o::--- and mkdir 0777: a minimal ACL, mode 0770.
        let mut d = Acl::from_mode(0o770);
        assert_eq!(d.create_masq(0o040777), (0o040770, false));
        assert_eq!(d, Acl::from_mode(0o770));
        // generic/444: default u::rwx,u:101:rwx,g::r-x,m::rwx,o::r-x; mkdir 0777 of an SGID
        // child: group bits from the mask, set-ID kept.
        let mut d = Acl::new(vec![
            e(Tag::UserObj, 7, U),
            e(Tag::User, 7, 101),
            e(Tag::GroupObj, 5, U),
            e(Tag::Mask, 7, U),
            e(Tag::Other, 5, U),
        ])
        .unwrap();
        assert_eq!(d.clone().create_masq(0o042777), (0o042775, true));
        // A file created 0644: the mask and other:: lose what the mode does not give.
        let (mode, ext) = d.create_masq(0o100644);
        assert_eq!((mode, ext), (0o100644, true));
        let perms: Vec<u16> = d.entries().iter().map(|e| e.perm).collect();
        assert_eq!(perms, vec![6, 7, 5, 4, 4]);
        // Without a mask, group:: is masked.
        let mut d = Acl::from_mode(0o777);
        assert_eq!(d.create_masq(0o100640), (0o100640, false));
        assert_eq!(d, Acl::from_mode(0o640));
    }
}
