//! Canonical NOPs and the patched instruction of a site (the kernel's `ftrace_nop_replace()` and
//! `ftrace_call_replace()` in arch/x86/kernel/ftrace.c).
//!
//! Every site is 5 bytes once canonicalized. A 6-byte `call *__fentry__@GOTPCREL(%rip)` becomes a
//! NOP5 followed by a one-byte NOP, so `site+5` is an instruction boundary both when the site is
//! a NOP and when it is `call trampoline`: a thread returning from the trampoline to `site+5`
//! always lands on a whole instruction.

/// `nopl 0x0(%rax,%rax,1)`, the x86 `P6_NOP5` the kernel uses.
pub const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

/// One-byte NOP.
pub const NOP1: u8 = 0x90;

/// Length of every site once canonicalized (the kernel's `MCOUNT_INSN_SIZE`).
pub const SITE_LEN: u64 = 5;

/// `int3`.
pub const INT3: u8 = 0xcc;

/// `call rel32` from `site` to `target`, or `None` if `target` is out of rel32 reach.
pub fn call_rel32(site: u64, target: u64) -> Option<[u8; 5]> {
    let rel = (target as i64).wrapping_sub(site as i64 + SITE_LEN as i64);
    let rel = i32::try_from(rel).ok()?;
    let r = rel.to_le_bytes();
    Some([0xe8, r[0], r[1], r[2], r[3]])
}

/// The target of a `call rel32` at `site`, if `bytes` is one.
pub fn call_target(site: u64, bytes: &[u8; 5]) -> Option<u64> {
    (bytes[0] == 0xe8).then(|| {
        let rel = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        (site as i64 + SITE_LEN as i64 + rel as i64) as u64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_round_trip() {
        // call 0x401000 from 0x400000: e8 fb 0f 00 00
        let c = call_rel32(0x40_0000, 0x40_1000).unwrap();
        assert_eq!(c, [0xe8, 0xfb, 0x0f, 0x00, 0x00]);
        assert_eq!(call_target(0x40_0000, &c), Some(0x40_1000));
        // backwards: call 0x3ff000 from 0x400000: e8 fb ef ff ff
        let c = call_rel32(0x40_0000, 0x3f_f000).unwrap();
        assert_eq!(c, [0xe8, 0xfb, 0xef, 0xff, 0xff]);
        assert_eq!(call_target(0x40_0000, &c), Some(0x3f_f000));
        assert_eq!(call_rel32(0x40_0000, 0x7fff_0000_0000), None);
        assert_eq!(call_target(0, &NOP5), None);
    }
}
