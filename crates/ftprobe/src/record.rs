//! The records the tracers write into the rings, and their one decoder: every reader (the
//! CLI's live `trace`, and `replay`, `report`, `dump`, `perfetto` of a recording) decodes a
//! record with [`Record::decode`], so that they cannot disagree on a layout.
//!
//! A ring record is a header word (`len | rtype << 16 | aux << 32`, see [`crate::ring`]) and
//! its payload words. By record type ([`rtype`]):
//!
//! ```text
//! rtype        aux bits                                payload words
//! FUNC         0..12 CPU                               tsc, ip, parent_ip
//! KPROBE       0..12 CPU, 12..32 event id              tsc, address, fault mask (one word
//!                                                      per 64 arguments), [ret_ip of a
//!                                                      return event], fixed argument
//!                                                      words, string data
//!                                                      (crate::trace_kprobe)
//! TEXT         kind                                    UTF-8 bytes, NUL-padded to words
//! PROFILE      event id                                dropped hits, nmissed
//! FGRAPH_ENT   0..12 CPU, 16..32 depth                 tsc (the shadow stack's calltime),
//!                                                      func
//! FGRAPH_RET   0..12 CPU, 12..16 exit (FgraphExit),    tsc (at the return, or when the
//!              16..32 depth                            call was found cut off), func,
//!                                                      calltime (tsc at entry), retval (rax)
//! LOST         0..12 CPU                               tsc, events dropped since the
//!                                                      previous LOST record (written by
//!                                                      the ring before the first record
//!                                                      that fits after drops: a gap)
//! ```
//!
//! `tsc` is the raw TSC (the buffer's clock converts it). A record shorter than its type's
//! fixed words (FUNC 3, KPROBE [`RECORD_HEAD_WORDS`], PROFILE 2, FGRAPH_ENT 2, FGRAPH_RET 4, LOST 2:
//! not one the tracers write) decodes to `None`; TEXT has any length. The writers build their `aux` with
//! the `const fn`s here ([`func_aux`], [`kprobe_aux`], [`fgraph_ent_aux`],
//! [`fgraph_ret_aux`]).

use crate::ftrace::fgraph::FgraphExit;
pub use crate::trace::rtype;
use crate::trace_kprobe::RECORD_HEAD_WORDS;

/// The CPU bits of a timed record's `aux`.
pub const CPU_MASK: u32 = 0xfff;

/// `aux` of a [`rtype::FUNC`] record.
#[inline(always)]
pub const fn func_aux(cpu: u32) -> u32 {
    cpu
}

/// `aux` of a [`rtype::KPROBE`] record of event `event`.
#[inline(always)]
pub const fn kprobe_aux(cpu: u32, event: u32) -> u32 {
    cpu | (event << 12)
}

/// `aux` of a [`rtype::FGRAPH_ENT`] record.
#[inline(always)]
pub const fn fgraph_ent_aux(cpu: u32, depth: u32) -> u32 {
    cpu | (depth << 16)
}

/// `aux` of a [`rtype::FGRAPH_RET`] record.
#[inline(always)]
pub const fn fgraph_ret_aux(cpu: u32, exit: FgraphExit, depth: u32) -> u32 {
    cpu | ((exit as u32) << 12) | (depth << 16)
}

/// The CPU in a timed record's `aux` (FUNC, KPROBE, FGRAPH_ENT, FGRAPH_RET, LOST).
#[inline]
pub const fn cpu_of(aux: u32) -> u32 {
    aux & CPU_MASK
}

/// The depth in a function_graph record's `aux`.
#[inline]
pub const fn depth_of(aux: u32) -> u32 {
    aux >> 16
}

/// A function_graph record's `aux` with its depth replaced (the rest kept).
#[inline]
pub const fn with_depth(aux: u32, depth: u32) -> u32 {
    (aux & 0xffff) | (depth << 16)
}

/// The event id in a [`rtype::KPROBE`] record's `aux`.
#[inline]
pub const fn event_of(aux: u32) -> u32 {
    aux >> 12
}

/// Whether records of type `rtype` carry a timestamp (their first payload word).
#[inline]
pub const fn is_timed(rtype: u16) -> bool {
    matches!(
        rtype,
        rtype::FUNC | rtype::KPROBE | rtype::FGRAPH_ENT | rtype::FGRAPH_RET | rtype::LOST
    )
}

/// The timestamp of a timed record (its first word), even of one too short to decode; `None`
/// for other types and empty records.
#[inline]
pub fn timestamp(rtype: u16, words: &[u64]) -> Option<u64> {
    words.first().copied().filter(|_| is_timed(rtype))
}

/// How a call ended, from a [`rtype::FGRAPH_RET`] record's `aux` (values the tracer does not
/// write read as [`FgraphExit::Lost`]).
#[inline]
pub const fn exit_of(aux: u32) -> FgraphExit {
    match (aux >> 12) & 0xf {
        0 => FgraphExit::Returned,
        1 => FgraphExit::Unwound,
        2 => FgraphExit::Longjmp,
        _ => FgraphExit::Lost,
    }
}

/// One record, decoded; it borrows the payload words where a variant keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// [`rtype::FUNC`]: a function entry.
    Func {
        ts: u64,
        ip: u64,
        parent_ip: u64,
        cpu: u32,
    },
    /// [`rtype::KPROBE`]: a kprobe event. `words` is the whole payload, for
    /// [`crate::trace_kprobe::RecordDecoder`] (which also finds a return event's `ret_ip`:
    /// its place depends on the event's definition).
    Kprobe {
        ts: u64,
        addr: u64,
        event: u32,
        cpu: u32,
        words: &'a [u64],
    },
    /// [`rtype::TEXT`]: text for the CLI, NUL-padded ([`Record::text_bytes`]).
    Text { kind: u32, words: &'a [u64] },
    /// [`rtype::PROFILE`]: an event's counters at exit.
    Profile {
        event: u32,
        dropped: u64,
        nmissed: u64,
    },
    /// [`rtype::FGRAPH_ENT`]: a function_graph entry.
    GraphEntry {
        ts: u64,
        func: u64,
        cpu: u32,
        depth: u32,
    },
    /// [`rtype::FGRAPH_RET`]: a function_graph return.
    GraphReturn {
        ts: u64,
        func: u64,
        calltime: u64,
        retval: u64,
        cpu: u32,
        depth: u32,
        exit: FgraphExit,
    },
    /// [`rtype::LOST`]: `count` events of this thread were dropped (its ring was full)
    /// between the record before and the record after this one: a gap. `count` may be 0
    /// (a mark whose drops an earlier one counted): nothing was lost there.
    Lost { ts: u64, count: u64, cpu: u32 },
}

impl<'a> Record<'a> {
    /// The record of type `rtype` with `aux` and payload `words`; `None` for another type,
    /// or a record too short for its type.
    #[inline]
    pub fn decode(rtype: u16, aux: u32, words: &'a [u64]) -> Option<Record<'a>> {
        let cpu = cpu_of(aux);
        Some(match (rtype, words) {
            (rtype::FUNC, &[ts, ip, parent_ip, ..]) => Record::Func {
                ts,
                ip,
                parent_ip,
                cpu,
            },
            (rtype::KPROBE, &[ts, addr, ..]) if words.len() >= RECORD_HEAD_WORDS => {
                Record::Kprobe {
                    ts,
                    addr,
                    event: event_of(aux),
                    cpu,
                    words,
                }
            }
            (rtype::TEXT, _) => Record::Text { kind: aux, words },
            (rtype::PROFILE, &[dropped, nmissed, ..]) => Record::Profile {
                event: aux,
                dropped,
                nmissed,
            },
            (rtype::FGRAPH_ENT, &[ts, func, ..]) => Record::GraphEntry {
                ts,
                func,
                cpu,
                depth: depth_of(aux),
            },
            (rtype::FGRAPH_RET, &[ts, func, calltime, retval, ..]) => Record::GraphReturn {
                ts,
                func,
                calltime,
                retval,
                cpu,
                depth: depth_of(aux),
                exit: exit_of(aux),
            },
            (rtype::LOST, &[ts, count, ..]) => Record::Lost { ts, count, cpu },
            _ => return None,
        })
    }

    /// The record's timestamp (raw TSC); `None` for TEXT and PROFILE.
    pub fn ts(&self) -> Option<u64> {
        match *self {
            Record::Func { ts, .. }
            | Record::Kprobe { ts, .. }
            | Record::GraphEntry { ts, .. }
            | Record::GraphReturn { ts, .. }
            | Record::Lost { ts, .. } => Some(ts),
            Record::Text { .. } | Record::Profile { .. } => None,
        }
    }

    /// A TEXT record's bytes (NUL padding included); empty for other records.
    pub fn text_bytes(&self) -> impl Iterator<Item = u8> + 'a {
        let words: &'a [u64] = match *self {
            Record::Text { words, .. } => words,
            _ => &[],
        };
        words.iter().flat_map(|x| x.to_le_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{RingConfig, SharedRings};

    const COMM: [u8; 16] = *b"decode\0\0\0\0\0\0\0\0\0\0";

    fn rings() -> SharedRings {
        SharedRings::create_uncalibrated(RingConfig {
            nr_rings: 1,
            ring_bytes: 1 << 16,
            budget_bytes: 0,
        })
        .unwrap()
        .0
    }

    /// Every record of ring 0, as (rtype, aux, payload).
    fn drain(sr: &SharedRings) -> Vec<(u16, u32, Vec<u64>)> {
        let mut got = Vec::new();
        sr.reader(0)
            .unwrap()
            .drain_aux(|rt, aux, w| got.push((rt, aux, w.to_vec())));
        got
    }

    #[test]
    fn each_record_type_decodes_from_what_the_writers_write() {
        let sr = rings();
        let w = sr.claim(1, COMM).unwrap();
        // As the writers call the ring: function_tracer's write3_aux, function_graph's
        // write_n_aux, trace_kprobe's write_with (head: tsc, address, fault mask; then a
        // return event's ret_ip and one argument word), trace::write_text's write_aux.
        assert!(w.write3_aux(rtype::FUNC, func_aux(7), 100, 0x1000, 0x2000));
        assert!(w.write_n_aux(
            rtype::FGRAPH_ENT,
            fgraph_ent_aux(4095, 65535),
            [200, 0x3000]
        ));
        let ret_aux = fgraph_ret_aux(3, FgraphExit::Longjmp, 12);
        assert!(w.write_n_aux(rtype::FGRAPH_RET, ret_aux, [300, 0x3000, 250, u64::MAX]));
        assert!(w.write_aux(
            rtype::KPROBE,
            kprobe_aux(5, 1023),
            &[400, 0x4000, 0, 0x5000, 42]
        ));
        assert!(w.write_aux(rtype::TEXT, 2, &[u64::from_le_bytes(*b"hi\0\0\0\0\0\0")]));
        assert!(w.write_aux(rtype::PROFILE, 9, &[11, 12]));
        let recs = drain(&sr);
        // LOST, as the ring writes it before the first record after drops.
        let lost = Record::decode(rtype::LOST, 3, &[500, 17]);
        assert_eq!(
            lost,
            Some(Record::Lost {
                ts: 500,
                count: 17,
                cpu: 3
            })
        );
        assert_eq!(lost.and_then(|r| r.ts()), Some(500));
        let got: Vec<Record<'_>> = recs
            .iter()
            .map(|(rt, aux, w)| Record::decode(*rt, *aux, w).unwrap())
            .collect();
        let kprobe_words = [400, 0x4000, 0, 0x5000, 42];
        assert_eq!(
            got,
            vec![
                Record::Func {
                    ts: 100,
                    ip: 0x1000,
                    parent_ip: 0x2000,
                    cpu: 7
                },
                Record::GraphEntry {
                    ts: 200,
                    func: 0x3000,
                    cpu: 4095,
                    depth: 65535
                },
                Record::GraphReturn {
                    ts: 300,
                    func: 0x3000,
                    calltime: 250,
                    retval: u64::MAX,
                    cpu: 3,
                    depth: 12,
                    exit: FgraphExit::Longjmp
                },
                Record::Kprobe {
                    ts: 400,
                    addr: 0x4000,
                    event: 1023,
                    cpu: 5,
                    words: &kprobe_words
                },
                Record::Text {
                    kind: 2,
                    words: &[u64::from_le_bytes(*b"hi\0\0\0\0\0\0")]
                },
                Record::Profile {
                    event: 9,
                    dropped: 11,
                    nmissed: 12
                },
            ]
        );
        assert_eq!(
            got[4].text_bytes().filter(|&b| b != 0).collect::<Vec<_>>(),
            b"hi"
        );
        assert_eq!(
            got.iter().map(Record::ts).collect::<Vec<_>>(),
            [Some(100), Some(200), Some(300), Some(400), None, None]
        );
    }

    /// The ring's own LOST record, written before the first record after a drop, decodes
    /// with the count of that drop.
    #[test]
    fn the_rings_lost_record_decodes() {
        let sr = rings();
        let w = sr.claim(1, COMM).unwrap();
        assert!(
            !w.write(rtype::FUNC, &[0; 9000]),
            "larger than the ring: dropped"
        );
        assert!(w.write3_aux(rtype::FUNC, func_aux(2), 100, 0x1000, 0x2000));
        let recs = drain(&sr);
        assert_eq!(recs.len(), 2, "{recs:?}");
        let (rt, aux, words) = &recs[0];
        match Record::decode(*rt, *aux, words) {
            Some(Record::Lost { count: 1, ts, .. }) => assert!(ts > 0),
            other => panic!("{other:?}"),
        }
        let (rt, aux, words) = &recs[1];
        assert!(matches!(
            Record::decode(*rt, *aux, words),
            Some(Record::Func { ts: 100, .. })
        ));
    }

    #[test]
    fn every_exit_round_trips_through_aux() {
        for exit in [
            FgraphExit::Returned,
            FgraphExit::Unwound,
            FgraphExit::Longjmp,
            FgraphExit::Lost,
        ] {
            let aux = fgraph_ret_aux(17, exit, 300);
            assert_eq!((cpu_of(aux), exit_of(aux), depth_of(aux)), (17, exit, 300));
            // Depth rebased (the CLI's -F/-N): CPU and exit kept.
            let r = with_depth(aux, 2);
            assert_eq!((cpu_of(r), exit_of(r), depth_of(r)), (17, exit, 2));
        }
        // Bits the tracer never writes read as a lost call, as the CLI always did.
        assert_eq!(exit_of(0xf << 12), FgraphExit::Lost);
    }

    #[test]
    fn records_too_short_for_their_type_do_not_decode() {
        let w = [1u64, 2, 3, 4];
        for (rt, min) in [
            (rtype::FUNC, 3),
            (rtype::KPROBE, RECORD_HEAD_WORDS),
            (rtype::PROFILE, 2),
            (rtype::FGRAPH_ENT, 2),
            (rtype::FGRAPH_RET, 4),
            (rtype::LOST, 2),
        ] {
            for n in 0..=w.len() {
                assert_eq!(
                    Record::decode(rt, 0, &w[..n]).is_some(),
                    n >= min,
                    "rtype {rt}, {n} words"
                );
            }
        }
        // TEXT of any length, even empty.
        assert_eq!(
            Record::decode(rtype::TEXT, 1, &[]),
            Some(Record::Text {
                kind: 1,
                words: &[]
            })
        );
        // A timestamp of any timed record with a first word.
        assert_eq!(timestamp(rtype::FGRAPH_RET, &w[..1]), Some(1));
        assert_eq!(timestamp(rtype::FUNC, &[]), None);
        assert_eq!(timestamp(rtype::TEXT, &w), None);
        assert_eq!(timestamp(rtype::PROFILE, &w), None);
        // Other types (padding, the CLI's own markers) are not records of a tracer.
        assert_eq!(Record::decode(0, 0, &w), None);
        assert_eq!(Record::decode(8, 0, &w), None);
        assert_eq!(Record::decode(u16::MAX, 0, &w), None);
    }
}
