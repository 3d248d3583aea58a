//! The k-way merge of per-ring record streams by timestamp, in bounded memory, shared by the
//! live `trace` and `replay`.
//!
//! Each ring's records are in time order (one thread writes a ring); the merge keeps a
//! [`Queue`] per ring and a heap of the queues' first records, and hands out the record with
//! the smallest timestamp (ties: the lower ring first, then the ring's order). A record
//! without a timestamp (TEXT, an owner change) sorts with the ring's record before it.
//!
//! What may be handed out is the caller's policy ([`crate::trace::Printer`]): a record is
//! safe once no ring can still bring an earlier one: every ring either holds a record, or
//! has shown a timestamp at or past it, or will bring nothing more (`done`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use ftprobe::record;

/// A record of a queue, borrowed.
#[derive(Clone, Copy)]
pub struct Rec<'a> {
    pub rtype: u16,
    pub aux: u32,
    /// Its merge key: its timestamp, or the timestamp of the ring's record before it.
    pub key: u64,
    pub words: &'a [u64],
}

/// One ring's records, stored as `[header, key, payload...]` in one vector (no allocation
/// per record); the consumed front is dropped in blocks.
#[derive(Default)]
pub struct Queue {
    words: Vec<u64>,
    pos: usize,
    count: usize,
    /// The newest timestamp pushed (0: none yet).
    pub last_ts: u64,
    /// No more records will come.
    pub done: bool,
    /// Live rings: the TSC just before the ring was last drained (what was published by then
    /// was read), and when a drain last brought records (CLOCK_MONOTONIC ns).
    pub drained_tsc: u64,
    pub arrival_ns: u64,
    /// Live rings: the last poll may have left records in the ring (its drain stopped at a
    /// piece's size, or the queue was too full to drain). While such a queue is empty,
    /// nothing later than its newest timestamp may be handed out, however old: the records
    /// still in the ring may be earlier (unlike a ring that is silent, the backlog is the
    /// reader's own; see [`Merge::backlog_bound`]).
    pub backlog: bool,
    /// Its first record is in the merge's heap.
    in_heap: bool,
}

impl Queue {
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn push(&mut self, rt: u16, aux: u32, w: &[u64]) {
        // A LOST mark's own time is taken after the record it precedes took its: it sorts
        // with the ring's record before it, never after that next record's time.
        let ts = record::timestamp(rt, w).filter(|_| rt != record::rtype::LOST);
        if let Some(ts) = ts {
            self.last_ts = self.last_ts.max(ts);
        }
        let key = ts.unwrap_or(self.last_ts);
        self.words
            .push(u64::from(rt) | ((w.len() as u64 & 0xffff) << 16) | (u64::from(aux) << 32));
        self.words.push(key);
        self.words.extend_from_slice(w);
        self.count += 1;
    }

    fn at(&self, p: usize) -> Rec<'_> {
        let h = self.words[p];
        let len = ((h >> 16) & 0xffff) as usize;
        Rec {
            rtype: (h & 0xffff) as u16,
            aux: (h >> 32) as u32,
            key: self.words[p + 1],
            words: &self.words[p + 2..p + 2 + len],
        }
    }

    /// Nothing later than this may be handed out while this queue is empty (and not done):
    /// its ring's newest timestamp; for a live ring idle for `idle_ns` (no record for that
    /// long, so none is on its way), also anything up to its last drain.
    pub fn bound(&self, now_ns: u64, idle_ns: Option<u64>) -> u64 {
        match idle_ns {
            Some(idle) if now_ns.saturating_sub(self.arrival_ns) >= idle => {
                self.last_ts.max(self.drained_tsc)
            }
            _ => self.last_ts,
        }
    }

    /// The first record.
    pub fn head(&self) -> Option<Rec<'_>> {
        (self.count > 0).then(|| self.at(self.pos))
    }

    /// The record after the first.
    pub fn second(&self) -> Option<Rec<'_>> {
        if self.count < 2 {
            return None;
        }
        let len = ((self.words[self.pos] >> 16) & 0xffff) as usize;
        Some(self.at(self.pos + 2 + len))
    }

    /// Drop the first record.
    pub fn pop(&mut self) {
        if self.count == 0 {
            return;
        }
        let len = ((self.words[self.pos] >> 16) & 0xffff) as usize;
        self.pos += 2 + len;
        self.count -= 1;
        if self.count == 0 {
            // Empty: its memory goes back (a thread's queue is one of up to thousands while
            // the CLI catches up with ended threads: 16 KiB each adds up), but a small
            // buffer is kept.
            if self.words.capacity() > 1 << 8 {
                self.words = Vec::new();
            } else {
                self.words.clear();
            }
            self.pos = 0;
        } else if self.pos >= 1 << 13 && self.pos * 2 >= self.words.len() {
            self.words.drain(..self.pos);
            self.pos = 0;
        }
        // A queue that keeps a record or two (a function_graph entry waits for its next
        // record) gives back what it no longer holds: thousands of threads' queues may be
        // alive while the CLI catches up with threads that ended.
        if self.words.capacity() > 1 << 14 && self.words.len() < self.words.capacity() / 8 {
            self.words.shrink_to((self.words.len() * 2).max(1 << 12));
        }
    }
}

/// The queues of the rings (streams) that may still bring or hold records, and the heap of
/// their first records. A queue done and empty is dropped ([`Merge::retire`]): the merge
/// holds nothing for a thread that ended and was printed.
#[derive(Default)]
pub struct Merge {
    pub queues: BTreeMap<u32, Queue>,
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    /// Records held in all queues.
    pub held: usize,
}

impl Merge {
    /// The queue of `ring` (created empty if need be).
    pub fn queue(&mut self, ring: u32) -> &mut Queue {
        self.queues.entry(ring).or_default()
    }

    pub fn push(&mut self, ring: u32, rt: u16, aux: u32, w: &[u64]) {
        self.queue(ring).push(rt, aux, w);
        self.held += 1;
        self.reinsert(ring);
    }

    /// Put `ring`'s first record in the heap if it is not there and there is one.
    pub fn reinsert(&mut self, ring: u32) {
        let Some(q) = self.queues.get_mut(&ring) else {
            return;
        };
        if !q.in_heap {
            if let Some(h) = q.head() {
                let key = h.key;
                q.in_heap = true;
                self.heap.push(Reverse((key, ring)));
            }
        }
    }

    /// Drop the queues that are done and empty; returns their rings.
    pub fn retire(&mut self) -> Vec<u32> {
        let gone: Vec<u32> = self
            .queues
            .iter()
            .filter(|(_, q)| q.done && q.is_empty() && !q.in_heap)
            .map(|(&r, _)| r)
            .collect();
        for r in &gone {
            self.queues.remove(r);
        }
        gone
    }

    /// The ring whose first record comes first, and that record's key.
    pub fn peek(&self) -> Option<(u64, u32)> {
        self.heap.peek().map(|Reverse(k)| *k)
    }

    /// Take the first ring off the heap: the caller pops its records from its queue
    /// ([`Merge::pop_record`]) and then calls [`Merge::reinsert`].
    pub fn take(&mut self) -> Option<u32> {
        let Reverse((_, ring)) = self.heap.pop()?;
        if let Some(q) = self.queues.get_mut(&ring) {
            q.in_heap = false;
        }
        Some(ring)
    }

    /// Drop the first record of `ring` (taken off the heap).
    pub fn pop_record(&mut self, ring: u32) {
        let Some(q) = self.queues.get_mut(&ring) else {
            return;
        };
        if !q.is_empty() {
            q.pop();
            self.held -= 1;
        }
    }

    /// The smallest newest timestamp of the empty queues whose rings have a
    /// [`backlog`](Queue::backlog): nothing later may be handed out, however long it waited
    /// (`u64::MAX`: no such ring).
    pub fn backlog_bound(&self) -> u64 {
        self.queues
            .values()
            .filter(|q| !q.done && q.is_empty() && q.backlog)
            .map(|q| q.last_ts)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The smallest [`Queue::bound`] of the rings that hold nothing and may still bring
    /// records: nothing later than it may be handed out yet (`u64::MAX`: no such ring).
    pub fn horizon(&self, now_ns: u64, idle_ns: Option<u64>) -> u64 {
        self.queues
            .values()
            .filter(|q| !q.done && q.is_empty())
            .map(|q| q.bound(now_ns, idle_ns))
            .min()
            .unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftprobe::record::rtype;

    /// Regression (issue 31's runs): an empty queue whose ring still holds undrained records
    /// bounds what may be handed out by its newest timestamp; one that is done, holds
    /// records, or has no backlog does not.
    #[test]
    fn backlog_bound_is_the_oldest_empty_backlogged_queue() {
        let mut m = Merge::default();
        assert_eq!(m.backlog_bound(), u64::MAX);
        for (ring, ts) in [(0, 100), (1, 200), (2, 50), (3, 10)] {
            m.push(ring, rtype::FUNC, 0, &[ts, 1, 0]);
        }
        // Ring 0 and 1: emptied, with a backlog; ring 2: backlog but still holds a record;
        // ring 3: emptied, done.
        while let Some(r) = m.take() {
            if r != 2 {
                m.pop_record(r);
            }
        }
        m.queue(0).backlog = true;
        m.queue(1).backlog = true;
        m.queue(2).backlog = true;
        m.queue(3).backlog = true;
        m.queue(3).done = true;
        assert_eq!(m.backlog_bound(), 100);
        m.queue(0).backlog = false;
        assert_eq!(m.backlog_bound(), 200);
    }

    #[test]
    fn merges_by_timestamp_ties_by_ring() {
        let mut m = Merge::default();
        m.push(1, rtype::FUNC, 0, &[5, 1, 0]);
        m.push(0, rtype::FUNC, 0, &[5, 2, 0]);
        m.push(0, rtype::TEXT, 0, &[0x41]);
        m.push(0, rtype::FUNC, 0, &[9, 3, 0]);
        m.push(1, rtype::FUNC, 0, &[7, 4, 0]);
        let mut got = Vec::new();
        while let Some(r) = m.take() {
            let h = m.queues[&r].head().unwrap();
            got.push((r, h.rtype, h.words[..1].to_vec()));
            m.pop_record(r);
            m.reinsert(r);
        }
        assert_eq!(
            got,
            vec![
                (0, rtype::FUNC, vec![5]),
                (0, rtype::TEXT, vec![0x41]),
                (1, rtype::FUNC, vec![5]),
                (1, rtype::FUNC, vec![7]),
                (0, rtype::FUNC, vec![9]),
            ]
        );
        assert_eq!(m.held, 0);
    }

    #[test]
    fn a_queue_reuses_its_space() {
        let mut q = Queue::default();
        for i in 0..100_000u64 {
            q.push(rtype::FUNC, 0, &[i, i, i]);
            if i % 2 == 1 {
                q.pop();
                q.pop();
            }
        }
        assert!(q.is_empty());
        assert!(q.words.capacity() < 1 << 16, "{}", q.words.capacity());
    }
}
