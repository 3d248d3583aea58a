//! Timestamps: the probe path's raw TSC reads (`rdtsc`, `rdpid`) and the conversion of TSC
//! ticks to CLOCK_MONOTONIC nanoseconds that readers apply ([`Clock`], stored in the shared
//! header).

use std::sync::atomic::Ordering::Relaxed;

/// CLOCK_MONOTONIC now, in nanoseconds (the clock [`Clock::tsc_to_mono_ns`] converts to).
pub fn monotonic_ns() -> u64 {
    super::sys::monotonic_ns()
}

/// The time-stamp counter: the probe path's timestamp, converted by readers with [`Clock`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read_tsc() -> u64 {
    // SAFETY: RDTSC exists on every x86-64 CPU and has no memory effects; user space may run
    // it unless the kernel set CR4.TSD, which Linux does only for seccomp-strict tasks.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The time-stamp counter and the CPU this thread runs on. Probe path.
///
/// Linux keeps the CPU number in the low 12 bits of `TSC_AUX`. `rdtsc` + `rdpid` (~23 ns on
/// this VM) where the CPU has `rdpid`, else `rdtscp` (~28 ns): see BENCHMARKS.md.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read_tsc_cpu() -> (u64, u32) {
    if has_rdpid() {
        let aux: u64;
        // SAFETY: RDPID exists (checked by CPUID in `has_rdpid`); it only writes `aux`.
        unsafe {
            core::arch::asm!("rdpid {}", out(reg) aux, options(nomem, nostack, preserves_flags))
        };
        (read_tsc(), (aux & 0xfff) as u32)
    } else {
        let mut aux = 0u32;
        // SAFETY: RDTSCP exists on every x86-64 CPU Linux runs on (all since 2006) and only
        // writes `aux`, a local.
        let tsc = unsafe { core::arch::x86_64::__rdtscp(&mut aux) };
        (tsc, aux & 0xfff)
    }
}

/// The CPU this thread runs on, without a timestamp (for a record whose time was read
/// already): `rdpid` (~0.2 ns on this VM, against ~11 ns for `rdtsc`) where the CPU has it,
/// else `rdtscp`'s `TSC_AUX`. Probe path.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read_cpu() -> u32 {
    if has_rdpid() {
        let aux: u64;
        // SAFETY: RDPID exists (checked by CPUID in `has_rdpid`); it only writes `aux`.
        unsafe {
            core::arch::asm!("rdpid {}", out(reg) aux, options(nomem, nostack, preserves_flags))
        };
        (aux & 0xfff) as u32
    } else {
        let mut aux = 0u32;
        // SAFETY: as in `read_tsc_cpu`: RDTSCP only writes `aux`, a local.
        let _ = unsafe { core::arch::x86_64::__rdtscp(&mut aux) };
        aux & 0xfff
    }
}

/// Whether the CPU has `rdpid` (CPUID.7.0:ECX bit 22), asked once; probe path after that.
#[inline(always)]
fn has_rdpid() -> bool {
    use std::sync::atomic::AtomicU8;
    static RDPID: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 no, 2 yes
    match RDPID.load(Relaxed) {
        2 => true,
        1 => false,
        _ => {
            // CPUID leaf 7 returns zeros (no rdpid) on CPUs too old to have it.
            let yes = core::arch::x86_64::__cpuid_count(7, 0).ecx & (1 << 22) != 0;
            RDPID.store(if yes { 2 } else { 1 }, Relaxed);
            yes
        }
    }
}

/// A (TSC, CLOCK_MONOTONIC) pair: the start of a calibration ([`Clock::start_calibration`]).
#[derive(Debug, Clone, Copy)]
pub struct ClockSample {
    tsc: u64,
    ns: u64,
}

/// Conversion from TSC ticks to CLOCK_MONOTONIC nanoseconds: a reference pair and a rate, stored
/// in the header by [`SharedRings::create`](super::SharedRings::create).
///
/// The rate is measured over 20 ms, to about 1 ppm: converted times drift from CLOCK_MONOTONIC
/// by about 1 µs per second away from the reference (which NTP slewing of CLOCK_MONOTONIC adds
/// to). Assumes an invariant TSC, synchronized across CPUs (any x86-64 of the last 15 years).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    tsc_ref: u64,
    mono_ref_ns: u64,
    /// Nanoseconds per tick, fixed point with 32 fraction bits.
    ns_per_tick_q32: u64,
}

impl Clock {
    /// Measures the TSC rate against CLOCK_MONOTONIC over about 20 ms (sleeps).
    pub fn calibrate() -> Clock {
        Self::finish_calibration(Self::start_calibration())
    }

    /// The first half of [`calibrate`](Self::calibrate): a reference sample. The caller may
    /// do other work before [`finish_calibration`](Self::finish_calibration), which then only
    /// sleeps what remains of the 20 ms.
    pub fn start_calibration() -> ClockSample {
        let (tsc, ns) = Self::sample();
        ClockSample { tsc, ns }
    }

    /// The second half of [`calibrate`](Self::calibrate): sleeps until 20 ms have passed since
    /// `start` (if they have not), takes the second sample, and derives the rate.
    pub fn finish_calibration(start: ClockSample) -> Clock {
        const SPAN_NS: u64 = 20_000_000;
        let (tsc0, ns0) = (start.tsc, start.ns);
        let elapsed = monotonic_ns().saturating_sub(ns0);
        if elapsed < SPAN_NS {
            std::thread::sleep(std::time::Duration::from_nanos(SPAN_NS - elapsed));
        }
        let (tsc1, ns1) = Self::sample();
        let ticks = u128::from(tsc1.wrapping_sub(tsc0).max(1));
        let ns = u128::from(ns1.saturating_sub(ns0));
        let q32 = u64::try_from((ns << 32) / ticks).unwrap_or(u64::MAX);
        Clock {
            tsc_ref: tsc1,
            mono_ref_ns: ns1,
            ns_per_tick_q32: q32,
        }
    }

    /// A (tsc, monotonic ns) pair taken as close together as this CPU allows: the best of a few
    /// tries, the clock read bracketed by two TSC reads, attributed to their midpoint.
    fn sample() -> (u64, u64) {
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..16 {
            let t0 = read_tsc();
            let ns = monotonic_ns();
            let t1 = read_tsc();
            let width = t1.wrapping_sub(t0);
            if width < best.0 {
                best = (width, t0.wrapping_add(width / 2), ns);
            }
        }
        (best.1, best.2)
    }

    /// CLOCK_MONOTONIC nanoseconds at TSC value `tsc`.
    pub fn tsc_to_mono_ns(&self, tsc: u64) -> u64 {
        let ticks = i128::from(tsc) - i128::from(self.tsc_ref);
        // Saturating: a clock read from a damaged recording may be anything.
        let ns = i128::from(self.mono_ref_ns)
            .saturating_add(ticks.saturating_mul(i128::from(self.ns_per_tick_q32)) >> 32);
        u64::try_from(ns.max(0)).unwrap_or(u64::MAX)
    }

    /// The measured TSC frequency in Hz.
    pub fn tsc_hz(&self) -> u64 {
        let hz = (1_000_000_000u128 << 32) / u128::from(self.ns_per_tick_q32.max(1));
        u64::try_from(hz).unwrap_or(u64::MAX)
    }

    /// The conversion's numbers: the reference TSC, the reference CLOCK_MONOTONIC ns, and ns
    /// per tick with 32 fraction bits (what a recording stores).
    pub fn to_parts(&self) -> [u64; 3] {
        [self.tsc_ref, self.mono_ref_ns, self.ns_per_tick_q32]
    }

    /// The conversion [`to_parts`](Self::to_parts) gave.
    pub fn from_parts(parts: [u64; 3]) -> Clock {
        Clock {
            tsc_ref: parts[0],
            mono_ref_ns: parts[1],
            ns_per_tick_q32: parts[2],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::test_util::rings;

    #[test]
    fn clock_matches_monotonic() {
        let clock = Clock::calibrate();
        let hz = clock.tsc_hz();
        assert!((100_000_000..10_000_000_000).contains(&hz), "{hz} Hz");
        for _ in 0..2 {
            let (tsc, mono) = (read_tsc(), monotonic_ns());
            let conv = clock.tsc_to_mono_ns(tsc);
            assert!(conv.abs_diff(mono) < 1_000_000, "{conv} vs {mono}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let sr = rings(1, 4096);
        let c = sr.clock();
        let conv = c.tsc_to_mono_ns(read_tsc());
        assert!(conv.abs_diff(monotonic_ns()) < 1_000_000);
        // Before the reference, the conversion goes back in time (saturating at 0).
        assert_eq!(c.tsc_to_mono_ns(c.tsc_ref), c.mono_ref_ns);
        assert!(c.tsc_to_mono_ns(c.tsc_ref - 1_000_000) < c.mono_ref_ns);
    }
}
