//! A lane's journal chain: transactions split over journal blocks linked by next pointers.
//!
//! Job: [`ChainWriter`] turns a [`Transaction`] into the journal blocks that carry it, at
//! addresses it learns one block ahead (each block names the next block's address, reserved
//! before the block is written). [`read_chain`] walks a chain from a checkpointed head and
//! returns the complete transactions it finds, and where a writer should continue.
//!
//! Block payload (inside [`JournalBlock::payload`]): `link u32 | transaction bytes`. The first
//! block of a transaction is flagged [`TXN_START`], its last [`TXN_END`].
//!
//! Validity of a block, checked in this order: it decodes (magic, crc, lane exists, next pointer
//! in the main area or 0), it belongs to this lane and carries the image's nonce, its seq is
//! exactly the one expected (one more than its predecessor's, forever), its flags are known, its
//! next pointer is in the main area, its payload holds a link and at least one byte, its link is
//! 0 or matches its predecessor, and its START flag agrees with whether a transaction is open.
//! The first invalid block is the normal end of a chain: recovery cannot tell a torn write from
//! a block that was never written, and neither is an error.
//!
//! The flushed-through mark (`JournalBlock::flushed_back`): a writer that knows its lane's chain
//! was durable (data included) below some seq when it wrote a transaction says so in each of its
//! blocks ([`ChainWriter::append_flushed`]); [`ChainRead::flushed`] is the highest such seq the
//! walk met. Any block the walk accepts was written by this chain's writer after the flush the
//! mark stands for had completed, so the mark is true whatever became of the block's own data
//! (see `recovery::walk::verified_prefix` for what recovery does with it).
//!
//! Why the link: after a crash, a batch may have reached the disk only in part, say a later
//! transaction's blocks without an earlier one's. Recovery ends the chain at the hole and the
//! next writer fills that hole with the same address and seq; a log-structured allocator may
//! then hand out the very addresses the lost batch used, where its stale blocks carry exactly
//! the seqs the new chain expects. Seq and nonce cannot tell them apart; the link can: every
//! block records the crc of the block before it, so a stale block follows only the block it was
//! written after. A link of 0 means "predecessor unknown" (the first block a writer made with
//! [`ChainWriter::new`]) and is not checked; the head block's link is never checked, because
//! the checkpoint that names the head does not record its predecessor.

use crate::device::{BlockDevice, ReadReq};
use crate::error::{Error, Result};
use crate::format::codec::CRC_OFFSET;
use crate::format::journal::{JournalBlock, JOURNAL_PAYLOAD, TXN_END, TXN_START};
use crate::format::layout::{Geometry, BLOCKS_PER_SEG, BLOCK_SIZE};

use super::record::{Record, Transaction};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the chain's own header in each block's payload (the link).
const LINK_LEN: usize = 4;
/// Transaction bytes one journal block carries.
pub const FRAGMENT_CAPACITY: usize = JOURNAL_PAYLOAD - LINK_LEN;
// A transaction's header fits in its first block, so a START block always carries one.
const _: () = assert!(FRAGMENT_CAPACITY >= super::record::TXN_HEADER_LEN, "a journal block holds a header");

/// The link value a block's successor records: the block's stored crc32c, with 0 (reserved for
/// "unknown") moved to 1.
fn link_of(encoded: &[u8]) -> u32 {
    // Only whole encoded journal blocks have a stored crc at `CRC_OFFSET`.
    debug_assert_eq!(encoded.len(), BLOCK_SIZE, "a link is taken of a whole journal block");
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&encoded[CRC_OFFSET..CRC_OFFSET + 4]);
    match u32::from_le_bytes(crc) {
        0 => 1,
        c => c,
    }
}

/// A place in a chain: where the next block goes, the seq it must carry, and the link to the
/// block before it (0 if unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainPos {
    pub addr: u32,
    pub seq: u64,
    pub link: u32,
}

/// Appends transactions to one lane's chain.
///
/// Invariant: `(next_addr, seq)` is where the next block goes; the block before it (if this
/// writer knows it) has stored crc `link`. `append` changes the state only on success.
#[derive(Debug, Clone)]
pub struct ChainWriter {
    lane: u16,
    nonce: u64,
    next_addr: u32,
    seq: u64,
    link: u32,
}

impl ChainWriter {
    /// A writer whose next block goes at `head_addr` with seq `head_seq`, as a checkpoint
    /// records them. Its first block carries link 0 (not checked); to continue a chain found
    /// by recovery prefer [`ChainWriter::resume`], which keeps stale blocks out.
    pub fn new(lane: u16, nonce: u64, head_addr: u32, head_seq: u64) -> ChainWriter {
        // Address 0 is never a main-area block: a head there would write over the superblock.
        debug_assert_ne!(head_addr, 0, "lane {lane}: a chain head is a reserved block");
        ChainWriter { lane, nonce, next_addr: head_addr, seq: head_seq, link: 0 }
    }

    /// A writer continuing at `at`, normally [`ChainRead::end`] of the chain recovery read.
    pub fn resume(lane: u16, nonce: u64, at: ChainPos) -> ChainWriter {
        debug_assert_ne!(at.addr, 0, "lane {lane}: resumed at block 0");
        // A seq of 0 is never the end of a chain that held a transaction, and a known link
        // follows a block the walk accepted.
        debug_assert!(at.link == 0 || at.seq > 0, "lane {lane}: link {} before seq 0", at.link);
        ChainWriter { lane, nonce, next_addr: at.addr, seq: at.seq, link: at.link }
    }

    /// Moves the next block to `head` (a freshly reserved block), keeping the seq: a checkpoint
    /// does this when the reserved head lies in a segment its log has left, which could be
    /// freed and reused once the checkpoint is durable. Like [`ChainWriter::new`], the first
    /// block there carries link 0.
    pub fn restart_at(&mut self, head: u32) {
        debug_assert_ne!(head, 0, "lane {}: restarted at block 0", self.lane);
        // A fresh reservation is never the block already reserved as the next one: the chain
        // would name its old head's segment again, which the move is there to leave.
        assert_ne!(head, self.next_addr, "lane {}: restarted at its own head", self.lane);
        self.next_addr = head;
        self.link = 0;
    }

    /// Address and seq of the next block: what a checkpoint records as this lane's head.
    pub fn position(&self) -> (u32, u64) {
        (self.next_addr, self.seq)
    }

    /// The full position, link included.
    pub fn pos(&self) -> ChainPos {
        ChainPos { addr: self.next_addr, seq: self.seq, link: self.link }
    }

    /// Encodes `txn` into as many journal blocks as it needs and returns them as
    /// `(address, block)` for the caller to write (with the data blocks the transaction maps,
    /// in one batch, then flush). `reserve` is called once per block for the address of the
    /// block after it. On any error (encoding, `reserve`, a reserved address that is 0 or used
    /// twice) nothing changes; addresses already reserved are the caller's to reclaim.
    #[cfg(test)]
    pub fn append(
        &mut self,
        txn: &Transaction,
        reserve: impl FnMut() -> Result<u32>,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        self.append_flushed(txn, 0, reserve)
    }

    /// [`ChainWriter::append`], with the flushed-through mark `through`: the caller knows that
    /// every block of this chain with a seq below it, and every data block their transactions
    /// map, reached stable storage (a device flush that started after their writes completed
    /// has completed). 0 says nothing; a mark past the next block's seq is clamped to it.
    pub fn append_flushed(
        &mut self,
        txn: &Transaction,
        through: u64,
        mut reserve: impl FnMut() -> Result<u32>,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        // Only a writer placed at a reserved block appends (`new`, `resume`, `restart_at`).
        debug_assert_ne!(self.next_addr, 0, "lane {}: append at block 0", self.lane);
        let through = through.min(self.seq);
        let bytes = txn.encode()?;
        // The fragment count below, and the caller's reservation, are sized by `encoded_len`.
        debug_assert_eq!(bytes.len(), txn.encoded_len(), "encode and encoded_len disagree");
        // An encoded transaction is never empty (16-byte header), so there is at least one.
        let n = bytes.len().div_ceil(FRAGMENT_CAPACITY);
        if self.seq.checked_add(n as u64).is_none() {
            return Err(Error::InvalidArgument("journal sequence number exhausted".into()));
        }
        let mut nexts = Vec::with_capacity(n);
        for _ in 0..n {
            nexts.push(reserve()?);
        }
        // A repeated address would make the chain loop back on itself and recovery would stop
        // there, losing this transaction; refuse it here where it is a clear error.
        let mut seen = nexts.clone();
        seen.push(self.next_addr);
        seen.sort_unstable();
        if seen[0] == 0 || seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::InvalidArgument("journal reserve returned 0 or a repeated address".into()));
        }

        let mut out = Vec::with_capacity(n);
        let (mut addr, mut seq, mut link) = (self.next_addr, self.seq, self.link);
        for (i, (frag, &next)) in bytes.chunks(FRAGMENT_CAPACITY).zip(&nexts).enumerate() {
            let mut flags = 0;
            if i == 0 {
                flags |= TXN_START;
            }
            if i + 1 == n {
                flags |= TXN_END;
            }
            let mut payload = Vec::with_capacity(LINK_LEN + frag.len());
            payload.extend_from_slice(&link.to_le_bytes());
            payload.extend_from_slice(frag);
            let block = JournalBlock {
                lane: self.lane,
                flags,
                cp_ver: self.nonce,
                seq,
                next_blkaddr: next,
                flushed_back: JournalBlock::back_for(seq, through),
                payload,
            }
            .encode();
            // The reader takes a block at `addr` only if its payload ends inside the block.
            debug_assert_eq!(block.len(), BLOCK_SIZE, "journal block {seq} of lane {}", self.lane);
            link = link_of(&block);
            out.push((addr as u64, block));
            addr = next;
            seq += 1;
        }
        // One block per fragment, each with the next seq: the chain the reader expects.
        debug_assert_eq!(out.len(), n);
        debug_assert_eq!(seq, self.seq + n as u64);
        // The first block goes where the checkpoint (or the previous append) said it would.
        debug_assert_eq!(out.first().map(|b| b.0), Some(self.next_addr as u64));
        self.next_addr = addr;
        self.seq = seq;
        self.link = link;
        Ok(out)
    }
}

/// What one lane's fsyncs know of its chain's durability, for the flushed-through mark: the seq
/// past the last transaction whose batch (data and journal blocks) completed, and past the last
/// one a completed device flush covers. Both only grow; they start at the seq the mount's writer
/// starts at (nothing before it is read by recovery from a checkpoint this mount writes).
///
/// Protocol: under the chain lock, after the batch of a transaction ending at `end` completed,
/// [`ChainMarks::wrote`]`(end)`; before the device flush, `upto = `[`ChainMarks::written`];
/// after that flush completed, [`ChainMarks::flushed`]`(upto)`; the next transaction is appended
/// with [`ChainMarks::durable`] as its mark. A flush that starts after a write completed makes
/// it durable, and within a lane batches complete in chain order (the chain lock is held over
/// the write, or with cooperative commit over the push into the commit queue, whose batches
/// run one at a time in queue order: `disk/commit.rs`), so every transaction ending at or
/// below `upto` was durable once the flush ended.
#[derive(Debug, Default)]
pub struct ChainMarks {
    written: AtomicU64,
    durable: AtomicU64,
}

impl ChainMarks {
    pub fn new(start_seq: u64) -> ChainMarks {
        ChainMarks { written: AtomicU64::new(start_seq), durable: AtomicU64::new(start_seq) }
    }

    /// The batch of a transaction ending (exclusive) at `end` completed.
    pub fn wrote(&self, end: u64) {
        self.written.fetch_max(end, Ordering::Release);
    }

    /// Where the written transactions end now: pass it to [`ChainMarks::flushed`] after a device
    /// flush that starts after this call completes.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// A device flush that started after [`ChainMarks::written`] returned `upto` completed.
    pub fn flushed(&self, upto: u64) {
        debug_assert!(upto <= self.written(), "flushed past what was written");
        self.durable.fetch_max(upto, Ordering::Release);
    }

    /// The chain is durable below this seq: the mark for the next transaction.
    pub fn durable(&self) -> u64 {
        let durable = self.durable.load(Ordering::Acquire);
        // `written` only grows and `flushed` never passes it; read after, it is not behind.
        debug_assert!(durable <= self.written(), "durable {durable} past what was written");
        durable
    }
}

/// What [`read_chain`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRead {
    /// Complete transactions, in chain order.
    pub transactions: Vec<Transaction>,
    /// Where each transaction's first block is (parallel to `transactions`); recovery that
    /// rejects transaction `k` (say, its data blocks did not reach the disk) continues there
    /// ([`ChainRead::truncate`]).
    pub starts: Vec<ChainPos>,
    /// Every block that passed the block checks, in chain order, including those of a dropped
    /// incomplete final transaction: recovery keeps them from being reused before the next
    /// checkpoint, so no stale block can reappear at an address the new chain reserves.
    pub blocks: Vec<u64>,
    /// Where a writer continues: the first block after the last complete transaction.
    pub end_addr: u32,
    /// The seq that block must carry.
    pub end_seq: u64,
    /// The link it must carry (0 when no transaction was found: the head's predecessor is not
    /// known).
    pub end_link: u32,
    /// The highest flushed-through mark of the blocks read (0: none): every transaction that
    /// ends at or below it was durable, data included, before the crash.
    pub flushed: u64,
}

impl ChainRead {
    /// Where a writer continues (see [`ChainWriter::resume`]).
    pub fn end(&self) -> ChainPos {
        ChainPos { addr: self.end_addr, seq: self.end_seq, link: self.end_link }
    }

    /// Seq just past transaction `k` (its last block's seq + 1).
    pub fn end_of(&self, k: usize) -> u64 {
        debug_assert!(k < self.transactions.len(), "end of transaction {k} of {}", self.transactions.len());
        let end = self.starts.get(k + 1).map_or(self.end_seq, |p| p.seq);
        // A transaction takes at least one block.
        debug_assert!(end > self.starts[k].seq, "transaction {k} ends at {end}, before it starts");
        end
    }

    /// How many leading transactions the flushed-through mark proves durable: their data needs
    /// no reading back.
    pub fn proven(&self) -> usize {
        debug_assert_eq!(self.transactions.len(), self.starts.len(), "one start per transaction");
        (0..self.transactions.len()).take_while(|&k| self.end_of(k) <= self.flushed).count()
    }

    /// Keeps only the first `keep` transactions and moves the end to the start of the first
    /// one dropped. `blocks` is left whole (the dropped blocks still need protecting).
    pub fn truncate(&mut self, keep: usize) {
        debug_assert!(keep <= self.transactions.len(), "keep {keep} of {}", self.transactions.len());
        debug_assert_eq!(self.transactions.len(), self.starts.len(), "one start per transaction");
        if keep < self.transactions.len() {
            let at = self.starts[keep];
            self.transactions.truncate(keep);
            self.starts.truncate(keep);
            self.end_addr = at.addr;
            self.end_seq = at.seq;
            self.end_link = at.link;
        }
        // The end is past the last kept transaction's first block: a writer resuming there
        // never overwrites a kept transaction.
        debug_assert!(self.starts.last().is_none_or(|p| p.seq < self.end_seq));
    }
}

/// Walks lane `lane`'s chain from `(head_addr, head_seq)`, reading at most `max_blocks` blocks,
/// and returns its complete transactions. The walk ends without error at the first invalid
/// block (see the module docs), at a transaction that does not decode or names something
/// outside the image, or after `max_blocks` (pass a bound above any real chain length, such as
/// the main area's size; a chain cut short by it is treated like any other end). Errors: I/O,
/// and a head outside the main area (`InvalidArgument`: the checkpoint decoder rejects those).
pub fn read_chain(
    dev: &dyn BlockDevice,
    g: &Geometry,
    lane: u16,
    nonce: u64,
    head_addr: u32,
    head_seq: u64,
    max_blocks: u64,
) -> Result<ChainRead> {
    if !g.in_main(head_addr as u64) {
        return Err(Error::InvalidArgument(format!("journal head {head_addr} outside the main area")));
    }
    // A lane the image does not have: `JournalBlock::decode` would reject every block.
    debug_assert!((lane as u32) < g.lanes, "lane {lane} of {}", g.lanes);
    let mut out = ChainRead {
        transactions: Vec::new(),
        starts: Vec::new(),
        blocks: Vec::new(),
        end_addr: head_addr,
        end_seq: head_seq,
        end_link: 0,
        flushed: 0,
    };
    let mut window = ReadAhead::default();
    let (mut addr, mut seq) = (head_addr, head_seq);
    // Link of the previous valid block; None at the head, whose predecessor is unknown.
    let mut prev_link: Option<u32> = None;
    // Bytes of the open transaction and where it started; None between transactions.
    let mut open: Option<(ChainPos, Vec<u8>)> = None;

    for _ in 0..max_blocks {
        debug_assert!(g.in_main(addr as u64), "chain walk at block {addr}");
        // Seqs run on from the head, one per block accepted: the walk never revisits a seq.
        debug_assert_eq!(seq, head_seq + out.blocks.len() as u64, "lane {lane}: seq off its block count");
        let buf = window.block(dev, g, addr)?;
        let Ok(jb) = JournalBlock::decode(buf, g, Some(addr as u64)) else { break };
        let Some(frag) = continues(&jb, g, (lane, nonce), seq, prev_link) else { break };
        let next_seq = seq + 1;
        let start = jb.flags & TXN_START != 0;
        match (&mut open, start) {
            (Some(_), true) | (None, false) => break,
            (None, true) => {
                let pos = ChainPos { addr, seq, link: prev_link.unwrap_or(0) };
                open = Some((pos, frag.to_vec()));
            }
            (Some((_, bytes)), false) => bytes.extend_from_slice(frag),
        }
        // An open transaction holds at most one fragment per block since its start: the bytes
        // buffered for it are bounded by the chain walked, never by a length read from disk.
        debug_assert!(
            open.as_ref().is_none_or(|(p, b)| b.len() as u64 <= (seq + 1 - p.seq) * FRAGMENT_CAPACITY as u64),
            "lane {lane}: open transaction larger than its blocks"
        );
        out.blocks.push(addr as u64);
        out.flushed = out.flushed.max(jb.flushed_through().unwrap_or(0));
        let this_link = link_of(buf);
        if jb.flags & TXN_END != 0 {
            let Some((pos, bytes)) = open.take() else { break };
            let Ok(txn) = Transaction::decode(&bytes) else { break };
            if txn.validate_geometry(g).is_err() {
                break;
            }
            out.transactions.push(txn);
            out.starts.push(pos);
            out.end_addr = jb.next_blkaddr;
            out.end_seq = next_seq;
            out.end_link = this_link;
        }
        prev_link = Some(this_link);
        addr = jb.next_blkaddr;
        seq = next_seq;
    }
    // Exactly one seq per block from the head, and the transactions in chain order.
    debug_assert!(out.blocks.len() as u64 <= max_blocks);
    debug_assert!(out.end_seq >= head_seq && out.end_seq <= head_seq.saturating_add(out.blocks.len() as u64));
    debug_assert_eq!(out.transactions.len(), out.starts.len());
    debug_assert!(out.starts.windows(2).all(|w| w[0].seq < w[1].seq));
    // Every block walked, and where a writer continues, was checked to be in the main area.
    debug_assert!(out.blocks.iter().all(|&b| g.in_main(b)), "lane {lane}: chain block outside main");
    debug_assert!(g.in_main(out.end_addr as u64), "lane {lane}: chain end {} outside main", out.end_addr);
    // A block's mark never reaches past its own seq (`JournalBlock::decode`): the transactions
    // `proven` skips all end inside the chain walked, never beyond it.
    assert!(
        out.flushed <= head_seq.saturating_add(out.blocks.len() as u64),
        "lane {lane}: flushed-through mark {} past the {} blocks from seq {head_seq}",
        out.flushed,
        out.blocks.len()
    );
    Ok(out)
}

/// The transaction bytes of `jb` if it continues the chain of `(lane, nonce)` where the block
/// with seq `seq` is expected, after a block whose link is `prev_link` (`None` at the head); `None`
/// where the chain ends (see the module docs for the checks).
fn continues<'a>(
    jb: &'a JournalBlock,
    g: &Geometry,
    (lane, nonce): (u16, u64),
    seq: u64,
    prev_link: Option<u32>,
) -> Option<&'a [u8]> {
    // `link_of` never yields 0: a predecessor's link of 0 would turn the link check off.
    debug_assert_ne!(prev_link, Some(0), "lane {lane}: predecessor link 0 at seq {seq}");
    if jb.lane != lane || jb.cp_ver != nonce || jb.seq != seq {
        return None;
    }
    seq.checked_add(1)?;
    if jb.flags & !(TXN_START | TXN_END) != 0 || !g.in_main(jb.next_blkaddr as u64) {
        return None;
    }
    if jb.payload.len() <= LINK_LEN {
        return None;
    }
    let (link_bytes, frag) = jb.payload.split_at(LINK_LEN);
    // `JournalBlock::decode` bounds the payload by JOURNAL_PAYLOAD: a fragment never holds more
    // than a writer puts in one block, so a transaction's bytes grow by at most that per block.
    debug_assert!(
        !frag.is_empty() && frag.len() <= FRAGMENT_CAPACITY,
        "lane {lane}: fragment of {}",
        frag.len()
    );
    let link = u32::from_le_bytes([link_bytes[0], link_bytes[1], link_bytes[2], link_bytes[3]]);
    if let Some(expected) = prev_link {
        if link != 0 && link != expected {
            return None;
        }
    }
    Some(frag)
}

/// Blocks a chain walk reads at once: a lane's journal blocks mostly follow one another in its
/// log, so one read of a run replaces as many single-block reads (recovery after a busy
/// fsync workload walks hundreds of thousands of them).
const READ_AHEAD_BLOCKS: u64 = 64;

/// The run of blocks a chain walk read last, and the block it is at.
#[derive(Default)]
struct ReadAhead {
    start: u64,
    buf: Vec<u8>,
}

impl ReadAhead {
    /// Block `addr` (in the main area), from the run read last or from a new run that starts
    /// at it and ends at most at its segment's end (the log fills a segment in order; past it
    /// the chain jumps anyway). Blocks read past the chain's end are simply not looked at.
    fn block(&mut self, dev: &dyn BlockDevice, g: &Geometry, addr: u32) -> Result<&[u8]> {
        let addr = addr as u64;
        let held = self.buf.len() as u64 / BLOCK_SIZE as u64;
        if addr < self.start || addr >= self.start + held {
            let (_, off) = g.seg_of(addr).ok_or_else(|| {
                Error::InvalidArgument(format!("journal block {addr} outside the main area"))
            })?;
            let n = READ_AHEAD_BLOCKS.min(BLOCKS_PER_SEG as u64 - off as u64).max(1);
            // A run never crosses its segment's end, so it never leaves the main area.
            debug_assert!(n <= READ_AHEAD_BLOCKS && off as u64 + n <= BLOCKS_PER_SEG as u64);
            self.buf.resize(n as usize * BLOCK_SIZE, 0);
            self.start = addr;
            if dev.read_batch(&mut [ReadReq { addr, buf: &mut self.buf }]).is_err() {
                // A bad block past the chain's end must not fail a recovery that never
                // needed it: the block itself alone, whose error is the chain's.
                self.buf.truncate(BLOCK_SIZE);
                dev.read_block(addr, &mut self.buf)?;
            }
        }
        let i = (addr - self.start) as usize * BLOCK_SIZE;
        debug_assert!(i + BLOCK_SIZE <= self.buf.len(), "block {addr} outside the run at {}", self.start);
        Ok(&self.buf[i..i + BLOCK_SIZE])
    }
}

/// All records of all lanes in replay order: by stamp, and for equal stamps in the order given
/// (chain order within a lane, then lane order), since the sort is stable. Each lane's records
/// are not sorted on their own (one fsync may log operations older than the previous fsync's),
/// so this is a full sort rather than a k-way merge.
pub fn merge_by_stamp(chains: Vec<Vec<Transaction>>) -> Vec<Record> {
    let count: usize = chains.iter().flatten().map(|t| t.records.len()).sum();
    let mut all: Vec<Record> = chains.into_iter().flatten().flat_map(|t| t.records).collect();
    all.sort_by_key(Record::stamp);
    // Every record once: replay neither loses nor repeats one.
    debug_assert_eq!(all.len(), count, "records merged");
    all
}
