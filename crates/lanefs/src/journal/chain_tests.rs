//! Chain tests: chains written through [`ChainWriter`] into a real [`MemDevice`] and read back
//! after cuts, stale blocks, torn transactions and loops; flushed-through marks; and the
//! cross-lane merge.
//!
//! Each test reads back through `read_chain`, the walk recovery uses, so what passes here is
//! what a mount keeps.

use super::chain::{merge_by_stamp, read_chain, ChainPos, ChainRead, ChainWriter, FRAGMENT_CAPACITY};
use super::record::*;
use super::record_tests::{reseal, st};
use crate::device::{BlockDevice, MemDevice, WriteReq};
use crate::error::Error;
use crate::format::journal::{JournalBlock, TXN_END, TXN_START};
use crate::format::layout::{Geometry, BLOCK_SIZE};

const LANE: u16 = 1;
const NONCE: u64 = 0x5EED_1234_ABCD_0001;

pub(super) fn geo() -> Geometry {
    Geometry::compute(Geometry::min_size_bytes(2) / BLOCK_SIZE as u64, 2).unwrap()
}

fn setup() -> (MemDevice, Geometry) {
    let g = geo();
    (MemDevice::new(g.total_blocks * BLOCK_SIZE as u64), g)
}

/// Hands out consecutive main-area addresses, as a lane's log would.
struct Counter(u32);

impl Counter {
    fn reserve(&mut self) -> crate::Result<u32> {
        self.0 += 1;
        Ok(self.0)
    }
}

const CREATE_MIN: usize = 110;
const CREATE_MAX: usize = CREATE_MIN + 254 + (MAX_SYMLINK_LEN - 1);

/// A symlink `Create` of exactly `len` encoded bytes (CREATE_MIN..=CREATE_MAX).
fn create_of_len(len: usize, ticks: u64) -> Record {
    let extra = len - CREATE_MIN;
    let name_extra = extra.min(254);
    Record::Create {
        stamp: st(ticks, 0),
        dir: 1,
        name: vec![b'n'; 1 + name_extra],
        ino: 2 + ticks as u32,
        attr: InodeAttr { mode: 0o120777, size: ticks, ..InodeAttr::default() },
        symlink: vec![(ticks % 251) as u8 + 1; 1 + extra - name_extra],
    }
}

/// A transaction of exactly `len` encoded bytes whose contents depend on `ticks`.
fn txn_of_len(len: usize, ticks: u64) -> Transaction {
    if len < TXN_HEADER_LEN + CREATE_MIN {
        let t = Transaction::new(vec![Record::Free { stamp: st(ticks, 0), ino: 2 + ticks as u32 }]);
        assert!(t.encoded_len() <= len.max(TXN_HEADER_LEN + 17));
        return t;
    }
    let mut left = len - TXN_HEADER_LEN;
    let mut recs = Vec::new();
    while left > CREATE_MAX {
        let take = CREATE_MAX.min(left - CREATE_MIN);
        recs.push(create_of_len(take, ticks));
        left -= take;
    }
    recs.push(create_of_len(left, ticks));
    let t = Transaction::new(recs);
    assert_eq!(t.encoded_len(), len);
    t
}

/// Transactions from tiny to exactly three blocks, with each boundary case.
fn sample_txns() -> Vec<Transaction> {
    let fc = FRAGMENT_CAPACITY;
    [1, 200, fc, fc + 1, 2 * fc, 2 * fc + 1, 3 * fc, 500, 2 * fc + 7]
        .iter()
        .enumerate()
        .map(|(i, &len)| txn_of_len(len, 10 + i as u64))
        .collect()
}

fn blocks_of(t: &Transaction) -> usize {
    t.encoded_len().div_ceil(FRAGMENT_CAPACITY)
}

/// What one append produced.
struct Appended {
    start: ChainPos,
    blocks: Vec<(u64, Vec<u8>)>,
}

fn write_all(dev: &MemDevice, blocks: &[(u64, Vec<u8>)]) {
    let reqs: Vec<WriteReq> = blocks.iter().map(|(a, d)| WriteReq { addr: *a, data: d }).collect();
    dev.write_batch(&reqs).unwrap();
    dev.flush().unwrap();
}

fn append_all(dev: &MemDevice, w: &mut ChainWriter, c: &mut Counter, txns: &[Transaction]) -> Vec<Appended> {
    txns.iter()
        .map(|t| {
            let start = w.pos();
            let blocks = w.append(t, || c.reserve()).unwrap();
            assert_eq!(blocks.len(), blocks_of(t));
            write_all(dev, &blocks);
            Appended { start, blocks }
        })
        .collect()
}

fn read(dev: &MemDevice, g: &Geometry, head: (u32, u64)) -> ChainRead {
    read_chain(dev, g, LANE, NONCE, head.0, head.1, g.main_blocks()).unwrap()
}

/// A chain of `sample_txns` written at the start of the main area, head seq 1000.
struct Written {
    dev: MemDevice,
    g: Geometry,
    head: (u32, u64),
    w: ChainWriter,
    c: Counter,
    txns: Vec<Transaction>,
    app: Vec<Appended>,
}

fn written_chain() -> Written {
    let (dev, g) = setup();
    let head = (g.main_blkaddr as u32, 1000);
    let mut w = ChainWriter::new(LANE, NONCE, head.0, head.1);
    let mut c = Counter(head.0);
    let txns = sample_txns();
    let app = append_all(&dev, &mut w, &mut c, &txns);
    Written { dev, g, head, w, c, txns, app }
}

fn zero_block(dev: &MemDevice, addr: u64) {
    dev.write_block(addr, &vec![0u8; BLOCK_SIZE]).unwrap();
}

#[test]
fn chain_round_trip() {
    let Written { dev, g, head, w, txns, app, .. } = written_chain();
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, txns);
    assert_eq!((r.end_addr, r.end_seq), w.position());
    assert_eq!(r.end(), w.pos());
    let all: Vec<u64> = app.iter().flat_map(|a| a.blocks.iter().map(|b| b.0)).collect();
    assert_eq!(r.blocks, all);
    assert_eq!(r.starts, app.iter().map(|a| a.start).collect::<Vec<_>>());
    // Lengths 1..=3 blocks all occurred, with START/END on the right blocks.
    let sizes: Vec<usize> = txns.iter().map(blocks_of).collect();
    assert_eq!(sizes, vec![1, 1, 1, 2, 2, 3, 3, 1, 3]);
    for a in &app {
        let n = a.blocks.len();
        for (i, (addr, b)) in a.blocks.iter().enumerate() {
            let jb = JournalBlock::decode(b, &g, Some(*addr)).unwrap();
            assert_eq!(jb.flags & TXN_START != 0, i == 0);
            assert_eq!(jb.flags & TXN_END != 0, i + 1 == n);
            assert_eq!((jb.lane, jb.cp_ver), (LANE, NONCE));
        }
    }
    assert_eq!(w.position().1, 1000 + all.len() as u64);
    // Another lane's or another image's reader finds nothing and stays at the head.
    for (lane, nonce) in [(0, NONCE), (LANE, NONCE + 1)] {
        let other = read_chain(&dev, &g, lane, nonce, head.0, head.1, g.main_blocks()).unwrap();
        assert!(other.transactions.is_empty() && other.blocks.is_empty());
        assert_eq!(other.end(), ChainPos { addr: head.0, seq: head.1, link: 0 });
    }
}

#[test]
fn cut_at_a_transaction_start_keeps_the_prefix() {
    let Written { dev, g, head, txns, app, .. } = written_chain();
    let k = 5;
    let at = app[k].blocks[0].0;
    zero_block(&dev, at);
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, txns[..k]);
    assert_eq!(r.end(), app[k].start);
    assert_eq!(r.end_addr as u64, at);
    assert_eq!(r.blocks.len(), app[..k].iter().map(|a| a.blocks.len()).sum::<usize>());
}

#[test]
fn cut_inside_a_transaction_drops_it_whole() {
    let Written { dev, g, head, txns, app, .. } = written_chain();
    let k = 6; // three blocks
    zero_block(&dev, app[k].blocks[1].0);
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, txns[..k]);
    assert_eq!(r.end(), app[k].start);
    // The first block of the torn transaction was valid and is reported for protection.
    assert_eq!(r.blocks.last(), Some(&app[k].blocks[0].0));
}

#[test]
fn incomplete_last_transaction_is_dropped() {
    let (dev, g) = setup();
    let head = (g.main_blkaddr as u32, 7);
    let mut w = ChainWriter::new(LANE, NONCE, head.0, head.1);
    let mut c = Counter(head.0);
    let txns = sample_txns();
    let app = append_all(&dev, &mut w, &mut c, &txns[..5]);
    // A three-block transaction whose END block never reached the disk.
    let start = w.pos();
    let blocks = w.append(&txns[6], || c.reserve()).unwrap();
    write_all(&dev, &blocks[..2]);
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, txns[..5]);
    assert_eq!(r.end(), start);
    let prefix: usize = app.iter().map(|a| a.blocks.len()).sum();
    assert_eq!(r.blocks.len(), prefix + 2);
}

#[test]
fn stale_blocks_at_the_next_address_end_the_chain() {
    let Written { dev, g, head, w, txns, .. } = written_chain();
    let (end_addr, end_seq) = w.position();
    let stale = |seq: u64, nonce: u64, lane: u16, flags: u16, link: u32| {
        let mut payload = link.to_le_bytes().to_vec();
        payload.extend_from_slice(&Transaction::default().encode().unwrap());
        JournalBlock { lane, flags, cp_ver: nonce, seq, next_blkaddr: end_addr + 1, flushed_back: 0, payload }
            .encode()
    };
    let link = w.pos().link;
    for (seq, nonce, lane, flags, link) in [
        (end_seq - 1, NONCE, LANE, TXN_START | TXN_END, link), // an earlier pass over this address
        (end_seq - 600, NONCE, LANE, TXN_START | TXN_END, link),
        (end_seq, NONCE ^ 1, LANE, TXN_START | TXN_END, link), // another image's journal
        (end_seq, NONCE, 0, TXN_START | TXN_END, link),        // another lane
        (end_seq, NONCE, LANE, TXN_END, link),                 // the tail of some other transaction
        (end_seq, NONCE, LANE, TXN_START | TXN_END | 4, link), // an unknown flag
        (end_seq, NONCE, LANE, TXN_START | TXN_END, link ^ 0x55), // written after another block
    ] {
        dev.write_block(end_addr as u64, &stale(seq, nonce, lane, flags, link)).unwrap();
        let r = read(&dev, &g, head);
        assert_eq!(r.transactions, txns, "seq {seq} nonce {nonce:#x} lane {lane} flags {flags}");
        assert_eq!(r.end(), w.pos());
    }
    // The same block with the right link is a valid continuation (the control for the above).
    dev.write_block(end_addr as u64, &stale(end_seq, NONCE, LANE, TXN_START | TXN_END, link)).unwrap();
    assert_eq!(read(&dev, &g, head).transactions.len(), txns.len() + 1);
}

/// The crash the link exists for: a batch of two transactions reaches the disk without its
/// first block; recovery ends the chain there; the next writer reuses the same addresses and
/// seqs (a deterministic allocator) and crashes before writing the second block. The stale
/// second block has the lane, nonce and seq the new chain expects, and must still be refused.
#[test]
fn stale_block_from_a_lost_batch_is_not_replayed() {
    let (dev, g) = setup();
    let head = (g.main_blkaddr as u32, 50);
    let t_old = [txn_of_len(300, 1), txn_of_len(300, 2)];
    let mut w1 = ChainWriter::new(LANE, NONCE, head.0, head.1);
    let mut c1 = Counter(head.0);
    let b1 = w1.append(&t_old[0], || c1.reserve()).unwrap();
    let b2 = w1.append(&t_old[1], || c1.reserve()).unwrap();
    write_all(&dev, &b2); // only the second transaction's block persisted
    let r = read(&dev, &g, head);
    assert!(r.transactions.is_empty());
    assert_eq!(r.end_addr as u64, b1[0].0);

    let mut w2 = ChainWriter::resume(LANE, NONCE, r.end());
    let mut c2 = Counter(head.0);
    let t_new = txn_of_len(300, 3);
    let b3 = w2.append(&t_new, || c2.reserve()).unwrap();
    assert_eq!(b3[0].0, b1[0].0);
    write_all(&dev, &b3);
    // The stale block sits exactly where the new chain continues, with the expected seq.
    assert_eq!(w2.position(), (b2[0].0 as u32, head.1 + 1));
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, vec![t_new]);
    assert_eq!(r.end(), w2.pos());
}

#[test]
fn a_loop_terminates() {
    let (dev, g) = setup();
    let head = (g.main_blkaddr as u32, 0);
    let mut w = ChainWriter::new(LANE, NONCE, head.0, head.1);
    let t = [txn_of_len(100, 1), txn_of_len(100, 2)];
    // The second block's next pointer leads back to the head.
    let mut addrs = vec![head.0, head.0 + 1].into_iter().rev();
    let mut blocks = w.append(&t[0], || Ok(addrs.next().unwrap())).unwrap();
    blocks.extend(w.append(&t[1], || Ok(addrs.next().unwrap())).unwrap());
    write_all(&dev, &blocks);
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, t);
    assert_eq!(r.blocks.len(), 2);

    // A chain whose seqs all match (so only the bound stops it): max_blocks caps the walk.
    let (dev, g) = setup();
    let mut w = ChainWriter::new(LANE, NONCE, head.0, head.1);
    let mut c = Counter(head.0);
    let many: Vec<Transaction> = (0..40).map(|i| txn_of_len(100, i)).collect();
    append_all(&dev, &mut w, &mut c, &many);
    let r = read_chain(&dev, &g, LANE, NONCE, head.0, head.1, 10).unwrap();
    assert_eq!(r.transactions, many[..10]);
    assert_eq!(r.blocks.len(), 10);
    let r = read_chain(&dev, &g, LANE, NONCE, head.0, head.1, 0).unwrap();
    assert!(r.transactions.is_empty());
}

#[test]
fn writer_continues_after_a_cut() {
    for resume in [true, false] {
        let Written { dev, g, head, mut c, txns, app, .. } = written_chain();
        let k = 4;
        zero_block(&dev, app[k].blocks[1].0);
        let r = read(&dev, &g, head);
        assert_eq!(r.transactions, txns[..k]);
        let mut w = if resume {
            ChainWriter::resume(LANE, NONCE, r.end())
        } else {
            ChainWriter::new(LANE, NONCE, r.end_addr, r.end_seq)
        };
        let more: Vec<Transaction> = [3000, 10, 9000].iter().map(|&n| txn_of_len(n, 77 + n as u64)).collect();
        append_all(&dev, &mut w, &mut c, &more);
        let r = read(&dev, &g, head);
        let mut want = txns[..k].to_vec();
        want.extend(more);
        assert_eq!(r.transactions, want, "resume {resume}");
        assert_eq!(r.end(), w.pos());
    }
}

#[test]
fn truncate_moves_the_end_to_a_dropped_transaction() {
    let Written { dev, g, head, mut c, txns, app, .. } = written_chain();
    let mut r = read(&dev, &g, head);
    r.truncate(3);
    assert_eq!(r.transactions, txns[..3]);
    assert_eq!(r.end(), app[3].start);
    let mut w = ChainWriter::resume(LANE, NONCE, r.end());
    let t = txn_of_len(5000, 99);
    append_all(&dev, &mut w, &mut c, std::slice::from_ref(&t));
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, [&txns[..3], &[t]].concat());
}

#[test]
fn a_start_inside_an_open_transaction_ends_the_chain() {
    let (dev, g) = setup();
    let head = (g.main_blkaddr as u32, 3);
    let mut w = ChainWriter::new(LANE, NONCE, head.0, head.1);
    let mut c = Counter(head.0);
    let first = txn_of_len(300, 1);
    append_all(&dev, &mut w, &mut c, std::slice::from_ref(&first));
    // A two-block transaction whose second block is replaced by a one-block transaction
    // written at exactly the right address, seq and link.
    let two = txn_of_len(FRAGMENT_CAPACITY + 10, 2);
    let start = w.pos();
    let blocks = w.append(&two, || c.reserve()).unwrap();
    write_all(&dev, &blocks[..1]);
    let jb = JournalBlock::decode(&blocks[0].1, &g, None).unwrap();
    let mut intruder = ChainWriter::resume(
        LANE,
        NONCE,
        ChainPos { addr: jb.next_blkaddr, seq: jb.seq + 1, link: link_of_block(&blocks[0].1) },
    );
    let mut c2 = Counter(head.0 + 5000);
    let b = intruder.append(&txn_of_len(200, 3), || c2.reserve()).unwrap();
    write_all(&dev, &b);
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, vec![first]);
    assert_eq!(r.end(), start);
}

fn link_of_block(b: &[u8]) -> u32 {
    match u32::from_le_bytes(b[4..8].try_into().unwrap()) {
        0 => 1,
        c => c,
    }
}

#[test]
fn sealed_blocks_with_an_undecodable_transaction_end_the_chain() {
    let Written { dev, g, head, w, txns, .. } = written_chain();
    let (addr, seq) = w.position();
    let mut payload = w.pos().link.to_le_bytes().to_vec();
    let mut bad = Transaction::new(vec![Record::Free { stamp: st(1, 0), ino: 4 }]).encode().unwrap();
    bad[TXN_HEADER_LEN + 13] = 0; // ino 0, under a correct transaction checksum
    reseal(&mut bad);
    payload.extend_from_slice(&bad);
    let jb = JournalBlock {
        lane: LANE,
        flags: TXN_START | TXN_END,
        cp_ver: NONCE,
        seq,
        next_blkaddr: addr + 1,
        flushed_back: 0,
        payload,
    };
    dev.write_block(addr as u64, &jb.encode()).unwrap();
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, txns);
    assert_eq!(r.end(), w.pos());
}

/// The flushed-through mark: each transaction appended with the seq its predecessors end at
/// proves them (`ChainRead::proven`); the highest mark any accepted block carries counts, even
/// one in a transaction the walk does not keep; chains written without marks (as before the
/// mark existed) prove nothing.
#[test]
fn flushed_through_marks_prove_the_transactions_below_them() {
    let (dev, g) = setup();
    let head = (g.main_blkaddr as u32, 500);
    let mut w = ChainWriter::new(LANE, NONCE, head.0, head.1);
    let mut c = Counter(head.0);
    let txns = sample_txns();
    let mut ends = Vec::new();
    for t in &txns[..6] {
        // Durable up to the end of the transaction before the previous one (two in flight).
        let through = ends.len().checked_sub(2).map_or(0, |i| ends[i]);
        let blocks = w.append_flushed(t, through, || c.reserve()).unwrap();
        for (addr, b) in &blocks {
            let jb = JournalBlock::decode(b, &g, Some(*addr)).unwrap();
            assert_eq!(jb.flushed_through(), (through != 0).then_some(through), "seq {}", jb.seq);
        }
        write_all(&dev, &blocks);
        ends.push(w.position().1);
    }
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions, txns[..6]);
    assert_eq!(r.flushed, ends[3]);
    assert_eq!(r.proven(), 4);
    assert!((0..6).all(|k| r.end_of(k) == ends[k]));
    // A mark past the writer's own position is clamped to it: no block claims itself durable.
    let at = w.pos();
    let blocks = w.append_flushed(&txns[6], u64::MAX, || c.reserve()).unwrap();
    let last = blocks.last().unwrap();
    assert_eq!(JournalBlock::decode(&last.1, &g, Some(last.0)).unwrap().flushed_through(), Some(at.seq));
    // Its END block lost: the transaction is dropped, its mark (read from its first block) is
    // still true and counts.
    write_all(&dev, &blocks[..blocks.len() - 1]);
    let r = read(&dev, &g, head);
    assert_eq!(r.transactions.len(), 6);
    assert_eq!((r.flushed, r.proven()), (at.seq, 6));
    // Without marks nothing is proven.
    let Written { dev, g, head, .. } = written_chain();
    let r = read(&dev, &g, head);
    assert_eq!((r.flushed, r.proven()), (0, 0));
}

#[test]
fn a_mark_reaching_before_seq_zero_does_not_decode() {
    let g = setup().1;
    let jb = |seq, flushed_back| JournalBlock {
        lane: LANE,
        flags: TXN_START | TXN_END,
        cp_ver: NONCE,
        seq,
        next_blkaddr: 0,
        flushed_back,
        payload: vec![0; 8],
    };
    assert_eq!(JournalBlock::decode(&jb(9, 10).encode(), &g, None).unwrap().flushed_through(), Some(0));
    assert_eq!(JournalBlock::decode(&jb(9, 1).encode(), &g, None).unwrap().flushed_through(), Some(9));
    assert!(JournalBlock::decode(&jb(9, 11).encode(), &g, None).is_err());
    assert_eq!(JournalBlock::back_for(9, 0), 0, "0: unknown");
    assert_eq!(JournalBlock::back_for(9, 10), 0, "past the block itself: unknown");
    assert_eq!(JournalBlock::back_for(u64::MAX, 1), 0, "too far back for the word: unknown");
}

#[test]
fn failed_reserve_leaves_the_writer_unchanged() {
    let (dev, g) = setup();
    let head = (g.main_blkaddr as u32, 0);
    let mut w = ChainWriter::new(LANE, NONCE, head.0, head.1);
    let mut c = Counter(head.0);
    let t = txn_of_len(3 * FRAGMENT_CAPACITY, 1);
    let mut calls = 0;
    let e = w
        .append(&t, || {
            calls += 1;
            if calls == 2 {
                Err(Error::NoSpace)
            } else {
                c.reserve()
            }
        })
        .unwrap_err();
    assert!(matches!(e, Error::NoSpace));
    assert_eq!(w.pos(), ChainPos { addr: head.0, seq: head.1, link: 0 });
    // Bad addresses from reserve are refused, also without a change.
    assert!(w.append(&t, || Ok(0)).is_err());
    assert!(w.append(&t, || Ok(head.0)).is_err());
    assert_eq!(w.position(), head);
    // Invalid records are refused before reserve is asked.
    let bad = Transaction::new(vec![Record::Free { stamp: st(1, 0), ino: 0 }]);
    assert!(w.append(&bad, || panic!("reserve called for an invalid transaction")).is_err());
    // The writer still works.
    append_all(&dev, &mut w, &mut c, std::slice::from_ref(&t));
    assert_eq!(read(&dev, &g, head).transactions, vec![t]);
}

#[test]
fn read_errors_are_io_and_bad_heads_are_refused() {
    let g = geo();
    // A device too small for the geometry: the first read fails.
    let small = MemDevice::new(g.main_blkaddr * BLOCK_SIZE as u64);
    let e = read_chain(&small, &g, LANE, NONCE, g.main_blkaddr as u32, 0, 10).unwrap_err();
    assert!(matches!(e, Error::Io(_)), "{e}");
    let (dev, g) = setup();
    let e = read_chain(&dev, &g, LANE, NONCE, 5, 0, 10).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

#[test]
fn merge_orders_interleaved_lanes() {
    let rec = |ticks: u64, cpu: u32, ino: u32| Record::Free { stamp: st(ticks, cpu), ino };
    let lane0 = vec![
        Transaction::new(vec![rec(1, 0, 10), rec(5, 0, 11), rec(5, 0, 12)]),
        // A later fsync may log an older operation.
        Transaction::new(vec![rec(3, 0, 13), rec(9, 0, 14)]),
    ];
    let lane1 =
        vec![Transaction::new(vec![rec(2, 1, 20), rec(5, 1, 21)]), Transaction::new(vec![rec(4, 1, 22)])];
    let lane2 = vec![Transaction::new(vec![rec(0, 2, 30), rec(5, 0, 31)])];
    let merged = merge_by_stamp(vec![lane0, lane1, lane2]);
    let order: Vec<u32> = merged
        .iter()
        .map(|r| match r {
            Record::Free { ino, .. } => *ino,
            _ => unreachable!(),
        })
        .collect();
    // Equal stamps (5, 0) keep their order: within a transaction, then lane order.
    assert_eq!(order, vec![30, 10, 20, 13, 22, 11, 12, 31, 21, 14]);
    assert!(merged.windows(2).all(|w| w[0].stamp() <= w[1].stamp()));
    assert!(merge_by_stamp(vec![]).is_empty());
}
