//! Round trips for every on-disk structure, and a property test that any corruption (a flipped
//! byte, a wrong magic, a truncated buffer, random garbage) yields an error and never a panic.

use super::checkpoint::CP_PAYLOAD_MAGIC;
use super::dentry::DT_VALID;
use super::layout::{NAT_ENTRIES_PER_BLOCK, SIT_ENTRIES_PER_BLOCK};
use super::node::INODE_ADDRS as INODE_ADDRS_CHECK;
use super::node::{ADDRS_PER_NODE, INODE_NIDS, NEW_ADDR};
use super::*;
use crate::error::Error;
use proptest::prelude::*;

fn geo() -> Geometry {
    Geometry::compute(1 << 18, 2).unwrap()
}

fn main_addr() -> impl Strategy<Value = u32> {
    let g = geo();
    prop_oneof![
        Just(0u32),
        Just(NEW_ADDR),
        (g.main_blkaddr..g.main_blkaddr + g.main_blocks()).prop_map(|a| a as u32)
    ]
}

fn nid() -> impl Strategy<Value = u32> {
    1..=geo().max_nid
}

fn timespec() -> impl Strategy<Value = Timespec> {
    (any::<i64>(), 0u32..1_000_000_000).prop_map(|(sec, nsec)| Timespec { sec, nsec })
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(1u8..=255, 1..=255)
        .prop_filter("valid name", |n| dentry::validate_name(n).is_ok())
}

fn footer(kind: u8) -> impl Strategy<Value = NodeFooter> {
    let g = geo();
    (
        nid(),
        nid(),
        1u32..100_000,
        any::<u16>(),
        any::<u64>(),
        prop_oneof![Just(0u32), main_addr().prop_filter("not new", |&a| a != NEW_ADDR)],
        0..g.lanes as u16,
        any::<u64>(),
    )
        .prop_map(move |(nid, ino, ofs, flags, cp_ver, next, lane, seq)| NodeFooter {
            nid: if kind == 1 { ino } else { nid },
            ino,
            node_ofs: if kind == 1 { 0 } else { ofs },
            flags,
            cp_ver,
            next_blkaddr: next,
            lane,
            seq,
        })
}

fn inode() -> impl Strategy<Value = Inode> {
    (
        (
            prop::sample::select(vec![
                0o100644u32,
                0o040755,
                0o120777,
                0o020600,
                0o060600,
                0o010644,
                0o140755,
            ]),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
        ),
        (timespec(), timespec(), timespec(), timespec()),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            0..=geo().max_nid,
            0..=geo().max_nid,
            prop::option::of(name()),
        ),
        (
            proptest::collection::vec(0..=geo().max_nid, INODE_NIDS),
            proptest::collection::vec(main_addr(), INODE_ADDRS_CHECK),
        ),
    )
        .prop_map(
            |(
                (mode, uid, gid, nlink, size, blocks),
                (atime, mtime, ctime, crtime),
                (rdev, generation, flags, xattr_nid, parent, name),
                (nids, addrs),
            )| Inode {
                mode,
                uid,
                gid,
                nlink,
                size,
                blocks,
                atime,
                mtime,
                ctime,
                crtime,
                rdev,
                generation,
                flags,
                xattr_nid,
                parent,
                name: name.unwrap_or_default(),
                nids: nids.try_into().unwrap(),
                addrs,
            },
        )
}

fn node() -> impl Strategy<Value = Node> {
    prop_oneof![
        (footer(1), inode()).prop_map(|(footer, i)| Node { footer, body: NodeBody::Inode(Box::new(i)) }),
        (footer(2), proptest::collection::vec(main_addr(), ADDRS_PER_NODE))
            .prop_map(|(footer, v)| Node { footer, body: NodeBody::Direct(v) }),
        (footer(3), proptest::collection::vec(0..=geo().max_nid, ADDRS_PER_NODE))
            .prop_map(|(footer, v)| Node { footer, body: NodeBody::Indirect(v) }),
        (footer(4), xattr_node()).prop_map(|(footer, x)| Node { footer, body: NodeBody::Xattr(x) }),
    ]
}

/// A set of distinct names (inline in a node, or as a stream: in name order).
fn xattr_set(max: usize, value: usize) -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    proptest::collection::btree_map(
        proptest::collection::vec(any::<u8>(), 1..=40),
        proptest::collection::vec(any::<u8>(), 0..=value),
        0..=max,
    )
    .prop_map(|m| m.into_iter().collect())
}

fn xattr_node() -> impl Strategy<Value = XattrNode> {
    let g = geo();
    let blocks = (1usize..=xattr::MAX_XATTR_BLOCKS).prop_flat_map(move |n| {
        let len = (n - 1) * xattr::XATTR_PAYLOAD + 1..=n * xattr::XATTR_PAYLOAD;
        let first = g.main_blkaddr as u32..(g.main_blkaddr + g.main_blocks()) as u32 - n as u32;
        (len, first, any::<u32>()).prop_map(move |(len, first, crc)| XattrNode::Blocks {
            stream_len: len as u32,
            stream_crc: crc,
            // Distinct, in the main area, not in order.
            addrs: (0..n as u32).rev().map(|i| first + i).collect(),
        })
    });
    prop_oneof![xattr_set(12, 200).prop_map(XattrNode::Inline), blocks]
}

fn checkpoint() -> impl Strategy<Value = Checkpoint> {
    let g = geo();
    let cursor = (0..g.main_segments, 0u16..=512)
        .prop_map(|(segno, next_off)| LogCursor { segno: SegNo(segno), next_off });
    let lane = (
        proptest::collection::vec(cursor, 6),
        prop_oneof![Just(0u32), main_addr().prop_filter("real", |&a| a != 0 && a != NEW_ADDR)],
        any::<u64>(),
    )
        .prop_map(|(logs, journal_head, journal_seq)| LaneCheckpoint {
            logs: logs.try_into().unwrap(),
            journal_head,
            journal_seq,
        });
    (
        (any::<u64>(), any::<u32>(), any::<u64>(), 0..=g.main_blocks()),
        (0..=g.max_nid, any::<u64>(), any::<u64>(), any::<u64>()),
        proptest::collection::vec((0..g.nat_blocks, 0u8..2), 0..50),
        proptest::collection::vec((0..g.sit_blocks, 0u8..2), 0..20),
        proptest::collection::vec(lane, g.lanes as usize),
        proptest::collection::vec(1..=g.max_nid, 0..300),
    )
        .prop_map(
            move |(
                (version, flags, elapsed_secs, valid_blocks),
                (next_nid, u, gc, cp),
                nat,
                sit,
                lanes,
                orphans,
            )| {
                let mut nat_map = CopyMap::new(g.nat_blocks);
                for (i, c) in nat {
                    nat_map.set(i, c);
                }
                let mut sit_map = CopyMap::new(g.sit_blocks);
                for (i, c) in sit {
                    sit_map.set(i, c);
                }
                Checkpoint {
                    version,
                    flags,
                    elapsed_secs,
                    valid_blocks,
                    valid_nodes: valid_blocks / 2,
                    valid_inodes: valid_blocks / 4,
                    next_nid,
                    user_bytes_written: u,
                    gc_bytes_written: gc,
                    cp_bytes_written: cp,
                    stamp: u.rotate_left(7),
                    reserved_blocks: gc % (g.main_blocks() + 1),
                    next_generation: gc.rotate_left(13),
                    nat_map,
                    sit_map,
                    lanes,
                    orphans,
                }
            },
        )
}

fn nat_block() -> impl Strategy<Value = NatBlock> {
    let entry = prop_oneof![
        Just(NatEntry::default()),
        (main_addr().prop_filter("real", |&a| a != 0 && a != NEW_ADDR), nid())
            .prop_map(|(block_addr, ino)| NatEntry { block_addr, ino })
    ];
    proptest::collection::vec(entry, NAT_ENTRIES_PER_BLOCK as usize).prop_map(|mut entries| {
        entries[0] = NatEntry::default(); // nid 0 never exists
        NatBlock { index: 0, entries }
    })
}

fn sit_block() -> impl Strategy<Value = SitBlock> {
    let entry =
        (prop_oneof![Just(sit::NO_LOG), 0u8..6], any::<u64>(), proptest::collection::vec(any::<u8>(), 64))
            .prop_map(|(log_type, mtime, bm)| {
                let bitmap: [u8; 64] = bm.try_into().unwrap();
                let valid_blocks = bitmap.iter().map(|b| b.count_ones()).sum::<u32>() as u16;
                SitEntry { valid_blocks, log_type, mtime, bitmap }
            });
    (0..geo().sit_blocks, proptest::collection::vec(entry, SIT_ENTRIES_PER_BLOCK as usize))
        .prop_map(|(index, entries)| SitBlock { index, entries })
}

fn summary() -> impl Strategy<Value = SegmentSummary> {
    let entry = prop_oneof![
        Just(SummaryEntry::default()),
        (
            nid(),
            any::<u32>(),
            prop::sample::select(vec![
                SummaryKind::Data,
                SummaryKind::Node,
                SummaryKind::Journal,
                SummaryKind::Xattr
            ])
        )
            .prop_map(|(nid, ofs, kind)| SummaryEntry { kind, nid, ofs })
    ];
    (0..geo().main_segments, proptest::collection::vec(entry, BLOCKS_PER_SEG as usize))
        .prop_map(|(segno, entries)| SegmentSummary { segno: SegNo(segno), entries })
}

fn dentries() -> impl Strategy<Value = DentryBlock> {
    let d = (nid(), prop::sample::select(DT_VALID.to_vec()), name())
        .prop_map(|(ino, file_type, name)| Dentry { ino, file_type, name });
    (nid(), proptest::collection::vec(d, 0..60)).prop_map(|(dir, es)| {
        DentryBlock::pack(dir, es).into_iter().next().unwrap_or(DentryBlock { dir_ino: dir, entries: vec![] })
    })
}

fn journal() -> impl Strategy<Value = JournalBlock> {
    (
        0..geo().lanes as u16,
        any::<u16>(),
        any::<u64>(),
        any::<u64>(),
        prop_oneof![Just(0u32), main_addr().prop_filter("real", |&a| a != 0 && a != NEW_ADDR)],
        proptest::collection::vec(any::<u8>(), 0..journal::JOURNAL_PAYLOAD),
        any::<u64>(),
    )
        .prop_map(|(lane, flags, cp_ver, seq, next_blkaddr, payload, through)| JournalBlock {
            lane,
            flags,
            cp_ver,
            seq,
            next_blkaddr,
            // Unknown, or any seq from 0 to the block's own (the range a decode accepts).
            flushed_back: JournalBlock::back_for(seq, through % seq.saturating_add(1).max(1)),
            payload,
        })
}

/// An encoded structure and a decoder for it.
type Decoder = Box<dyn Fn(&[u8]) -> crate::Result<()>>;

fn any_encoded() -> impl Strategy<Value = (&'static str, Vec<u8>, usize)> {
    let g = geo();
    prop_oneof![
        Just(("superblock", Superblock::new(g, [7; 16], 99).encode(), BLOCK_SIZE)),
        checkpoint().prop_map(move |c| {
            let bytes = c.encode(&g).unwrap();
            ("checkpoint", bytes, 0)
        }),
        nat_block().prop_map(|n| ("nat", n.encode(), BLOCK_SIZE)),
        sit_block().prop_map(|s| ("sit", s.encode(), BLOCK_SIZE)),
        summary().prop_map(|s| ("ssa", s.encode(), 2 * BLOCK_SIZE)),
        node().prop_map(|n| ("node", n.encode().unwrap(), BLOCK_SIZE)),
        dentries().prop_map(|d| ("dentry", d.encode().unwrap(), BLOCK_SIZE)),
        journal().prop_map(|j| ("journal", j.encode(), BLOCK_SIZE)),
        (nid(), 0u32..1000, proptest::collection::vec(any::<u8>(), 0..=xattr::XATTR_PAYLOAD))
            .prop_map(|(ino, i, p)| ("xattr", xattr::encode_block(ino, i, &p), BLOCK_SIZE)),
    ]
}

/// Decodes `bytes` as the structure named `what`, with the identity its encoder used.
fn decoder(what: &str, orig: &[u8]) -> Decoder {
    let g = geo();
    let hdr_a = u32::from_le_bytes(orig[8..12].try_into().unwrap());
    match what {
        "superblock" => Box::new(|b| Superblock::decode(b, Some(0)).map(|_| ())),
        "checkpoint" => Box::new(move |b| Checkpoint::decode(b, &g, g.cp_blkaddr).map(|_| ())),
        "nat" => Box::new(move |b| NatBlock::decode(b, 0, &g, None).map(|_| ())),
        "sit" => Box::new(move |b| SitBlock::decode(b, hdr_a, None).map(|_| ())),
        "ssa" => Box::new(move |b| SegmentSummary::decode(b, SegNo(hdr_a), g.max_nid, None).map(|_| ())),
        "node" => Box::new(move |b| Node::decode(b, &g, None).map(|_| ())),
        "dentry" => Box::new(move |b| DentryBlock::decode(b, hdr_a, g.max_nid, None).map(|_| ())),
        "journal" => Box::new(move |b| JournalBlock::decode(b, &g, None).map(|_| ())),
        "xattr" => {
            let index = u32::from_le_bytes(orig[12..16].try_into().unwrap());
            Box::new(move |b| xattr::decode_block(b, hdr_a, index, None).map(|_| ()))
        }
        _ => unreachable!(),
    }
}

/// Byte ranges of an encoded structure that its decoder reads (a checkpoint pack's unused
/// payload blocks are not part of it).
fn covered_len(what: &str, bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let whole: std::ops::Range<usize> = 0..bytes.len();
    if what != "checkpoint" {
        return std::iter::once(whole).collect();
    }
    let mut ranges = vec![0..BLOCK_SIZE, bytes.len() - BLOCK_SIZE..bytes.len()];
    for (i, blk) in bytes.chunks(BLOCK_SIZE).enumerate().skip(1) {
        if blk[..4] == CP_PAYLOAD_MAGIC.to_le_bytes() {
            ranges.push(i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE);
        }
    }
    ranges
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn node_round_trip(n in node()) {
        prop_assert_eq!(Node::decode(&n.encode().unwrap(), &geo(), None).unwrap(), n);
    }

    #[test]
    fn checkpoint_round_trip(c in checkpoint()) {
        let g = geo();
        prop_assert_eq!(Checkpoint::decode(&c.encode(&g).unwrap(), &g, g.cp_blkaddr).unwrap(), c);
    }

    #[test]
    fn nat_sit_ssa_dentry_journal_round_trip(n in nat_block(), s in sit_block(), m in summary(), d in dentries(), j in journal()) {
        let g = geo();
        prop_assert_eq!(NatBlock::decode(&n.encode(), 0, &g, None).unwrap(), n);
        prop_assert_eq!(SitBlock::decode(&s.encode(), s.index, None).unwrap(), s.clone());
        prop_assert_eq!(SegmentSummary::decode(&m.encode(), m.segno, g.max_nid, None).unwrap(), m.clone());
        prop_assert_eq!(DentryBlock::decode(&d.encode().unwrap(), d.dir_ino, g.max_nid, None).unwrap(), d.clone());
        prop_assert_eq!(JournalBlock::decode(&j.encode(), &g, None).unwrap(), j);
    }

    #[test]
    fn xattr_stream_round_trip(set in xattr_set(60, 3000), cut in any::<prop::sample::Index>(), xor in 1u8..=255) {
        let stream = xattr::encode_stream(set.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        prop_assert_eq!(xattr::decode_stream(&stream, None).unwrap(), set.clone());
        // Cut into blocks and joined again, checked against the node's length and crc.
        let crc = crc32c::crc32c(&stream);
        let blocks: Vec<Vec<u8>> = stream
            .chunks(xattr::XATTR_PAYLOAD)
            .enumerate()
            .map(|(i, p)| xattr::encode_block(7, i as u32, p))
            .collect();
        let payloads: Vec<&[u8]> =
            blocks.iter().enumerate().map(|(i, b)| xattr::decode_block(b, 7, i as u32, None).unwrap()).collect();
        let joined = xattr::join_stream(payloads.iter().copied(), stream.len() as u32, crc, None).unwrap();
        prop_assert_eq!(&joined, &stream);
        prop_assert!(xattr::join_stream(payloads.iter().copied(), stream.len() as u32, crc ^ 1, None).is_err());
        // A shortened stream, or a changed length field, never decodes to a set.
        let len = cut.index(stream.len());
        prop_assert!(xattr::decode_stream(&stream[..len], None).is_err());
        if stream.len() > 8 {
            let mut bad = stream.clone();
            bad[4] ^= xor;
            prop_assert!(xattr::decode_stream(&bad, None).map(|d| d != set).unwrap_or(true));
        }
    }

    /// Any single flipped byte in any structure is an error.
    #[test]
    fn flipped_byte_is_rejected((what, bytes, _) in any_encoded(), pick in any::<prop::sample::Index>(), xor in 1u8..=255) {
        let dec = decoder(what, &bytes);
        prop_assert!(dec(&bytes).is_ok(), "{} must decode before corruption", what);
        let ranges = covered_len(what, &bytes);
        let total: usize = ranges.iter().map(|r| r.len()).sum();
        let mut k = pick.index(total);
        let mut pos = 0;
        for r in &ranges {
            if k < r.len() { pos = r.start + k; break; }
            k -= r.len();
        }
        let mut bad = bytes.clone();
        bad[pos] ^= xor;
        prop_assert!(dec(&bad).is_err(), "{} accepted a flipped byte at {}", what, pos);
    }

    /// Truncated buffers and random bytes are errors, never panics.
    #[test]
    fn truncated_and_garbage_are_rejected((what, bytes, _) in any_encoded(), cut in any::<prop::sample::Index>(), garbage in proptest::collection::vec(any::<u8>(), BLOCK_SIZE)) {
        let dec = decoder(what, &bytes);
        let len = cut.index(bytes.len());
        prop_assert!(dec(&bytes[..len]).is_err());
        let mut g2 = garbage.clone();
        g2.resize(bytes.len(), 0);
        prop_assert!(dec(&g2).is_err());
    }
}

#[test]
fn wrong_magic_names_the_structure() {
    let g = geo();
    let mut nat = NatBlock::empty(0).encode();
    nat[0] ^= 0xFF;
    let e = NatBlock::decode(&nat, 0, &g, Some(1234)).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }));
    assert!(e.to_string().contains("NAT block at block 1234"), "{e}");
    assert!(e.to_string().contains("bad magic"), "{e}");
    let mut sb = Superblock::new(g, [1; 16], 5).encode();
    sb[0] = b'X';
    assert!(matches!(Superblock::decode(&sb, Some(0)), Err(Error::NotLanefs(_))));
}

#[test]
fn superblock_round_trip_and_geometry_cross_check() {
    let g = geo();
    let sb = Superblock::new(g, *b"0123456789abcdef", 1_700_000_000);
    let dec = Superblock::decode(&sb.encode(), Some(0)).unwrap();
    assert_eq!(dec, sb);
    assert_eq!(dec.uuid_str(), "30313233-3435-3637-3839-616263646566");
    // A stored area that disagrees with the recomputed geometry is refused even with a valid crc.
    let mut bad = sb.clone();
    bad.geometry.main_blkaddr += 512;
    let e = Superblock::decode(&bad.encode(), Some(0)).unwrap_err();
    assert!(e.to_string().contains("disagree"), "{e}");
}

#[test]
fn checkpoint_torn_pack_is_rejected() {
    let g = geo();
    let cp = Checkpoint {
        version: 5,
        flags: 0,
        elapsed_secs: 1,
        valid_blocks: 1,
        valid_nodes: 1,
        valid_inodes: 1,
        next_nid: 2,
        user_bytes_written: 0,
        gc_bytes_written: 0,
        cp_bytes_written: 0,
        stamp: 0,
        reserved_blocks: 0,
        next_generation: 1,
        nat_map: CopyMap::new(g.nat_blocks),
        sit_map: CopyMap::new(g.sit_blocks),
        lanes: vec![
            LaneCheckpoint {
                logs: [LogCursor { segno: SegNo(0), next_off: 0 }; 6],
                journal_head: 0,
                journal_seq: 0
            };
            g.lanes as usize
        ],
        orphans: vec![],
    };
    let v5 = cp.encode(&g).unwrap();
    let v6 = Checkpoint { version: 6, ..cp }.encode(&g).unwrap();
    // New header with the old footer: a checkpoint torn by a crash.
    let mut torn = v5.clone();
    torn[..BLOCK_SIZE].copy_from_slice(&v6[..BLOCK_SIZE]);
    let e = Checkpoint::decode(&torn, &g, g.cp_blkaddr).unwrap_err();
    assert!(e.to_string().contains("checkpoint"), "{e}");
    // New header and footer with an old payload block.
    let mut torn = v6.clone();
    torn[BLOCK_SIZE..2 * BLOCK_SIZE].copy_from_slice(&v5[BLOCK_SIZE..2 * BLOCK_SIZE]);
    assert!(Checkpoint::decode(&torn, &g, g.cp_blkaddr).is_err());
}

#[test]
fn copy_map_alternates() {
    let mut m = CopyMap::new(9);
    assert_eq!(m.get(8), None);
    assert_eq!(m.next_copy(8), 0);
    m.set(8, 0);
    assert_eq!(m.get(8), Some(0));
    assert_eq!(m.next_copy(8), 1);
    m.set(8, 1);
    assert_eq!(m.get(8), Some(1));
    assert_eq!(m.get(7), None);
}

#[test]
fn dentry_pack_splits_across_blocks() {
    let es: Vec<Dentry> = (0..500)
        .map(|i| Dentry {
            ino: i + 1,
            file_type: 8,
            name: format!("file-with-a-long-name-{i:05}").into_bytes(),
        })
        .collect();
    let blocks = DentryBlock::pack(1, es.clone());
    assert!(blocks.len() > 1);
    let back: Vec<Dentry> = blocks
        .iter()
        .flat_map(|b| DentryBlock::decode(&b.encode().unwrap(), 1, geo().max_nid, None).unwrap().entries)
        .collect();
    assert_eq!(back, es);
}
