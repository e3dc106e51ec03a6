//! Record and transaction tests: round trips and corruption of any record (property tests:
//! a decode of damaged bytes is an error, never a panic), the encoder refusing exactly what
//! the decoder would, allocation bounded by the bytes held, and the geometry check.
//!
//! The strategies draw records of many kinds with random, valid fields; `reseal` re-seals a
//! changed body so that the decoder's checks past the checksum are reached.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::chain_tests::geo;
use super::record::*;
use crate::error::{Error, Structure};
use crate::format::dentry::validate_name;
use crate::format::node::{Timespec, NEW_ADDR};

fn stamp() -> impl Strategy<Value = Stamp> {
    (any::<u64>(), any::<u32>()).prop_map(|(ticks, cpu)| Stamp { ticks, cpu })
}

fn timespec() -> impl Strategy<Value = Timespec> {
    (any::<i64>(), 0u32..1_000_000_000).prop_map(|(sec, nsec)| Timespec { sec, nsec })
}

const TYPES: [u32; 7] = [0o100000, 0o040000, 0o120000, 0o020000, 0o060000, 0o010000, 0o140000];

fn attr_of_type(ty: u32) -> impl Strategy<Value = InodeAttr> {
    (
        0u32..0o7777,
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        [timespec(), timespec(), timespec(), timespec()],
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(
            move |(perm, uid, gid, size, [atime, mtime, ctime, crtime], rdev, flags, generation)| InodeAttr {
                mode: ty | perm,
                uid,
                gid,
                size,
                atime,
                mtime,
                ctime,
                crtime,
                rdev,
                flags,
                generation,
            },
        )
}

fn attr() -> impl Strategy<Value = InodeAttr> {
    proptest::sample::select(TYPES.to_vec()).prop_flat_map(attr_of_type)
}

fn ino() -> impl Strategy<Value = u32> {
    1u32..=u32::MAX
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![proptest::collection::vec(1u8..=255, 1..=8), proptest::collection::vec(1u8..=255, 250..=255),]
        .prop_filter("valid name", |n| validate_name(n).is_ok())
}

fn create() -> impl Strategy<Value = Record> {
    let regular =
        attr().prop_filter("not a symlink", |a| a.mode & 0o170000 != 0o120000).prop_map(|a| (a, vec![]));
    let symlink = (attr_of_type(0o120000), proptest::collection::vec(any::<u8>(), 1..=MAX_SYMLINK_LEN));
    (stamp(), ino(), name(), ino(), prop_oneof![regular, symlink]).prop_map(
        |(stamp, dir, name, ino, (attr, symlink))| Record::Create { stamp, dir, name, ino, attr, symlink },
    )
}

fn map_entry() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![Just((0, 0)), Just((NEW_ADDR, 0)), (1u32..NEW_ADDR, any::<u32>())]
}

fn xattrs() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    proptest::collection::btree_map(
        proptest::collection::vec(any::<u8>(), 1..=40),
        proptest::collection::vec(any::<u8>(), 0..=200),
        0..=12,
    )
    .prop_map(|m| m.into_iter().collect())
}

fn record() -> impl Strategy<Value = Record> {
    prop_oneof![
        create(),
        (stamp(), ino(), name(), ino(), proptest::sample::select(vec![1u8, 2, 4, 6, 8, 10, 12]))
            .prop_map(|(stamp, dir, name, ino, file_type)| Record::Link { stamp, dir, name, ino, file_type }),
        (stamp(), ino(), name(), ino()).prop_map(|(stamp, dir, name, ino)| Record::Unlink {
            stamp,
            dir,
            name,
            ino
        }),
        (stamp(), ino(), name(), ino(), name(), ino(), any::<u32>(), any::<bool>())
            .prop_filter("valid rename", |(_, _, _, _, _, ino, replaced, exchange)| {
                replaced != ino && (!exchange || *replaced != 0)
            })
            .prop_map(|(stamp, src_dir, src_name, dst_dir, dst_name, ino, replaced, exchange)| {
                Record::Rename {
                    stamp,
                    src_dir,
                    src_name,
                    dst_dir,
                    dst_name,
                    ino,
                    replaced,
                    exchange,
                    whiteout: None,
                }
            }),
        (stamp(), ino(), name(), ino(), name(), ino(), any::<u32>(), ino(), attr_of_type(WHITEOUT_TYPE))
            .prop_filter("valid whiteout rename", |(_, _, _, _, _, ino, replaced, w, _)| {
                replaced != ino && w != ino && w != replaced
            })
            .prop_map(|(stamp, src_dir, src_name, dst_dir, dst_name, ino, replaced, w, attr)| {
                Record::Rename {
                    stamp,
                    src_dir,
                    src_name,
                    dst_dir,
                    dst_name,
                    ino,
                    replaced,
                    exchange: false,
                    whiteout: Some(Whiteout { ino: w, attr: InodeAttr { rdev: 0, ..attr } }),
                }
            }),
        (stamp(), ino(), attr()).prop_map(|(stamp, ino, attr)| Record::SetAttr { stamp, ino, attr }),
        (
            stamp(),
            ino(),
            0..MAX_FILE_BLOCKS - MAP_RUN_MAX as u64,
            proptest::collection::vec(map_entry(), 1..=MAP_RUN_MAX)
        )
            .prop_map(|(stamp, ino, first, entries)| Record::Map { stamp, ino, first, entries }),
        (stamp(), ino(), 0..=MAX_FILE_BLOCKS).prop_map(|(stamp, ino, from_block)| Record::Truncate {
            stamp,
            ino,
            from_block
        }),
        (stamp(), ino(), xattrs()).prop_map(|(stamp, ino, attrs)| Record::Xattrs { stamp, ino, attrs }),
        (
            stamp(),
            ino(),
            proptest::collection::vec(any::<u8>(), 1..=255),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..=300),
                Just(vec![7u8; crate::format::xattr::XATTR_SIZE_MAX])
            ]
        )
            .prop_map(|(stamp, ino, name, value)| Record::SetXattr { stamp, ino, name, value }),
        (stamp(), ino(), proptest::collection::vec(any::<u8>(), 1..=255))
            .prop_map(|(stamp, ino, name)| Record::RemoveXattr { stamp, ino, name }),
        (stamp(), ino()).prop_map(|(stamp, ino)| Record::Free { stamp, ino }),
    ]
}

fn transaction() -> impl Strategy<Value = Transaction> {
    proptest::collection::vec(record(), 0..6).prop_map(Transaction::new)
}

/// Re-seals a transaction's header (length and crc) after its body was changed, so the
/// decoder's checks past the checksum get exercised.
pub(super) fn reseal(bytes: &mut [u8]) {
    let body_len = (bytes.len() - TXN_HEADER_LEN) as u32;
    bytes[8..12].copy_from_slice(&body_len.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[TXN_HEADER_LEN..]);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn transaction_round_trip(t in transaction()) {
        let bytes = t.encode().unwrap();
        prop_assert_eq!(bytes.len(), t.encoded_len());
        prop_assert_eq!(Transaction::decode(&bytes).unwrap(), t);
    }

    /// Every variant, on its own (so that a rare variant is not drowned out by the others).
    #[test]
    fn every_variant_round_trips(r in record()) {
        let t = Transaction::new(vec![r.clone()]);
        let back = Transaction::decode(&t.encode().unwrap()).unwrap();
        prop_assert_eq!(&back.records[0], &r);
        prop_assert_eq!(back.records[0].stamp(), r.stamp());
    }

    #[test]
    fn flipped_byte_is_rejected(t in transaction(), pick in any::<prop::sample::Index>(), xor in 1u8..=255) {
        let mut bytes = t.encode().unwrap();
        let pos = pick.index(bytes.len());
        bytes[pos] ^= xor;
        let e = Transaction::decode(&bytes).unwrap_err();
        prop_assert!(matches!(e, Error::Corrupt { structure: Structure::Journal, .. }), "{}", e);
    }

    #[test]
    fn truncated_and_garbage_are_rejected(
        t in transaction(),
        cut in any::<prop::sample::Index>(),
        garbage in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let bytes = t.encode().unwrap();
        let len = cut.index(bytes.len());
        prop_assert!(Transaction::decode(&bytes[..len]).is_err());
        prop_assert!(Transaction::decode(&garbage).is_err());
        // Extra bytes after a valid transaction are not part of it.
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert!(Transaction::decode(&longer).is_err());
    }

    /// A changed body under a correct checksum either fails validation or is a valid
    /// transaction in its own right: whatever the decoder accepts re-encodes to the same bytes.
    #[test]
    fn resealed_corruption_never_panics(
        t in transaction(),
        pick in any::<prop::sample::Index>(),
        xor in 1u8..=255,
        count in any::<u32>(),
    ) {
        let mut bytes = t.encode().unwrap();
        if bytes.len() > TXN_HEADER_LEN {
            let pos = TXN_HEADER_LEN + pick.index(bytes.len() - TXN_HEADER_LEN);
            bytes[pos] ^= xor;
            reseal(&mut bytes);
            if let Ok(back) = Transaction::decode(&bytes) {
                prop_assert_eq!(back.encode().unwrap(), bytes.clone());
            }
        }
        // A corrupt count under a correct checksum: an error, and no allocation for it.
        bytes[4..8].copy_from_slice(&count.to_le_bytes());
        if let Ok(back) = Transaction::decode(&bytes) {
            prop_assert_eq!(back.encode().unwrap(), bytes);
        }
    }

    /// Random bodies under a correct header.
    #[test]
    fn random_sealed_body_never_panics(body in proptest::collection::vec(any::<u8>(), 0..600), count in 0u32..40) {
        let mut bytes = vec![0u8; TXN_HEADER_LEN];
        bytes[..4].copy_from_slice(&TXN_MAGIC.to_le_bytes());
        bytes[4..8].copy_from_slice(&count.to_le_bytes());
        bytes.extend_from_slice(&body);
        reseal(&mut bytes);
        if let Ok(back) = Transaction::decode(&bytes) {
            prop_assert_eq!(back.encode().unwrap(), bytes);
        }
    }

    #[test]
    fn map_runs_cover_the_map_exactly(
        map in proptest::collection::btree_map(0u64..2000, map_entry(), 0..700),
        s in stamp(),
    ) {
        let recs = Record::map_runs(7, s, &map);
        let mut back = BTreeMap::new();
        for r in &recs {
            let Record::Map { stamp, ino, first, entries } = r else { panic!("not a map record") };
            prop_assert_eq!((*stamp, *ino), (s, 7));
            prop_assert!(!entries.is_empty() && entries.len() <= MAP_RUN_MAX);
            for (i, e) in entries.iter().enumerate() {
                prop_assert!(back.insert(first + i as u64, *e).is_none());
            }
        }
        prop_assert_eq!(&back, &map);
        // Runs are maximal: two records meet only where the first is full.
        for w in recs.windows(2) {
            if let (Record::Map { first: a, entries: ea, .. }, Record::Map { first: b, .. }) = (&w[0], &w[1]) {
                prop_assert!(a + ea.len() as u64 != *b || ea.len() == MAP_RUN_MAX);
            }
        }
        // And they encode (each record is bounded).
        Transaction::new(recs).encode().unwrap();
    }
}

pub(super) fn st(ticks: u64, cpu: u32) -> Stamp {
    Stamp { ticks, cpu }
}

fn reg_attr() -> InodeAttr {
    InodeAttr { mode: 0o100644, ..InodeAttr::default() }
}

#[test]
fn encode_rejects_what_decode_would() {
    let bad = [
        Record::Unlink { stamp: st(1, 0), dir: 1, name: b"a/b".to_vec(), ino: 2 },
        Record::Unlink { stamp: st(1, 0), dir: 1, name: b"..".to_vec(), ino: 2 },
        Record::Unlink { stamp: st(1, 0), dir: 0, name: b"a".to_vec(), ino: 2 },
        Record::Link { stamp: st(1, 0), dir: 1, name: b"a".to_vec(), ino: 2, file_type: 3 },
        Record::Create {
            stamp: st(1, 0),
            dir: 1,
            name: b"a".to_vec(),
            ino: 2,
            attr: reg_attr(),
            symlink: b"x".to_vec(),
        },
        Record::Create {
            stamp: st(1, 0),
            dir: 1,
            name: b"a".to_vec(),
            ino: 2,
            attr: InodeAttr { mode: 0o120777, ..reg_attr() },
            symlink: vec![],
        },
        Record::SetAttr { stamp: st(1, 0), ino: 2, attr: InodeAttr { mode: 0o644, ..reg_attr() } },
        Record::SetAttr {
            stamp: st(1, 0),
            ino: 2,
            attr: InodeAttr { mtime: Timespec { sec: 0, nsec: 1_000_000_000 }, ..reg_attr() },
        },
        Record::Map { stamp: st(1, 0), ino: 2, first: 0, entries: vec![] },
        Record::Map { stamp: st(1, 0), ino: 2, first: 0, entries: vec![(0, 5)] },
        Record::Map { stamp: st(1, 0), ino: 2, first: 0, entries: vec![(9, 9); MAP_RUN_MAX + 1] },
        Record::Map { stamp: st(1, 0), ino: 2, first: MAX_FILE_BLOCKS, entries: vec![(9, 9)] },
        Record::Rename {
            stamp: st(1, 0),
            src_dir: 1,
            src_name: b"a".to_vec(),
            dst_dir: 1,
            dst_name: b"b".to_vec(),
            ino: 2,
            replaced: 0,
            exchange: true,
            whiteout: None,
        },
        // A whiteout with an exchange, of the wrong type, or naming an inode the rename moves.
        Record::Rename {
            stamp: st(1, 0),
            src_dir: 1,
            src_name: b"a".to_vec(),
            dst_dir: 1,
            dst_name: b"b".to_vec(),
            ino: 2,
            replaced: 3,
            exchange: true,
            whiteout: Some(Whiteout { ino: 4, attr: InodeAttr { mode: WHITEOUT_TYPE, ..reg_attr() } }),
        },
        Record::Rename {
            stamp: st(1, 0),
            src_dir: 1,
            src_name: b"a".to_vec(),
            dst_dir: 1,
            dst_name: b"b".to_vec(),
            ino: 2,
            replaced: 0,
            exchange: false,
            whiteout: Some(Whiteout { ino: 4, attr: reg_attr() }),
        },
        Record::Rename {
            stamp: st(1, 0),
            src_dir: 1,
            src_name: b"a".to_vec(),
            dst_dir: 1,
            dst_name: b"b".to_vec(),
            ino: 2,
            replaced: 0,
            exchange: false,
            whiteout: Some(Whiteout { ino: 2, attr: InodeAttr { mode: WHITEOUT_TYPE, ..reg_attr() } }),
        },
        Record::Xattrs {
            stamp: st(1, 0),
            ino: 2,
            attrs: vec![(b"u".to_vec(), vec![]), (b"u".to_vec(), vec![1])],
        },
        Record::Xattrs { stamp: st(1, 0), ino: 2, attrs: vec![(b"u".to_vec(), vec![0; 5000])] },
        Record::SetXattr { stamp: st(1, 0), ino: 2, name: vec![], value: vec![1] },
        Record::SetXattr { stamp: st(1, 0), ino: 2, name: vec![b'u'; 256], value: vec![] },
        Record::SetXattr { stamp: st(1, 0), ino: 2, name: b"u".to_vec(), value: vec![0; 65537] },
        Record::SetXattr { stamp: st(1, 0), ino: 0, name: b"u".to_vec(), value: vec![] },
        Record::RemoveXattr { stamp: st(1, 0), ino: 2, name: vec![] },
        Record::Free { stamp: st(1, 0), ino: 0 },
    ];
    for r in bad {
        let e = Transaction::new(vec![r.clone()]).encode().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{r:?}: {e}");
    }
}

#[test]
fn huge_count_under_a_valid_checksum_is_rejected_before_allocating() {
    let t = Transaction::new(vec![Record::Free { stamp: st(1, 0), ino: 3 }]);
    let mut bytes = t.encode().unwrap();
    bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = Transaction::decode(&bytes).unwrap_err();
    assert!(e.to_string().contains("cannot fit"), "{e}");
}

#[test]
fn data_refs_list_written_blocks_only() {
    let t = Transaction::new(vec![
        Record::Map {
            stamp: st(1, 0),
            ino: 5,
            first: 0,
            entries: vec![(100, 11), (0, 0), (NEW_ADDR, 0), (101, 12)],
        },
        Record::Truncate { stamp: st(2, 0), ino: 5, from_block: 9 },
        Record::Map { stamp: st(3, 0), ino: 6, first: 40, entries: vec![(200, 13)] },
    ]);
    assert_eq!(t.data_refs(), vec![(100, 11), (101, 12), (200, 13)]);
    assert!(Transaction::default().data_refs().is_empty());
}

#[test]
fn geometry_check_rejects_addresses_and_ids_outside_the_image() {
    let g = geo();
    let inside = g.main_blkaddr as u32;
    let ok = Transaction::new(vec![Record::Map {
        stamp: st(1, 0),
        ino: 5,
        first: 0,
        entries: vec![(inside, 1), (0, 0), (NEW_ADDR, 0)],
    }]);
    ok.validate_geometry(&g).unwrap();
    let outside =
        Transaction::new(vec![Record::Map { stamp: st(1, 0), ino: 5, first: 0, entries: vec![(3, 1)] }]);
    assert!(outside.validate_geometry(&g).is_err());
    let big_nid = Transaction::new(vec![Record::Free { stamp: st(1, 0), ino: g.max_nid + 1 }]);
    assert!(big_nid.validate_geometry(&g).is_err());
}
