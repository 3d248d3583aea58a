//! Ring ownership under thread churn: a claim takes the first free ring from ring 0 and,
//! when there is none, says why (every ring owned by a live thread, or some released by
//! ended threads and not freed by the reader yet); a release moves `freed` (threads without
//! a ring try again); the loss counters count each kind.

use ftprobe::ring::{NoRing, RingConfig, SharedRings};

const COMM: [u8; 16] = *b"churn\0\0\0\0\0\0\0\0\0\0\0";

#[test]
fn a_claim_without_a_ring_says_why_and_rings_are_reused_from_the_lowest() {
    let (sr, _fd) = SharedRings::create_uncalibrated(RingConfig {
        nr_rings: 3,
        ring_bytes: 1 << 16,
        budget_bytes: 0,
    })
    .expect("create");
    let a = sr.claim_or_why(1, COMM).expect("ring 0");
    let b = sr.claim_or_why(2, COMM).expect("ring 1");
    let c = sr.claim_or_why(3, COMM).expect("ring 2");
    assert_eq!(sr.claimed(), 3);
    // All three owned by threads that have not ended.
    assert_eq!(sr.claim_or_why(4, COMM).err(), Some(NoRing::Owned));
    // Thread 2 ends: its ring is released, not freed until read to the end.
    let freed = sr.freed();
    assert!(b.write(1, &[7]));
    sr.release(b);
    assert_eq!(
        sr.freed(),
        freed + 1,
        "a release wakes the threads without a ring"
    );
    assert_eq!(sr.claim_or_why(4, COMM).err(), Some(NoRing::Unreclaimed));
    assert_eq!(sr.free_released(1, |_, _| false), None, "not read yet");
    let mut r = sr.reader(1).expect("reader");
    assert_eq!(r.drain(|_, _| {}), 1);
    assert_eq!(sr.free_released(1, |_, _| false).map(|o| o.0), Some(2));
    assert_eq!(sr.freed(), freed + 2);
    // The freed ring is the one taken: the rings in use stay at the low indices.
    let d = sr.claim_or_why(4, COMM).expect("the freed ring");
    assert_eq!(sr.owner(1).map(|o| o.0), Some(4));
    assert_eq!(sr.claimed(), 3);
    for w in [a, c, d] {
        sr.release(w);
    }
    // The kinds of losses, in the total and in their own counters.
    let slot = sr.lost_slot(5);
    sr.note_lost_no_ring_as(slot, NoRing::Owned);
    sr.note_lost_no_ring_as(slot, NoRing::Unreclaimed);
    sr.note_lost_no_ring_as(slot, NoRing::Unreclaimed);
    sr.note_lost_no_ring_as(slot, NoRing::AfterEnd);
    assert_eq!(sr.lost_no_ring(), 4);
    assert_eq!(sr.lost_no_ring_kinds(), (2, 1));
    assert_eq!(sr.lost_by_tid(), vec![(5, 4)]);
}

/// `trace::note_at_first_claim` (the agent's note of a forked child's image): the note is the
/// first record of the first ring the process claims, before the claiming event; it claims
/// nothing by itself; it is written once; a thread that has a ring writes it at once.
#[test]
fn a_note_for_the_first_claim_is_that_rings_first_record() {
    use ftprobe::trace::{self, rtype};
    use std::os::fd::AsFd;
    let (rings, fd) = SharedRings::create_uncalibrated(RingConfig {
        nr_rings: 4,
        ring_bytes: 1 << 16,
        budget_bytes: 0,
    })
    .expect("create");
    let reader = SharedRings::attach(fd.as_fd()).expect("attach");
    assert!(trace::set_buffer(rings));
    let words: &'static [u64] = Box::leak(Box::new([u64::from_le_bytes(*b"image 1\0")]));
    let event = || trace::with_ring_guarded(|w| assert!(w.write(rtype::FUNC, &[42, 0])));
    let records = |i: u32| {
        let mut out = Vec::new();
        reader.reader(i).expect("reader").drain_aux(|rt, aux, w| {
            out.push((rt, aux, w.to_vec()));
        });
        out
    };
    std::thread::spawn(move || {
        trace::note_at_first_claim(4, words);
        assert_eq!(reader_claimed(), 0, "the note alone claims no ring");
        event();
    })
    .join()
    .unwrap();
    fn reader_claimed() -> u32 {
        trace::buffer().expect("set").claimed()
    }
    let first = records(0);
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!((first[0].0, first[0].1), (rtype::TEXT, 4));
    assert_eq!(first[0].2, words);
    assert_eq!(first[1].0, rtype::FUNC);
    // Written once: the next thread's ring has its event only.
    std::thread::spawn(event).join().unwrap();
    let second = records(1);
    assert_eq!(
        second.iter().map(|r| r.0).collect::<Vec<_>>(),
        [rtype::FUNC],
        "{second:?}"
    );
    // A thread with a ring writes the note into it at once.
    std::thread::spawn(move || {
        event();
        trace::note_at_first_claim(4, words);
    })
    .join()
    .unwrap();
    let third = records(2);
    assert_eq!(
        third.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(),
        [(rtype::FUNC, 0), (rtype::TEXT, 4)],
        "{third:?}"
    );
}
