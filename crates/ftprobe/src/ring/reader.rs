//! The consumer end of a ring ([`RingReader`], the CLI's side): drains the published
//! records, checked record by record, in whole spans or bounded pieces.

use std::fmt;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use super::layout::*;

/// The consumer end of one ring (CLI side).
pub struct RingReader<'a> {
    pub(super) prod: &'a ProducerLine,
    pub(super) tail_slot: &'a AtomicU64,
    pub(super) pid_slot: &'a AtomicU32,
    pub(super) data: &'a [AtomicU64],
    /// This reader's tail; published to `tail_slot` at the end of each `drain`.
    pub(super) tail: u64,
    pub(super) scratch: Vec<u64>,
    pub(super) corrupt_bytes: u64,
}

impl fmt::Debug for RingReader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingReader")
            .field("tid", &self.tid())
            .field("tail", &self.tail)
            .field("corrupt_bytes", &self.corrupt_bytes)
            .finish()
    }
}

impl RingReader<'_> {
    /// Thread id of the ring's owner; 0 while unclaimed (or claimed but not yet published).
    pub fn tid(&self) -> u32 {
        // Acquire: pairs with the Release store in `SharedRings::claim`.
        self.prod.tid.load(Acquire)
    }

    /// The owner's `comm` as given to `claim` (valid once `tid() != 0`).
    pub fn comm(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        // Relaxed: published by `tid`'s Release store (load `tid()` first).
        for (o, b) in out.iter_mut().zip(&self.prod.comm) {
            *o = b.load(Relaxed);
        }
        out
    }

    /// The owner's process id (valid once `tid() != 0`; 0 from an agent that did not say).
    pub fn pid(&self) -> u32 {
        // Relaxed: published by `tid`'s Release store (load `tid()` first).
        self.pid_slot.load(Relaxed)
    }

    /// Records the producer dropped because the ring was full.
    pub fn lost(&self) -> u64 {
        // Relaxed: a statistic (see `RingWriter::drop_one`).
        self.prod.lost.load(Relaxed)
    }

    /// Bytes skipped because they did not parse as records (a buggy or hostile writer): after
    /// such bytes the reader resynchronizes at the producer's `head`, which is always a record
    /// boundary. 0 with a correct writer.
    pub fn corrupt_bytes(&self) -> u64 {
        self.corrupt_bytes
    }

    /// Calls `f(rtype, payload)` for every record published so far, then frees their space.
    /// Returns the number of records.
    pub fn drain(&mut self, mut f: impl FnMut(u16, &[u64])) -> usize {
        self.drain_aux(|rtype, _aux, words| f(rtype, words))
    }

    /// [`drain`](Self::drain), also passing each record's `aux` header bits:
    /// `f(rtype, aux, payload)`.
    pub fn drain_aux(&mut self, f: impl FnMut(u16, u32, &[u64])) -> usize {
        let mut scratch = std::mem::take(&mut self.scratch);
        let n = self.drain_aux_in(&mut scratch, f);
        self.scratch = scratch;
        n
    }

    /// [`drain_aux`](Self::drain_aux) that copies the records through `scratch` (cleared
    /// first), a buffer the caller keeps from drain to drain: a reader made for one drain
    /// then does not allocate (and fault in) a buffer of the ring's size each time.
    pub fn drain_aux_in(
        &mut self,
        scratch: &mut Vec<u64>,
        f: impl FnMut(u16, u32, &[u64]),
    ) -> usize {
        self.drain_aux_in_max(scratch, u64::MAX, f)
    }

    /// [`drain_aux_in`](Self::drain_aux_in) of at most about `max_bytes` of records (whole
    /// records: it stops at the first record past that many bytes; at least one): a reader
    /// that keeps up in pieces holds a piece, not a whole ring.
    pub fn drain_aux_in_max(
        &mut self,
        scratch: &mut Vec<u64>,
        max_bytes: u64,
        mut f: impl FnMut(u16, u32, &[u64]),
    ) -> usize {
        scratch.clear();
        let mut count = 0;
        self.drain_words(scratch, max_bytes, |words| {
            let mut at = 0;
            while at < words.len() {
                let hdr = words[at];
                let len = (hdr & 0xffff) as usize;
                f(
                    (hdr >> 16) as u16,
                    (hdr >> 32) as u32,
                    &words[at + 1..at + len],
                );
                at += len;
                count += 1;
            }
        });
        count
    }

    /// Bulk form of [`drain`](Self::drain): copies every record published so far, as the ring
    /// holds them (header word `len | rtype << 16 | aux << 32`, then the payload; no padding),
    /// to the end of `buf`, checked record by record, and frees their space. Returns the
    /// number of records. What does not parse is skipped and counted in
    /// [`corrupt_bytes`](Self::corrupt_bytes).
    pub fn drain_raw(&mut self, buf: &mut Vec<u64>) -> usize {
        self.drain_raw_max(buf, u64::MAX)
    }

    /// [`drain_raw`](Self::drain_raw) of at most about `max_bytes` of records (as
    /// [`drain_aux_in_max`](Self::drain_aux_in_max)).
    pub fn drain_raw_max(&mut self, buf: &mut Vec<u64>, max_bytes: u64) -> usize {
        let mut count = 0;
        self.drain_words(buf, max_bytes, |words| {
            let mut at = 0;
            while at < words.len() {
                at += (words[at] & 0xffff) as usize;
                count += 1;
            }
        });
        count
    }

    /// Copy the published records to the end of `buf` (the words as they are in the ring,
    /// padding left out), checking each header against what was published; call `f` with
    /// the valid records (whole records only: what this call appended); then free their
    /// space.
    /// Stops after about `max_bytes` of records (at a record's start: module docs of
    /// [`drain_aux_in_max`](Self::drain_aux_in_max)); the rest stays for the next drain.
    fn drain_words(&mut self, buf: &mut Vec<u64>, max_bytes: u64, f: impl FnOnce(&[u64])) {
        let base = buf.len();
        // Acquire: pairs with the Release store in `RingWriter::commit`: the record words
        // before `head` (and the ring's `size`) are visible.
        let head = self.prod.head.load(Acquire);
        // Relaxed: published by `head` (Acquire above).
        let size = u64::from(self.prod.size.load(Relaxed));
        let avail = head.wrapping_sub(self.tail);
        if avail == 0 {
            return;
        }
        if avail > u64::MAX / 2 {
            // `head` behind the tail: the ring was freed and claimed again under this reader
            // (or the producer line was scribbled over). Nothing to read from it.
            return;
        }
        if !size.is_power_of_two() || size > self.data.len() as u64 * 8 {
            self.resync(head, avail);
            self.tail_slot.store(self.tail, Release);
            return;
        }
        if avail > size || avail % 8 != 0 {
            self.resync(head, avail);
        }
        // Copy the whole span (at most two pieces: before and after the wrap) with relaxed
        // loads, then walk the copy: what is checked is what is handed out.
        let mut t = self.tail;
        // Bytes of records taken so far, and where a drain limited by `max_bytes` stopped.
        let mut taken: u64 = 0;
        let mut stop: Option<u64> = None;
        while t != head {
            let left = head.wrapping_sub(t);
            let pos = t & (size - 1);
            let to_end = size - pos;
            let idx = (pos / 8) as usize;
            let piece = left.min(to_end);
            // A limited drain copies what it may take, plus room for one whole record past
            // it (so that it stops at a record's start, not inside one).
            let room = max_bytes
                .saturating_sub(taken)
                .saturating_add(MAX_RECORD_WORDS as u64 * 8);
            let copy = piece.min(room);
            let cut_short = copy < piece;
            let Some(words) = self.data.get(idx..idx + (copy / 8) as usize) else {
                break;
            };
            let from = buf.len();
            buf.extend(words.iter().map(|w| w.load(Relaxed)));
            // Walk this piece's records.
            let mut at = from;
            let mut end = buf.len();
            let mut skip_to_end = false;
            while at < end {
                if taken >= max_bytes {
                    stop = Some(t.wrapping_add(((at - from) * 8) as u64));
                    end = at;
                    break;
                }
                let hdr = buf[at];
                let len = (hdr & 0xffff) as usize;
                let rtype = (hdr >> 16) as u16;
                if rtype == RTYPE_PADDING {
                    // Padding runs to the end of `size`: valid only if the records go on at 0.
                    if to_end > left {
                        self.corrupt_bytes =
                            self.corrupt_bytes.wrapping_add(((end - at) * 8) as u64);
                        end = at;
                        t = head;
                        break;
                    }
                    end = at;
                    skip_to_end = true;
                    break;
                }
                if len != 0 && at + len > end && cut_short {
                    // Runs past what this limited drain copied: the next drain takes it.
                    stop = Some(t.wrapping_add(((at - from) * 8) as u64));
                    end = at;
                    break;
                }
                if len == 0 || at + len > end {
                    // Runs past what was published, or no length: skip to `head`.
                    self.corrupt_bytes = self.corrupt_bytes.wrapping_add(((end - at) * 8) as u64);
                    end = at;
                    t = head;
                    break;
                }
                at += len;
                taken += 8 * len as u64;
            }
            buf.truncate(end);
            if cut_short && stop.is_none() && !skip_to_end && t != head {
                // Every copied record taken: the rest of the piece is for the next drain.
                stop = Some(t.wrapping_add(copy));
            }
            if t == head || stop.is_some() {
                break;
            }
            t = t.wrapping_add(if skip_to_end { to_end } else { piece });
        }
        self.tail = stop.unwrap_or(head);
        f(&buf[base..]);
        // Release: our loads of the consumed words happen before the producer reuses them;
        // pairs with the Acquire load in `RingWriter::has_room`.
        self.tail_slot.store(self.tail, Release);
    }

    #[cold]
    fn resync(&mut self, head: u64, skipped: u64) {
        self.corrupt_bytes = self.corrupt_bytes.wrapping_add(skipped);
        self.tail = head;
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::test_util::{drain_all, head_of, rings, COMM};

    #[test]
    fn limited_drains_take_every_record_once_in_pieces() {
        // A ring large enough that a limited drain copies only part of what is there (it
        // copies the limit plus one largest record's room), across wraps.
        let sr = rings(1, 4 << 20);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        let (mut expected, mut got) = (Vec::new(), Vec::new());
        let mut scratch = Vec::new();
        let mut seq = 0u64;
        let mut drains = 0;
        for _ in 0..8 {
            for _ in 0..50_000 {
                let payload: Vec<u64> = (0..seq % 13).map(|k| seq * 100 + k).collect();
                let rtype = (seq % 5) as u16;
                assert!(w.write(rtype, &payload), "record {seq}");
                expected.push((rtype, payload));
                seq += 1;
            }
            // A 4 KiB limit: each drain stops at a record's start past 4 KiB.
            loop {
                let n = r.drain_aux_in_max(&mut scratch, 4096, |t, _, p| got.push((t, p.to_vec())));
                drains += 1;
                assert!(
                    scratch.len() * 8 <= 4096 + MAX_RECORD_WORDS * 8,
                    "{}",
                    scratch.len()
                );
                if n == 0 {
                    break;
                }
            }
        }
        assert_eq!(got.len(), expected.len());
        assert_eq!(got, expected);
        assert!(drains > 1000, "{drains}");
        assert_eq!((r.lost(), r.corrupt_bytes()), (0, 0));
    }

    #[test]
    fn concurrent_producer_and_reader_million() {
        const N: u64 = 1_000_000;
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        std::thread::scope(|s| {
            let producer = s.spawn(move || {
                let mut fails = 0u64;
                for n in 0..N {
                    // Lengths 2..=6 words, so padding happens often.
                    let extra = (n % 5) as usize;
                    let payload = [n; 5];
                    while !w.write(1, &payload[..=extra]) {
                        fails += 1;
                        std::hint::spin_loop();
                    }
                }
                fails
            });
            let mut next = 0u64;
            let mut bad = 0u64;
            let mut marked = 0u64;
            while next < N {
                r.drain(|t, p| {
                    if t == RTYPE_LOST {
                        // The mark of the writes that failed before this one.
                        marked += p[1];
                        return;
                    }
                    let extra = (next % 5) as usize;
                    if t != 1 || p.len() != extra + 1 || p.iter().any(|&x| x != next) {
                        bad += 1;
                    }
                    next += 1;
                });
            }
            let fails = producer.join().unwrap();
            assert_eq!(bad, 0);
            assert_eq!(next, N);
            assert_eq!(r.drain(|_, _| {}), 0);
            assert_eq!(r.lost(), fails);
            assert_eq!(marked, fails, "every drop marked");
            assert_eq!(r.corrupt_bytes(), 0);
        });
    }

    /// A writer that scribbles over the ring must not crash the reader; it resyncs at head.
    #[test]
    fn reader_survives_garbage() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        assert!(w.write(1, &[1, 2]));
        sr.data(0).unwrap()[0].store(0xffff_0000_0000_0123, Relaxed); // len 0x123 > left
        assert_eq!(drain_all(&mut r), vec![]);
        assert_eq!(r.corrupt_bytes(), 24);
        assert!(w.write(1, &[3]));
        assert_eq!(drain_all(&mut r), vec![(1, vec![3])]);
        // A head more than a ring ahead.
        w.desc().head.store(head_of(&r) + 10_000, Relaxed);
        w.desc().reserved.store(head_of(&r), Relaxed);
        assert_eq!(drain_all(&mut r), vec![]);
        assert_eq!(r.corrupt_bytes(), 24 + 10_000);
        assert!(w.write(1, &[4]));
        assert_eq!(drain_all(&mut r), vec![(1, vec![4])]);
    }

    /// The bulk drain hands out the records as the ring holds them, padding left out, and
    /// skips what does not parse.
    #[test]
    fn drain_raw_copies_whole_records() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        assert!(w.write(1, &[0; 500]));
        let mut buf = Vec::new();
        assert_eq!(r.drain_raw(&mut buf), 1);
        assert_eq!(buf.len(), 501);
        assert!(w.write3_aux(2, 5, 1, 2, 3)); // fits before the end
        assert!(w.write(3, &[4; 20])); // padding, then offset 0
        buf.clear();
        assert_eq!(r.drain_raw(&mut buf), 2);
        assert_eq!(
            buf[..4],
            [record_header_aux(4, 2, 5), 1, 2, 3],
            "first record"
        );
        assert_eq!(buf[4], record_header(21, 3));
        assert_eq!(buf.len(), 4 + 21);
        assert_eq!(r.corrupt_bytes(), 0);
    }
}
