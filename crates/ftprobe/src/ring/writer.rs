//! The producer end of a ring ([`RingWriter`]), on the probe path: reserve, fill, commit,
//! nested writers (a signal handler's write inside another, module docs "Writers and
//! nesting"), growth on the first lap and the populate-ahead of its pages.

use std::fmt;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU64, AtomicU8};

use super::layout::*;

/// The producer end of one ring: `Copy`, no allocation, no lock, no syscall (but the
/// first-lap populate), no panic; async-signal-safe, and re-entrant from a signal handler on
/// the owner thread (module docs: writers nest). Borrowing the [`SharedRings`](super::SharedRings) keeps the
/// mapping alive: the agent keeps its `SharedRings` in a `static`, so its writers are
/// `RingWriter<'static>`.
#[derive(Clone, Copy)]
pub struct RingWriter<'a, const IN_SECTION: bool = false> {
    pub(super) ring: &'a RingDesc,
    /// The ring's whole address space (`ring_bytes / 8` words, the most `size` may grow to);
    /// `size` bytes are in use.
    pub(super) data: &'a [AtomicU64],
    pub(super) budget: &'a Counters,
}

impl<const S: bool> fmt::Debug for RingWriter<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingWriter")
            .field("data", &self.data.as_ptr())
            .field("size", &self.desc().size.load(Relaxed))
            .finish()
    }
}

/// `*p = new` if `*p == old`, in one `cmpxchg` without a lock prefix: atomic against a
/// signal handler of this thread (an instruction is never interrupted half-way), and cheap;
/// the producer line is written by this thread only.
#[inline(always)]
fn cmpxchg_local(p: &AtomicU64, old: u64, new: u64) -> bool {
    let ok: u8;
    // SAFETY: `p` is a valid, aligned 8-byte location (an AtomicU64 of our mapping); cmpxchg
    // reads and writes only it, rax and the flags. No other thread writes it while this one
    // owns the ring (the reader writes it only when the ring is free).
    unsafe {
        std::arch::asm!(
            "cmpxchg qword ptr [{p}], {new}",
            "sete {ok}",
            p = in(reg) p.as_ptr(),
            new = in(reg) new,
            ok = out(reg_byte) ok,
            inout("rax") old => _,
            options(nostack),
        )
    };
    ok != 0
}

/// Stops the compiler from moving memory accesses across it (no instruction): what a signal
/// handler of this thread observes is program order.
#[inline(always)]
fn signal_fence() {
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Words of a LOST record, its header included: the timestamp, the drops it marks.
pub(super) const LOST_WORDS: usize = 3;

/// What [`RingWriter::room`] found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Room {
    Fits,
    /// It fits, and drops wait for their LOST record.
    FitsLostPending,
    Full,
}

/// Where `need` bytes go at reserve counter `r` of a ring of `size` bytes: (position of
/// `r`, the record's start, bytes taken from `r`: the record, plus the padding to the end
/// when it does not fit before it and goes to 0).
#[inline(always)]
fn span(r: u64, need: u64, size: u64) -> (u64, u64, u64) {
    let pos = r & size.wrapping_sub(1);
    let to_end = size.wrapping_sub(pos);
    if need <= to_end {
        (pos, pos, need)
    } else {
        (pos, 0, to_end + need)
    }
}

/// A writer inside a section the caller began ([`RingWriter::in_section`]): its writes
/// neither begin nor commit, the section's commit publishes them.
pub type SectionWriter<'a> = RingWriter<'a, true>;

impl<'a, const IN_SECTION: bool> RingWriter<'a, IN_SECTION> {
    /// The producer's line of the descriptor.
    #[inline(always)]
    pub(super) fn desc(&self) -> &ProducerLine {
        &self.ring.prod.0
    }

    /// Writes one record: the header word, then `words`. Returns false, and counts one in
    /// this ring's `lost`, when it does not fit in the free space (the newest event is dropped,
    /// never one already written), when `words.len() + 1 > MAX_RECORD_WORDS` or the ring, or
    /// when `rtype` is [`RTYPE_PADDING`].
    #[inline]
    pub fn write(&self, rtype: u16, words: &[u64]) -> bool {
        self.write_aux(rtype, 0, words)
    }

    /// [`write`](Self::write) with a 32-bit `aux` value in the header word, read back by
    /// [`RingReader::drain_aux`](super::RingReader::drain_aux).
    #[inline]
    pub fn write_aux(&self, rtype: u16, aux: u32, words: &[u64]) -> bool {
        self.write_with(rtype, aux, words.len(), |body| {
            for (slot, &w) in body.iter().zip(words) {
                slot.store(w, Relaxed);
            }
        })
    }

    /// Write a record of `payload_words` words that `fill` stores directly into the ring
    /// (`slot.store(value, Relaxed)`): no buffer on the caller's stack, which matters on a
    /// probe path that may run on a small stack (a signal stack, a coroutine's). Same
    /// semantics as [`write`](Self::write); `fill` runs only if there is room.
    #[inline]
    pub fn write_with(
        &self,
        rtype: u16,
        aux: u32,
        payload_words: usize,
        fill: impl FnOnce(&[AtomicU64]),
    ) -> bool {
        self.try_write_with(rtype, aux, payload_words, fill) || self.drop_one()
    }

    /// [`write_with`](Self::write_with) that does not count a record that does not fit.
    #[inline(always)]
    fn try_write_with(
        &self,
        rtype: u16,
        aux: u32,
        payload_words: usize,
        fill: impl FnOnce(&[AtomicU64]),
    ) -> bool {
        let nwords = payload_words + 1;
        if nwords > MAX_RECORD_WORDS || rtype == RTYPE_PADDING {
            return false;
        }
        if !IN_SECTION {
            self.begin();
        }
        let ok = match self.reserve(nwords).and_then(|start| {
            self.data
                .get(start..start + nwords)
                .and_then(|s| s.split_first())
        }) {
            Some((hdr, body)) => {
                hdr.store(record_header_aux(nwords, rtype, aux), Relaxed);
                fill(body);
                self.point(hook::FILLED);
                true
            }
            None => false,
        };
        if !IN_SECTION {
            self.commit();
        }
        ok
    }

    /// Control path: [`write_aux`](Self::write_aux) that, when the record does not fit, leaves
    /// `lost` alone and returns false, for a caller that will try again once the reader has
    /// made room (the agent's counters at exit, which must not be counted as a lost event).
    pub fn try_write_aux(&self, rtype: u16, aux: u32, words: &[u64]) -> bool {
        self.try_write_with(rtype, aux, words.len(), |body| {
            for (slot, &w) in body.iter().zip(words) {
                slot.store(w, Relaxed);
            }
        })
    }

    /// A record whose size is known only once it is filled (a kprobe event's strings, copied
    /// in one pass: the kernel measures them first, `fetch_store_strlen()`, and this saves
    /// that pass). Room for `max_payload_words` is reserved; `fill` stores into it and returns
    /// the words it used (at most `max_payload_words`); the reservation then shrinks to them,
    /// unless a nested writer (a signal handler) reserved after it meanwhile: the record then
    /// keeps all of its room, the words `fill` did not use zeroed.
    ///
    /// `None` when the room is not there as it is for an ordinary record of that size, with
    /// nothing reserved and nothing counted: it would have to wrap (padding), grow the ring,
    /// mark earlier drops first (a LOST record), or the ring is too full for it. The caller
    /// then writes the record with its exact size ([`write_with`](Self::write_with)).
    #[inline(always)]
    pub fn try_write_shrinking(
        &self,
        rtype: u16,
        aux: u32,
        max_payload_words: usize,
        fill: impl FnOnce(&[AtomicU64]) -> usize,
    ) -> Option<()> {
        let most = max_payload_words + 1;
        if most > MAX_RECORD_WORDS || rtype == RTYPE_PADDING {
            return None;
        }
        if !IN_SECTION {
            self.begin();
        }
        let reserved = self
            .reserve_whole(most)
            .and_then(|(r, start)| Some((r, self.data.get(start..start + most)?.split_first()?)));
        let Some((r, (hdr, body))) = reserved else {
            if !IN_SECTION {
                self.commit();
            }
            return None;
        };
        let used = fill(body).min(max_payload_words);
        self.point(hook::FILLED);
        let end = r.wrapping_add(most as u64 * 8);
        let new = r.wrapping_add((used as u64 + 1) * 8);
        let words = if used == max_payload_words || cmpxchg_local(&self.desc().reserved, end, new) {
            used + 1
        } else {
            // A nested writer's record follows this one's whole room.
            for w in &body[used..] {
                w.store(0, Relaxed);
            }
            most
        };
        hdr.store(record_header_aux(words, rtype, aux), Relaxed);
        self.populate_ahead(r, r.wrapping_add(words as u64 * 8));
        if !IN_SECTION {
            self.commit();
        }
        Some(())
    }

    /// [`write`](Self::write) of exactly three payload words (the function tracer's
    /// timestamp, ip, parent ip), without a loop.
    #[inline]
    pub fn write3(&self, rtype: u16, a: u64, b: u64, c: u64) -> bool {
        self.write3_aux(rtype, 0, a, b, c)
    }

    /// [`write3`](Self::write3) with a 32-bit `aux` value in the header word (the CPU, for
    /// the function tracer), read back by [`RingReader::drain_aux`](super::RingReader::drain_aux).
    #[inline]
    pub fn write3_aux(&self, rtype: u16, aux: u32, a: u64, b: u64, c: u64) -> bool {
        self.write_n_aux(rtype, aux, [a, b, c])
    }

    /// The ring's head plus its `lost` count: changes with every record the outermost writer
    /// publishes or this ring drops. Two loads of the producer's own cache line.
    #[inline(always)]
    pub fn mark(&self) -> u64 {
        // Relaxed: only this producer stores either.
        self.desc()
            .head
            .load(Relaxed)
            .wrapping_add(self.desc().lost.load(Relaxed))
    }

    /// [`write_aux`](Self::write_aux) of a fixed number of payload words, inlined without a
    /// loop or a closure (the function_graph tracer's two records, one per event).
    #[inline(always)]
    pub fn write_n_aux<const N: usize>(&self, rtype: u16, aux: u32, words: [u64; N]) -> bool {
        if N + 1 > MAX_RECORD_WORDS || rtype == RTYPE_PADDING {
            return self.drop_one();
        }
        if !IN_SECTION {
            self.begin();
        }
        let ok = match self.reserve(N + 1).and_then(|start| {
            self.data
                .get(start..start + N + 1)
                .and_then(|s| s.split_first())
        }) {
            Some((hdr, body)) => {
                hdr.store(record_header_aux(N + 1, rtype, aux), Relaxed);
                for (slot, w) in body.iter().zip(words) {
                    slot.store(w, Relaxed);
                }
                self.point(hook::FILLED);
                true
            }
            None => false,
        };
        if !IN_SECTION {
            self.commit();
        }
        ok || self.drop_one()
    }

    /// Start a write (or a group of writes that publish together): one more writer on the
    /// ring. Returns the writers already in progress (0: this is the outermost); a nested
    /// writer's repair also needs [`reserved`](Self::reserved) as it is now (see
    /// [`abandon`](Self::abandon)). Each `begin` is paired with one [`commit`](Self::commit).
    #[inline(always)]
    pub fn begin(&self) -> u32 {
        // Relaxed load and store: a handler that interrupts between them runs whole writes
        // (begin and commit) and leaves `nest` as it found it.
        let n = self.desc().nest.load(Relaxed);
        self.desc().nest.store(n.wrapping_add(1), Relaxed);
        signal_fence();
        self.point(hook::BEGUN);
        n
    }

    /// The reserve pointer: where the next record goes.
    #[inline(always)]
    pub fn reserved(&self) -> u64 {
        // Relaxed: the owner thread's own value.
        self.desc().reserved.load(Relaxed)
    }

    /// End a write begun with [`begin`](Self::begin): the outermost writer publishes
    /// everything reserved, nested ones included (module docs).
    #[inline(always)]
    pub fn commit(&self) {
        loop {
            let n = self.desc().nest.load(Relaxed);
            if n != 1 {
                // Nested: the outermost writer publishes.
                self.desc().nest.store(n.wrapping_sub(1), Relaxed);
                signal_fence();
                return;
            }
            let r = self.desc().reserved.load(Relaxed);
            self.point(hook::COMMIT_LOADED);
            // Release: publishes the records' words; pairs with the Acquire load in
            // `RingReader::drain_aux`.
            self.desc().head.store(r, Release);
            signal_fence();
            self.point(hook::PUBLISHED);
            self.desc().nest.store(0, Relaxed);
            signal_fence();
            self.point(hook::UNNESTED);
            // A handler that ran between the load of `reserved` and the store of `nest` saw
            // a writer in progress and did not publish: publish its records now.
            if self.desc().reserved.load(Relaxed) == r {
                return;
            }
            self.desc().nest.store(1, Relaxed);
            signal_fence();
        }
    }

    /// This writer inside a section begun with [`begin`](Self::begin): its writes are
    /// published by the section's [`commit`](Self::commit), not each by itself.
    #[inline(always)]
    pub fn in_section(self) -> SectionWriter<'a> {
        RingWriter {
            ring: self.ring,
            data: self.data,
            budget: self.budget,
        }
    }

    /// Tests: a nested writer (a simulated signal handler) at point `p` of a write.
    #[inline(always)]
    fn point(&self, _p: u32) {
        #[cfg(test)]
        hook::fire(
            &RingWriter {
                ring: self.ring,
                data: self.data,
                budget: self.budget,
            },
            _p,
        );
    }

    /// Writers in progress on this ring (nested).
    #[inline(always)]
    pub fn nesting(&self) -> u32 {
        // Relaxed: the owner thread's own value.
        self.desc().nest.load(Relaxed)
    }

    /// Repair after a non-local exit (`crate::probe_state`): the writers from `level` on (as
    /// [`begin`](Self::begin) numbered them) were abandoned; `reserved_at` is what `begin`
    /// returned for the writer at `level`. Their records are never published: the reserve
    /// pointer goes back to where they began (to `head` when no writer is left).
    pub fn abandon(&self, level: u32, reserved_at: u64) {
        // Relaxed: only this thread writes the producer line.
        let head = self.desc().head.load(Relaxed);
        let back = if level == 0 {
            head
        } else {
            // A live writer below `level` reserved nothing after `reserved_at` (it was
            // interrupted): going back there is safe, never below what was published.
            let cur = self.desc().reserved.load(Relaxed);
            if reserved_at.wrapping_sub(head) <= cur.wrapping_sub(head) {
                reserved_at
            } else {
                cur
            }
        };
        self.desc().reserved.store(back, Relaxed);
        self.desc().nest.store(level, Relaxed);
        signal_fence();
        // An abandoned LOST record is never published: mark its drops again.
        // Relaxed: this thread's own words.
        if self.desc().lost.load(Relaxed) != self.ring.tail.0.lost_marked.load(Relaxed) {
            self.desc().tail_cache.fetch_or(LOST_PENDING, Relaxed);
        }
    }

    /// Finds room for `nwords` words at the reserve pointer and writes the padding word if
    /// the record has to go to offset 0. Returns the record's first word index. When drops
    /// are not marked yet (`LOST_PENDING`), the record goes after a LOST record
    /// ([`reserve_lost_then`](Self::reserve_lost_then)).
    #[inline(always)]
    fn reserve(&self, nwords: usize) -> Option<usize> {
        self.reserve_as::<false>(nwords).map(|(_, start)| start)
    }

    /// [`reserve`](Self::reserve); with `LOST`, room for a LOST record ([`LOST_WORDS`])
    /// first, then the record (`nwords` may then be 0: the LOST record alone). Returns the
    /// LOST record's first word index (0 without `LOST`) and the record's.
    #[inline(always)]
    fn reserve_as<const LOST: bool>(&self, nwords: usize) -> Option<(usize, usize)> {
        let need = nwords as u64 * 8;
        let lost_need = if LOST { LOST_WORDS as u64 * 8 } else { 0 };
        loop {
            // Relaxed: only this thread (and its signal handlers) store these.
            let r = self.desc().reserved.load(Relaxed);
            // A size that is not a power of two (only a scribbled line has one) gives
            // positions that `data.get` refuses or that are wrong but in bounds.
            let size = u64::from(self.desc().size.load(Relaxed));
            if r <= size && r + lost_need + need > size {
                // The first lap's end (the ring never wrapped: `reserved` is at most `size`):
                // the outermost writer grows the ring instead of wrapping, while the budget
                // lets it; a nested one never wraps it first.
                if self.nesting() > 1 {
                    return None;
                }
                if self.grow(size) {
                    continue;
                }
            }
            // The LOST record (if any) at `r`, the record after it.
            let (lost_pos, lost_start, lost_total) = if LOST {
                span(r, lost_need, size)
            } else {
                (0, 0, 0)
            };
            let r1 = r.wrapping_add(lost_total);
            let (pos, start, total) = span(r1, need, size);
            let all = lost_total + total;
            match self.room(r, all, size) {
                Room::Fits => {}
                Room::Full => return None,
                // Drops not marked yet: a LOST record first (out of line). With `LOST` this
                // is that path: the bit is cleared once the room is taken.
                Room::FitsLostPending if !LOST => {
                    return self.reserve_lost_then(nwords).map(|start| (0, start))
                }
                Room::FitsLostPending => {}
            }
            let new = r.wrapping_add(all);
            self.point(hook::RESERVING);
            if !cmpxchg_local(&self.desc().reserved, r, new) {
                // A signal handler reserved in between: again from its end.
                continue;
            }
            self.point(hook::RESERVED);
            if LOST && lost_start != lost_pos {
                let pad = self.data.get((lost_pos / 8) as usize)?;
                pad.store(record_header(0, RTYPE_PADDING), Relaxed);
            }
            if start != pos {
                let pad = self.data.get((pos / 8) as usize)?;
                pad.store(record_header(0, RTYPE_PADDING), Relaxed);
            }
            self.populate_ahead(r, new);
            return Some(((lost_start / 8) as usize, (start / 8) as usize));
        }
    }

    /// [`try_write_shrinking`](Self::try_write_shrinking)'s reservation: `nwords` words at
    /// the reserve pointer when they fit there as they are (no padding, no growth, no LOST
    /// record pending, room free): the reserve counter where they start, and their first
    /// word index. No populate: the caller populates for what it keeps.
    #[inline(always)]
    fn reserve_whole(&self, nwords: usize) -> Option<(u64, usize)> {
        let need = nwords as u64 * 8;
        loop {
            // Relaxed: only this thread (and its signal handlers) store these.
            let r = self.desc().reserved.load(Relaxed);
            let size = u64::from(self.desc().size.load(Relaxed));
            if r <= size && r + need > size {
                return None;
            }
            let (pos, start, total) = span(r, need, size);
            if start != pos || self.room(r, total, size) != Room::Fits {
                return None;
            }
            self.point(hook::RESERVING);
            if cmpxchg_local(&self.desc().reserved, r, r.wrapping_add(need)) {
                self.point(hook::RESERVED);
                return Some((r, (pos / 8) as usize));
            }
        }
    }

    /// First lap only (the counter is the position): a reservation from `r` to `new` that
    /// enters a new chunk maps the next one in. Chunks start at multiples of 8 KiB: most
    /// records cross no such line.
    #[inline(always)]
    fn populate_ahead(&self, r: u64, new: u64) {
        let size = u64::from(self.desc().size.load(Relaxed));
        if new <= size
            && (r == 0 || (r ^ new) >= POPULATE_FIRST)
            && (r == 0 || populate_chunk_index(r) != populate_chunk_index(new))
        {
            let k = populate_chunk_index(new);
            let from = if r == 0 {
                0
            } else {
                populate_chunk_start(k + 1)
            };
            self.populate(from, populate_chunk_start(k + 2).min(size));
        }
    }

    /// The first record that fits after one or more drops: reserve a LOST record and the
    /// record together, write the LOST record (the drops since the last one) and return the
    /// record's first word index. Out of line: once per gap. Async-signal-safe and nested
    /// writers' safe: the pending bit is cleared after the room is taken and before the
    /// count is taken, so a drop in a handler in between is either in this record's count
    /// or marks a later one (possibly with a count of 0, which readers ignore).
    #[cold]
    #[inline(never)]
    fn reserve_lost_then(&self, nwords: usize) -> Option<usize> {
        let (lost_at, start) = self.reserve_as::<true>(nwords)?;
        // Relaxed: the producer's own word; a locked instruction (a handler may set the bit
        // between a load and a store), once per gap.
        self.desc().tail_cache.fetch_and(!LOST_PENDING, Relaxed);
        signal_fence();
        let count = self.take_lost_count();
        let (tsc, cpu) = (super::read_tsc(), super::read_cpu());
        if let Some([hdr, ts, n]) = self.data.get(lost_at..lost_at + LOST_WORDS) {
            hdr.store(record_header_aux(LOST_WORDS, RTYPE_LOST, cpu), Relaxed);
            ts.store(tsc, Relaxed);
            n.store(count, Relaxed);
        }
        Some(start)
    }

    /// The drops since the last LOST record: `lost` less `lost_marked`, which becomes
    /// `lost`. One `cmpxchg` without a lock prefix, retried if a handler's LOST record took
    /// a count in between: each drop is counted in one LOST record.
    fn take_lost_count(&self) -> u64 {
        let marked = &self.ring.tail.0.lost_marked;
        loop {
            // Relaxed: both written by this thread (and its handlers) only.
            let m = marked.load(Relaxed);
            let l = self.desc().lost.load(Relaxed);
            if cmpxchg_local(marked, m, l) {
                return l.wrapping_sub(m);
            }
        }
    }

    /// A thread's end (before its ring is released), or any time: write the LOST record of
    /// the drops not marked yet, if there are any and there is room, so that a gap at the end
    /// of the thread's records is marked too. Async-signal-safe.
    pub fn flush_lost(&self) {
        // Relaxed: the producer's own word.
        if self.desc().tail_cache.load(Relaxed) & LOST_PENDING == 0 {
            return;
        }
        if !IN_SECTION {
            self.begin();
        }
        let _ = self.reserve_lost_then(0);
        if !IN_SECTION {
            self.commit();
        }
    }

    /// The outermost writer at the end of the first lap: double the ring's size if the budget
    /// and `ring_bytes` allow. Out of line: once per doubling.
    #[cold]
    #[inline(never)]
    fn grow(&self, size: u64) -> bool {
        let new = size * 2;
        if size == 0 || new > self.data.len() as u64 * 8 {
            return false;
        }
        // Relaxed: written once by the reader before the target started.
        let budget = self.budget.budget_bytes.load(Relaxed);
        // Relaxed: the budget is a sum of sizes, not a publication. A locked instruction,
        // but once per doubling, not per event.
        let took = self.budget.budget_used.fetch_update(Relaxed, Relaxed, |u| {
            let u2 = u.checked_add(size)?;
            (u2 <= budget).then_some(u2)
        });
        if took.is_err() {
            return false;
        }
        // Relaxed: published to the reader by the Release store of `head` that publishes the
        // first record past the old size.
        self.desc().size.store(new as u32, Relaxed);
        // The records go on into the new half: map its first chunk in.
        self.populate(size, size + size.min(POPULATE_CHUNK));
        true
    }

    /// Producer, first lap: map bytes `[from, to)` of the ring into this process with one
    /// `MADV_POPULATE_WRITE` (Linux 5.14+), so that the writes into them take no page fault:
    /// at the first record the first two chunks, on entering a chunk the next one (within the
    /// ring's size), on a doubling the new half's first chunk. Chunks double from 8 KiB to
    /// [`POPULATE_CHUNK`]: a thread with a few events maps a few pages, a busy one makes one
    /// system call per [`POPULATE_CHUNK`] (one fault per 4 KiB page cost ~2-4 us on this VM).
    /// Best effort and async-signal-safe (one raw system call); after a refusal (an older
    /// kernel, a seccomp filter) it is not tried again in this process.
    #[cold]
    #[inline(never)]
    fn populate(&self, from: u64, to: u64) {
        static REFUSED: AtomicU8 = AtomicU8::new(0);
        if REFUSED.load(Relaxed) != 0 {
            return;
        }
        let to = to.min(self.data.len() as u64 * 8);
        if from >= to {
            return;
        }
        const MADV_POPULATE_WRITE: u64 = 23;
        let addr = self.data.as_ptr() as u64 + from;
        // SAFETY: [addr, addr + len) lies inside this ring's data area of our shared mapping
        // (page-aligned: the data area is, and so are `from` and `to`); populating changes no
        // contents; a raw syscall: no errno, no lock.
        let ret = unsafe {
            crate::sys::raw_syscall4(libc::SYS_madvise, addr, to - from, MADV_POPULATE_WRITE, 0)
        };
        if ret < 0 && ret != -(libc::EINTR as i64) && ret != -(libc::EAGAIN as i64) {
            REFUSED.store(1, Relaxed);
        }
    }

    /// Whether `total` bytes fit at `reserved`, and whether drops wait for their LOST
    /// record. The fast path is one compare with the producer's cached tail, whose
    /// `LOST_PENDING` bit (set by a drop) makes it fail: the check for a gap costs nothing
    /// until there is one.
    #[inline(always)]
    fn room(&self, reserved: u64, total: u64, size: u64) -> Room {
        // A tail "ahead" of the reserve pointer or more than a ring behind (a corrupted
        // reader) means full; so does a cached tail with LOST_PENDING (bit 63: the distance
        // to it is then above any size).
        let fits = |tail: u64| {
            let free = size.checked_sub(reserved.wrapping_sub(tail));
            free.is_some_and(|free| total <= free)
        };
        // Relaxed: the producer's own copy of a value it loaded with Acquire below.
        let cached = self.desc().tail_cache.load(Relaxed);
        if fits(cached) {
            return Room::Fits;
        }
        // Acquire: pairs with the Release store in `RingReader::drain`: the reader's loads of
        // the bytes it freed happen before our stores that reuse them.
        let tail = self.ring.tail.0.tail.load(Acquire);
        let pending = cached & LOST_PENDING != 0;
        if !pending {
            // A compare-and-swap, not a store: a handler's drop that set the bit since our
            // load must not be wiped out. On failure the cache stays stale (it is only a
            // lower bound).
            cmpxchg_local(&self.desc().tail_cache, cached, tail);
        }
        match (fits(tail), pending) {
            (false, _) => Room::Full,
            (true, false) => Room::Fits,
            (true, true) => Room::FitsLostPending,
        }
    }

    #[cold]
    fn drop_one(&self) -> bool {
        // Relaxed: a statistic, read by `RingReader::lost`. The owner thread's own counter,
        // but a signal handler may drop one in between a load and a store: a locked add, on
        // the (cold) dropping path only.
        self.desc().lost.fetch_add(1, Relaxed);
        // Then the mark: the next record that fits is preceded by a LOST record. After the
        // count, so that a LOST record a handler writes in between either counts this drop
        // or leaves the bit set for the next one.
        self.desc().tail_cache.fetch_or(LOST_PENDING, Relaxed);
        false
    }
}

/// The points of a write where the tests let a "signal handler" write (`RingWriter::point`).
mod hook {
    pub(super) const BEGUN: u32 = 1;
    pub(super) const RESERVING: u32 = 2;
    pub(super) const RESERVED: u32 = 3;
    pub(super) const FILLED: u32 = 4;
    pub(super) const COMMIT_LOADED: u32 = 5;
    pub(super) const PUBLISHED: u32 = 6;
    pub(super) const UNNESTED: u32 = 7;

    /// A nested write, run at a point.
    #[cfg(test)]
    pub(super) type Nested = fn(&super::RingWriter<'_>);

    #[cfg(test)]
    thread_local! {
        /// The point to fire at (once), and the nested write to run there.
        pub(super) static AT: std::cell::Cell<(u32, Option<Nested>)> =
            const { std::cell::Cell::new((0, None)) };
    }

    #[cfg(test)]
    pub(super) fn fire(w: &super::RingWriter<'_>, p: u32) {
        let (at, f) = AT.get();
        if at == p {
            if let Some(f) = f {
                AT.set((0, None));
                f(w);
            }
        }
    }
}

/// The populate chunk that byte `at` of a ring's first lap is in: 0 for [0, 8K), 1 for
/// [8K, 16K), 2 for [16K, 32K), ... doubling up to [`POPULATE_CHUNK`], then one per
/// [`POPULATE_CHUNK`].
#[inline(always)]
fn populate_chunk_index(at: u64) -> u64 {
    // Chunk k >= 1 starts at POPULATE_FIRST << (k - 1) while that is below POPULATE_CHUNK.
    const DOUBLINGS: u64 = (POPULATE_CHUNK / POPULATE_FIRST).trailing_zeros() as u64;
    if at < POPULATE_FIRST {
        0
    } else if at < POPULATE_CHUNK {
        1 + u64::from(63 - (at / POPULATE_FIRST).leading_zeros())
    } else {
        1 + DOUBLINGS + (at - POPULATE_CHUNK) / POPULATE_CHUNK
    }
}

/// The first byte of populate chunk `k` ([`populate_chunk_index`]).
fn populate_chunk_start(k: u64) -> u64 {
    const DOUBLINGS: u64 = (POPULATE_CHUNK / POPULATE_FIRST).trailing_zeros() as u64;
    if k == 0 {
        0
    } else if k <= DOUBLINGS {
        POPULATE_FIRST << (k - 1)
    } else {
        POPULATE_CHUNK + (k - 1 - DOUBLINGS) * POPULATE_CHUNK
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::test_util::{drain_all, head_of, rings, COMM};
    use crate::ring::{RingReader, SharedRings};

    #[test]
    fn round_trip_exact_values() {
        let sr = rings(2, 4096);
        let w = sr.claim(1234, COMM).unwrap();
        assert!(w.write(7, &[1, 2, 3]));
        assert!(w.write(8, &[]));
        assert!(w.write3(9, 10, 11, 12));
        let mut r = sr.reader(0).unwrap();
        assert_eq!(r.tid(), 1234);
        assert_eq!(r.comm(), COMM);
        assert_eq!(
            drain_all(&mut r),
            vec![(7, vec![1, 2, 3]), (8, vec![]), (9, vec![10, 11, 12])]
        );
        assert_eq!(head_of(&r), (4 + 1 + 4) * 8);
        assert_eq!(r.lost(), 0);
        assert_eq!(r.corrupt_bytes(), 0);
        assert_eq!(drain_all(&mut r), vec![]);
        // Raw words as the layout doc says: len | rtype << 16, then the payload.
        let d = sr.data(0).unwrap();
        let words: Vec<u64> = d[..9].iter().map(|w| w.load(Relaxed)).collect();
        assert_eq!(
            words,
            [4 | 7 << 16, 1, 2, 3, 1 | 8 << 16, 4 | 9 << 16, 10, 11, 12]
        );
    }

    #[test]
    fn write_n_aux_writes_header_aux_and_words() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        assert!(w.write_n_aux(5, 0x0003_0001, [7, 8]));
        assert!(w.write_n_aux(6, 2, [1, 2, 3, 4]));
        let d = sr.data(0).unwrap();
        let words: Vec<u64> = d[..8].iter().map(|w| w.load(Relaxed)).collect();
        assert_eq!(
            words,
            [
                record_header_aux(3, 5, 0x0003_0001),
                7,
                8,
                record_header_aux(5, 6, 2),
                1,
                2,
                3,
                4
            ]
        );
        let mut r = sr.reader(0).unwrap();
        assert_eq!(
            drain_all(&mut r),
            vec![(5, vec![7, 8]), (6, vec![1, 2, 3, 4])]
        );
    }

    /// Whether the page at byte `off` of ring 0's data area is in the memfd's page cache.
    fn page_present(sr: &SharedRings, off: usize) -> bool {
        let p = sr.data(0).unwrap().as_ptr() as usize + off;
        let mut v = 0u8;
        // SAFETY: one page of our mapping, page-aligned; mincore writes one byte.
        let r = unsafe { libc::mincore(p as *mut libc::c_void, 4096, &mut v) };
        assert_eq!(r, 0, "mincore");
        v & 1 != 0
    }

    /// The producer maps the chunk ahead of its writes in on its first lap (one
    /// MADV_POPULATE_WRITE per chunk instead of one page fault per page), chunks doubling with
    /// the ring: at the first record its first 16 KiB (its initial size), no more; when it
    /// doubles, the new half's first chunk.
    #[test]
    fn producer_maps_the_next_chunk_in_on_its_first_lap() {
        if !rings(1, 4096).prefault(0, 0, 4096) {
            eprintln!("skipped: MADV_POPULATE_WRITE refused (kernel < 5.14?)");
            return;
        }
        let sr = rings(1, 1 << 20);
        let w = sr.claim(1, COMM).unwrap();
        assert!(!page_present(&sr, 12 << 10), "fresh memfd");
        assert!(w.write_n_aux(5, 0, [1, 2]));
        assert!(
            page_present(&sr, 12 << 10),
            "the first 16 KiB at the first record"
        );
        assert!(!page_present(&sr, 16 << 10), "not past the initial size");
        assert_eq!(sr.ring_size(0), Some(16 << 10));
        // Past 16 KiB: the ring doubled (first lap) and its new half is mapped.
        let mut r = sr.reader(0).unwrap();
        while head_of(&r) < (16 << 10) + 64 {
            assert!(w.write_n_aux(5, 0, [0; 7]));
            r.drain(|_, _| {});
        }
        assert_eq!(sr.ring_size(0), Some(32 << 10));
        assert!(page_present(&sr, 28 << 10));
        assert!(!page_present(&sr, 32 << 10));
        // Into the 256 KiB chunks: the next one is mapped ahead.
        while head_of(&r) < (256 << 10) + 64 {
            assert!(w.write_n_aux(5, 0, [0; 7]));
            r.drain(|_, _| {});
        }
        assert_eq!(sr.ring_size(0), Some(512 << 10));
        assert!(page_present(&sr, (512 << 10) - 4096));
        assert!(!page_present(&sr, 512 << 10));
    }

    /// Many records of lengths 1..=13 words across ~40 wraps of a 4 KiB ring, drained every few
    /// records; checks every value and the head against a model of the padding rule.
    #[test]
    fn wrap_around_with_padding_mixed_lengths() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        let (mut model_head, mut pads, mut seq) = (0u64, 0, 0u64);
        let mut expected = Vec::new();
        let mut got = Vec::new();
        for i in 0..20_000u64 {
            let payload_len = (i % 13) as usize;
            let payload: Vec<u64> = (0..payload_len as u64).map(|k| seq * 100 + k).collect();
            let need = (payload_len as u64 + 1) * 8;
            let to_end = 4096 - model_head % 4096;
            if need > to_end {
                model_head += to_end;
                pads += 1;
            }
            model_head += need;
            let rtype = (i % 5) as u16;
            assert!(w.write(rtype, &payload), "record {i}");
            expected.push((rtype, payload));
            seq += 1;
            if i % 7 == 6 {
                r.drain(|t, p| got.push((t, p.to_vec())));
                assert_eq!(head_of(&r), model_head);
            }
        }
        r.drain(|t, p| got.push((t, p.to_vec())));
        assert_eq!(got.len(), 20_000);
        assert_eq!(got, expected);
        assert_eq!(head_of(&r), model_head);
        assert!(
            pads > 30 && model_head > 40 * 4096,
            "pads {pads} head {model_head}"
        );
        assert_eq!((r.lost(), r.corrupt_bytes()), (0, 0));
    }

    #[test]
    fn record_of_whole_ring_and_too_large() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        let big: Vec<u64> = (0..511).collect();
        assert!(w.write(3, &big));
        assert!(!w.write(3, &[]), "ring is exactly full");
        assert_eq!(drain_all(&mut r), vec![(3, big.clone())]);
        let too_big: Vec<u64> = (0..512).collect();
        assert!(!w.write(3, &too_big));
        assert!(!w.write(RTYPE_PADDING, &[1]));
        assert!(!w.write3(RTYPE_PADDING, 1, 2, 3));
        assert_eq!(r.lost(), 4);
        // After a wrap to a non-zero position, a whole-ring record needs padding too. (The
        // first record after drops comes after a LOST record: 3 words.)
        assert!(w.write(1, &[42]));
        let got = drain_all(&mut r);
        assert_eq!((got[0].0, got[0].1[1]), (RTYPE_LOST, 4), "{got:?}");
        assert_eq!(got[1..], [(1, vec![42])]);
        assert!(!w.write(3, &big), "needs 4096 + padding");
        // At 40: a LOST record (24 bytes), then 4032 bytes fit before the end.
        assert!(w.write(3, &big[..503]), "4032 bytes fit before the end");
        let got = drain_all(&mut r);
        assert_eq!((got[0].0, got[0].1[1]), (RTYPE_LOST, 1), "{got:?}");
        assert_eq!(got[1..], [(3, big[..503].to_vec())]);
        assert_eq!(r.lost(), 5);
    }

    #[test]
    fn full_ring_drops_newest_and_counts() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        // 4-word records: exactly 128 fit in 4096 bytes.
        let ok: Vec<bool> = (0..200u64).map(|i| w.write3(5, i, i * 2, i * 3)).collect();
        assert_eq!(ok.iter().filter(|&&b| b).count(), 128);
        assert!(ok[..128].iter().all(|&b| b) && ok[128..].iter().all(|&b| !b));
        assert_eq!(r.lost(), 72);
        let got = drain_all(&mut r);
        let want: Vec<(u16, Vec<u64>)> = (0..128u64).map(|i| (5, vec![i, i * 2, i * 3])).collect();
        assert_eq!(got, want);
        // Space is back; the count stays; the gap is marked where it was.
        assert!(w.write(6, &[99]));
        let got = drain_all(&mut r);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0, got[0].1[1]), (RTYPE_LOST, 72));
        assert_eq!(got[1], (6, vec![99]));
        assert_eq!(r.lost(), 72);
    }

    /// Every point of a write where a nested writer may run.
    const EVERY_POINT: [u32; 7] = [
        hook::BEGUN,
        hook::RESERVING,
        hook::RESERVED,
        hook::FILLED,
        hook::COMMIT_LOADED,
        hook::PUBLISHED,
        hook::UNNESTED,
    ];

    /// A nested writer ("a signal handler" of the owner thread) at each point of a write:
    /// both records are published, whole, in the order they reserved, by the outermost
    /// commit at the latest; nothing is left reserved and unpublished, nothing stuck.
    #[test]
    fn a_write_interrupted_at_each_point_by_a_nested_one() {
        fn nested(w: &RingWriter<'_>) {
            assert!(w.write3(9, 90, 91, 92));
        }
        for p in EVERY_POINT {
            let sr = rings(1, 4096);
            let w = sr.claim(1, COMM).unwrap();
            let mut r = sr.reader(0).unwrap();
            hook::AT.set((p, Some(nested)));
            assert!(w.write3(1, 10, 11, 12), "point {p}");
            assert_eq!(hook::AT.get().0, 0, "point {p} fired");
            let got = drain_all(&mut r);
            // Before the outer reserved, the nested record comes first.
            let (outer, inner) = ((1, vec![10, 11, 12]), (9, vec![90, 91, 92]));
            let want = if p <= hook::RESERVING {
                vec![inner, outer]
            } else {
                vec![outer, inner]
            };
            assert_eq!(got, want, "point {p}");
            assert_eq!(w.nesting(), 0, "point {p}");
            assert_eq!(head_of(&r), w.desc().reserved.load(Relaxed), "point {p}");
            assert_eq!((r.lost(), r.corrupt_bytes()), (0, 0), "point {p}");
            // The ring goes on.
            assert!(w.write3(2, 3, 4, 5));
            assert_eq!(drain_all(&mut r), vec![(2, vec![3, 4, 5])], "point {p}");
        }
    }

    /// `try_write_shrinking` fills `used` words of a room of `most`, from `seq`.
    fn shrinking(w: &RingWriter<'_>, rtype: u16, most: usize, used: usize, seq: u64) -> bool {
        w.try_write_shrinking(rtype, 0, most, |body| {
            for (k, s) in body.iter().take(used).enumerate() {
                s.store(seq * 100 + k as u64, Relaxed);
            }
            used
        })
        .is_some()
    }

    /// Records written in room that shrinks to what they used, mixed with ordinary ones,
    /// across ~40 wraps of a 4 KiB ring: each is read back with the size it used, the head
    /// moves as if every record had been written with its exact size (a shrinking write that
    /// would need padding at the end is refused, and the record written ordinarily), and
    /// nothing is lost.
    #[test]
    fn shrinking_records_take_only_what_they_used() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        let (mut model_head, mut refused) = (0u64, 0);
        let mut expected = Vec::new();
        let mut got = Vec::new();
        for i in 0..20_000u64 {
            let used = (i % 13) as usize;
            let most = used + (i % 5) as usize * 7;
            let payload: Vec<u64> = (0..used as u64).map(|k| i * 100 + k).collect();
            let to_end = 4096 - model_head % 4096;
            let ok = shrinking(&w, 4, most, used, i);
            assert_eq!(ok, (most as u64 + 1) * 8 <= to_end, "record {i}");
            if !ok {
                refused += 1;
                assert!(w.write(4, &payload), "record {i}");
            }
            let need = (used as u64 + 1) * 8;
            if need > to_end {
                model_head += to_end;
            }
            model_head += need;
            expected.push((4, payload));
            if i % 7 == 6 {
                r.drain(|t, p| got.push((t, p.to_vec())));
                assert_eq!(head_of(&r), model_head, "record {i}");
            }
        }
        r.drain(|t, p| got.push((t, p.to_vec())));
        assert_eq!(got, expected);
        assert_eq!(head_of(&r), model_head);
        assert!(refused > 30, "refused {refused}");
        assert_eq!((r.lost(), r.corrupt_bytes()), (0, 0));
    }

    /// A shrinking write is refused, reserving and counting nothing, where an ordinary write
    /// of its room would pad to the end, grow the ring (first lap), find the ring full, or
    /// first mark drops with a LOST record; the ordinary write then does that.
    #[test]
    fn shrinking_writes_are_refused_where_an_ordinary_one_would_do_more() {
        // First lap: the ring (16 KiB of 64) would grow.
        let sr = rings(1, 1 << 16);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        assert!(w.write(1, &[0; 2039])); // 16384 - 64 bytes
        assert!(!shrinking(&w, 2, 8, 1, 1), "would grow");
        assert!(shrinking(&w, 2, 7, 1, 1), "fits before the end");
        assert_eq!(sr.ring_size(0), Some(16 << 10));
        assert_eq!(drain_all(&mut r).len(), 2);
        // Full: 4 KiB ring, 128 bytes free.
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        assert!(w.write(1, &[0; 495]));
        assert!(!shrinking(&w, 2, 16, 1, 1), "full");
        assert_eq!((r.lost(), w.reserved()), (0, 3968));
        assert!(shrinking(&w, 2, 15, 1, 1), "fits");
        assert_eq!(w.reserved(), 3984);
        // After a drop: the ordinary write marks it; the shrinking one does not.
        assert!(!w.write(3, &[0; 20]));
        assert!(!shrinking(&w, 2, 1, 1, 2), "a LOST record pending");
        assert_eq!(drain_all(&mut r).len(), 2);
        assert!(!shrinking(&w, 2, 1, 1, 2), "a LOST record pending");
        assert!(w.write(2, &[7]));
        let got = drain_all(&mut r);
        assert_eq!((got[0].0, got[0].1[1]), (RTYPE_LOST, 1), "{got:?}");
        assert_eq!(got[1], (2, vec![7]));
        assert!(shrinking(&w, 2, 1, 1, 3));
        assert_eq!(drain_all(&mut r), vec![(2, vec![300])]);
        assert_eq!((r.lost(), r.corrupt_bytes()), (1, 0));
    }

    /// A nested writer at each point of a shrinking write: both records whole, in the order
    /// they reserved; one that reserved after the room and before the shrink leaves the
    /// outer record its whole room, the unused words zero.
    #[test]
    fn a_shrinking_write_interrupted_at_each_point_by_a_nested_one() {
        fn nested(w: &RingWriter<'_>) {
            assert!(w.write3(9, 90, 91, 92));
        }
        for p in EVERY_POINT {
            let sr = rings(1, 4096);
            let w = sr.claim(1, COMM).unwrap();
            let mut r = sr.reader(0).unwrap();
            // Stale words where the room will be.
            assert!(w.write(7, &[u64::MAX; 20]));
            assert_eq!(drain_all(&mut r).len(), 1);
            hook::AT.set((p, Some(nested)));
            assert!(shrinking(&w, 1, 10, 3, 1), "point {p}");
            assert_eq!(hook::AT.get().0, 0, "point {p} fired");
            let inner = (9, vec![90, 91, 92]);
            let want = match p {
                hook::BEGUN | hook::RESERVING => vec![inner, (1, vec![100, 101, 102])],
                hook::RESERVED | hook::FILLED => {
                    let mut whole = vec![100, 101, 102];
                    whole.resize(10, 0);
                    vec![(1, whole), inner]
                }
                _ => vec![(1, vec![100, 101, 102]), inner],
            };
            assert_eq!(drain_all(&mut r), want, "point {p}");
            assert_eq!(w.nesting(), 0, "point {p}");
            assert_eq!(head_of(&r), w.desc().reserved.load(Relaxed), "point {p}");
            assert_eq!((r.lost(), r.corrupt_bytes()), (0, 0), "point {p}");
        }
    }

    /// The wrap rule under nesting: the outer write pads to the end and goes to offset 0, a
    /// nested one interrupts it between its reservation and its padding word, or before its
    /// reservation (then the nested one wraps). Every record is read whole, in order.
    #[test]
    fn wrap_under_nesting() {
        fn nested(w: &RingWriter<'_>) {
            assert!(w.write(9, &[7; 5]));
        }
        for p in [hook::RESERVING, hook::RESERVED, hook::FILLED] {
            let sr = rings(1, 4096);
            let w = sr.claim(1, COMM).unwrap();
            let mut r = sr.reader(0).unwrap();
            // A whole lap, then one word: the second lap (the size is fixed); then up to
            // 16 bytes before the end; all read.
            assert!(w.write(1, &[0; 511]));
            assert_eq!(drain_all(&mut r).len(), 1);
            assert!(w.write(1, &[]));
            assert_eq!(drain_all(&mut r).len(), 1);
            assert!(w.write(1, &[0; 508]));
            assert_eq!(drain_all(&mut r).len(), 1);
            assert_eq!(head_of(&r) % 4096, 4080);
            hook::AT.set((p, Some(nested)));
            // 4 words do not fit in the last 2: padding, then offset 0.
            assert!(w.write3(2, 1, 2, 3), "point {p}");
            let got = drain_all(&mut r);
            let (outer, inner) = ((2, vec![1, 2, 3]), (9, vec![7; 5]));
            let want = if p == hook::RESERVING {
                vec![inner, outer]
            } else {
                vec![outer, inner]
            };
            assert_eq!(got, want, "point {p}");
            assert_eq!((r.lost(), r.corrupt_bytes(), w.nesting()), (0, 0, 0));
        }
    }

    /// On the ring's first lap a nested writer that does not fit before the end drops its
    /// record (it never wraps nor grows the ring: only the outermost does); the outer one
    /// grows the ring and goes on.
    #[test]
    fn a_nested_writer_never_makes_the_first_wrap() {
        fn nested(w: &RingWriter<'_>) {
            assert!(!w.write(9, &[7; 5]));
        }
        let sr = rings(1, 1 << 16);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        assert_eq!(sr.ring_size(0), Some(16 << 10));
        assert!(w.write(1, &[0; 2045])); // 16384 - 16 bytes
        hook::AT.set((hook::BEGUN, Some(nested)));
        assert!(w.write3(2, 1, 2, 3));
        assert_eq!(sr.ring_size(0), Some(32 << 10));
        let got = drain_all(&mut r);
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[1].0, got[1].1[1]),
            (RTYPE_LOST, 1),
            "the nested drop, marked"
        );
        assert_eq!(got[2], (2, vec![1, 2, 3]));
        assert_eq!((r.lost(), r.corrupt_bytes()), (1, 0));
    }

    /// A gap in a fresh 4 KiB ring, past its first lap (where a nested writer may wrap):
    /// one record read, then 128 four-word records (the ring full), `drops` dropped, and
    /// the 128 read.
    fn gap(w: &RingWriter<'_>, r: &mut RingReader<'_>, drops: u64) {
        assert!(w.write3(5, 0, 0, 0));
        assert_eq!(drain_all(r).len(), 1);
        for i in 0..128u64 {
            assert!(w.write3(5, i, i, i));
        }
        for _ in 0..drops {
            assert!(!w.write3(5, 0, 0, 0));
        }
        assert_eq!(drain_all(r).len(), 128, "no mark without room");
    }

    /// The (count) of each LOST record in `got`, and the other records.
    fn split_lost(got: &[(u16, Vec<u64>)]) -> (Vec<u64>, Vec<(u16, Vec<u64>)>) {
        let lost = got
            .iter()
            .filter(|(t, _)| *t == RTYPE_LOST)
            .map(|(_, p)| {
                assert_eq!(p.len(), LOST_WORDS - 1, "{p:?}");
                p[1]
            })
            .collect();
        let other = got
            .iter()
            .filter(|(t, _)| *t != RTYPE_LOST)
            .cloned()
            .collect();
        (lost, other)
    }

    /// A gap (records dropped on a full ring) is marked once, by a LOST record with the
    /// number dropped, right before the first record that fits after it; the records after
    /// it need none; a second gap gets its own count (since the previous mark).
    #[test]
    fn a_gap_is_marked_once_before_the_first_record_that_fits() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        gap(&w, &mut r, 10);
        let before = read_tsc_for_test();
        assert!(w.write3(6, 1, 1, 1));
        assert!(w.write3(6, 2, 2, 2));
        let got = drain_all(&mut r);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].0, RTYPE_LOST);
        assert_eq!(got[0].1[1], 10);
        assert!(got[0].1[0] >= before, "its timestamp is the mark's");
        assert_eq!(got[1..], [(6, vec![1, 1, 1]), (6, vec![2, 2, 2])]);
        // Fill the ring again (the write that ends the loop is a drop), drop 2 more (one too
        // large for any ring).
        let mut n = 0;
        while w.write3(7, n, n, n) {
            n += 1;
        }
        assert!(!w.write3(7, 0, 0, 0));
        assert!(!w.write(7, &[0; 600]), "too large for the ring: a drop too");
        assert_eq!(drain_all(&mut r).len() as u64, n);
        assert!(w.write(8, &[]));
        let got = drain_all(&mut r);
        assert_eq!(split_lost(&got), (vec![3], vec![(8, vec![])]));
        assert_eq!(r.lost(), 13, "the counts add up to the ring's total");
        assert_eq!((r.corrupt_bytes(), w.nesting()), (0, 0));
    }

    fn read_tsc_for_test() -> u64 {
        crate::ring::read_tsc()
    }

    /// A signal handler that writes (a nested writer) at each point of the first write after
    /// a gap, or that drops its own record there: every drop is counted in exactly one LOST
    /// record (a second one may count 0), each LOST record is before the records that
    /// follow the drops it counts, every record is whole, the ring goes on.
    #[test]
    fn a_nested_writer_during_a_gap() {
        fn nested(w: &RingWriter<'_>) {
            assert!(w.write3(9, 90, 91, 92));
        }
        for p in EVERY_POINT {
            let sr = rings(1, 4096);
            let w = sr.claim(1, COMM).unwrap();
            let mut r = sr.reader(0).unwrap();
            gap(&w, &mut r, 5);
            hook::AT.set((p, Some(nested)));
            assert!(w.write3(1, 10, 11, 12), "point {p}");
            assert_eq!(hook::AT.get().0, 0, "point {p} fired");
            let got = drain_all(&mut r);
            let (lost, other) = split_lost(&got);
            assert_eq!(lost.iter().sum::<u64>(), 5, "point {p}: {got:?}");
            assert_eq!(
                lost.iter().filter(|&&n| n != 0).count(),
                1,
                "point {p}: {got:?}"
            );
            // The first record is a LOST record: every drop came before both writes.
            assert_eq!(got[0].0, RTYPE_LOST, "point {p}: {got:?}");
            assert_eq!(other.len(), 2, "point {p}: {got:?}");
            assert!(
                other.contains(&(1, vec![10, 11, 12])) && other.contains(&(9, vec![90, 91, 92]))
            );
            assert_eq!(
                (w.nesting(), r.lost(), r.corrupt_bytes()),
                (0, 5, 0),
                "point {p}"
            );
            assert!(w.write3(2, 3, 4, 5));
            assert_eq!(
                drain_all(&mut r),
                vec![(2, vec![3, 4, 5])],
                "point {p}: no mark again"
            );
        }
        // A handler whose own record drops (the ring has room for the outer write only)
        // while the outer one writes the mark: its drop is marked too, once.
        fn nested_big(w: &RingWriter<'_>) {
            assert!(!w.write(9, &[0; 600]), "larger than the ring");
        }
        for p in [
            hook::BEGUN,
            hook::RESERVING,
            hook::RESERVED,
            hook::FILLED,
            hook::UNNESTED,
        ] {
            let sr = rings(1, 4096);
            let w = sr.claim(1, COMM).unwrap();
            let mut r = sr.reader(0).unwrap();
            gap(&w, &mut r, 5);
            hook::AT.set((p, Some(nested_big)));
            assert!(w.write3(1, 10, 11, 12), "point {p}");
            assert!(w.write3(2, 3, 4, 5), "point {p}");
            let got = drain_all(&mut r);
            let (lost, other) = split_lost(&got);
            assert_eq!(lost.iter().sum::<u64>(), 6, "point {p}: {got:?}");
            assert_eq!(
                other,
                vec![(1, vec![10, 11, 12]), (2, vec![3, 4, 5])],
                "point {p}"
            );
            assert_eq!(got[0].0, RTYPE_LOST, "point {p}: {got:?}");
            assert_eq!((w.nesting(), r.lost()), (0, 6), "point {p}");
        }
    }

    /// A thread that ends right after a gap: its ring's release writes the mark (there is
    /// room by then), so the gap at the end of its records is marked too.
    #[test]
    fn release_marks_a_gap_at_the_end() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        gap(&w, &mut r, 7);
        sr.release(w);
        let got = drain_all(&mut r);
        assert_eq!(split_lost(&got), (vec![7], vec![]));
        let (_, _, lost) = sr.free_released(0, |_, _| false).unwrap();
        assert_eq!(lost, 7);
        // The next owner starts with nothing to mark.
        let w2 = sr.claim(2, COMM).unwrap();
        assert!(w2.write3(1, 1, 1, 1));
        assert_eq!(
            drain_all(&mut sr.reader(0).unwrap()),
            vec![(1, vec![1, 1, 1])]
        );
    }

    /// A repair after the nested writer was abandoned (its handler jumped out) with the outer
    /// one still live: the nest count goes back, the reserve pointer back to where the nested
    /// one began; the outer commit publishes only the outer records.
    #[test]
    fn abandon_rewinds_to_the_abandoned_writer() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        let l0 = w.begin();
        assert_eq!(l0, 0);
        assert!(w.in_section().write3(1, 1, 1, 1));
        let at = w.reserved();
        let l1 = w.begin();
        assert_eq!(l1, 1);
        assert!(w.in_section().write3(9, 9, 9, 9)); // then abandoned
        w.abandon(1, at);
        assert_eq!(w.nesting(), 1);
        assert!(w.in_section().write3(2, 2, 2, 2));
        w.commit();
        assert_eq!(
            drain_all(&mut r),
            vec![(1, vec![1, 1, 1]), (2, vec![2, 2, 2])]
        );
        // Everything abandoned: back to head.
        w.begin();
        assert!(w.in_section().write3(3, 3, 3, 3));
        w.abandon(0, 0);
        assert_eq!(w.nesting(), 0);
        assert!(w.write3(4, 4, 4, 4));
        assert_eq!(drain_all(&mut r), vec![(4, vec![4, 4, 4])]);
        assert_eq!(r.corrupt_bytes(), 0);
    }
}
