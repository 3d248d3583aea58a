//! LLVM XRay exit sleds (`clang -fxray-instrument`): function exits without touching return
//! addresses.
//!
//! A function whose ftrace site is its XRay entry sled (see `elf::SiteSource::Xray`) also
//! has an exit sled before each `ret` and a tail sled before each tail jump. While a graph
//! user (`fgraph`) holds the function's entry, each of these sleds is patched to a
//! `jmp rel32` to a small stub of its own, and the graph entry pushes a *no-hijack* shadow
//! entry (`function_graph_enter_nohijack`): the return address is never changed, so
//! exceptions, longjmp and `backtrace()` see the program's own stack.
//!
//! ```text
//!   exit sled   c3 2e 66 0f 1f 84 00 00 02 00 00   ret; cs nopw 0x200(%rax,%rax,1)
//!     enabled   e9 <stub> ...                      jmp stub (bytes 5..11 never run)
//!   stub        e8 <trampoline>  c3                call trampoline; ret
//!
//!   tail sled   eb 09 66 0f 1f 84 00 00 02 00 00   jmp .+11; nopw 0x200(%rax,%rax,1)
//!     enabled   e9 <stub> ...                      jmp stub
//!   stub        e8 <trampoline>  e9 <sled + 11>    call trampoline; jmp to the tail jump
//! ```
//!
//! The trampoline is the ftrace argument-register one (it saves `rdi rsi rdx rcx r8 r9 rax
//! r10 xmm0-7`: the return values and a tail callee's arguments), one copy per function,
//! whose `ops` slot holds the function's address; it calls [`xray_exit_func`], which closes
//! the function's no-hijack entry (`function_graph_exit_nohijack`). At both sleds the stack
//! pointer is the function's return-address slot, as it was at the entry sled.
//!
//! Disabled, a sled holds exactly what clang wrote: its first 5 bytes are put back through
//! the int3 protocol (the int3 handler emulates the `ret`, `jmp rel8` or `jmp rel32`).
//!
//! The XRay runtime (`libclang_rt.xray`, linked by `-fxray-instrument` unless
//! `-fnoxray-link-deps`) patches nothing unless told to (`XRAY_OPTIONS=patch_premain=true`, or
//! the program calls `__xray_patch()`). Sleds it has patched before ftprobe starts no longer
//! look like sleds: ftprobe leaves those functions to it (no site, no exits). Sleds it
//! patches later, while ftprobe holds them, make ftprobe's next change of that site fail
//! with `SiteCorrupt` (nothing is written over them).

use super::fgraph;
use super::PtRegs;
use crate::arch::x86_64::sites::{is_xray_sled, XRAY_SLED_LEN};
use crate::elf::ElfImage;
use crate::probe_state;

/// One exit or tail sled of a function whose ftrace site is its XRay entry sled.
pub(super) struct XrayExit {
    /// The sled's first byte in this process.
    pub addr: u64,
    /// The function's start in this process (what its no-hijack entry records).
    pub func: u64,
    /// The ip of the function's entry site (its record).
    pub entry_ip: u64,
    /// A tail sled (falls through to a tail jump) rather than an exit sled (`ret`).
    pub tail: bool,
    /// The sled's first 5 bytes as clang wrote them.
    pub orig: [u8; 5],
    /// Its stub, once made (0 before).
    pub stub: u64,
    /// The object it belongs to (index in the ftrace state).
    pub obj: usize,
}

/// `ret` followed by a 10-byte NOP: an exit sled.
fn is_exit_sled(bytes: &[u8]) -> bool {
    let Some(sled) = bytes.get(..XRAY_SLED_LEN as usize) else {
        return false;
    };
    let mut dec = iced_x86::Decoder::with_ip(64, &sled[1..], 0, iced_x86::DecoderOptions::NONE);
    let nop = dec.decode();
    sled[0] == 0xc3 && nop.mnemonic() == iced_x86::Mnemonic::Nop && nop.len() == 10
}

/// The exit and tail sleds of `image` (loaded at `bias`, object `obj`) whose function has
/// its XRay entry sled as its site at one of `entry_ips` (`(function start, site ip)` in this
/// process, sorted). A function keeps its exits only if every one of them holds an unpatched
/// sled in memory; otherwise none (an exit the graph would miss). Reads memory without
/// faulting.
pub(super) fn exits_of(
    image: &ElfImage,
    bias: u64,
    obj: usize,
    entry_ips: &[(u64, u64)],
) -> Vec<XrayExit> {
    let mut out: Vec<XrayExit> = Vec::new();
    let mut bad: Vec<u64> = Vec::new();
    for s in image.xray.iter().filter(|s| s.kind.is_exit()) {
        let Some((fi, _)) = image.func_at(s.svma) else {
            continue;
        };
        let func = image.funcs()[fi].svma + bias;
        let Ok(k) = entry_ips.binary_search_by_key(&func, |e| e.0) else {
            continue;
        };
        let addr = s.svma + bias;
        let mut mem = [0u8; XRAY_SLED_LEN as usize];
        let tail = s.kind == crate::elf::XrayKind::Tail;
        let ok = crate::sys::read_nofault(addr, &mut mem) == mem.len()
            && if tail {
                is_xray_sled(&mem)
            } else {
                is_exit_sled(&mem)
            };
        if !ok {
            bad.push(func);
            continue;
        }
        out.push(XrayExit {
            addr,
            func,
            entry_ip: entry_ips[k].1,
            tail,
            orig: mem[..5].try_into().expect("5 bytes"),
            stub: 0,
            obj,
        });
    }
    out.retain(|e| !bad.contains(&e.func));
    out
}

/// The stub of a sled at `sled`, placed at `at`, calling `tramp` (see the module docs).
pub(super) fn stub_code(at: u64, sled: u64, tail: bool, tramp: u64) -> Option<Vec<u8>> {
    let rel = |from_end: u64, to: u64| i32::try_from(to as i64 - from_end as i64).ok();
    let mut code = vec![0xe8];
    code.extend(rel(at + 5, tramp)?.to_le_bytes());
    if tail {
        code.push(0xe9);
        code.extend(rel(at + 10, sled + XRAY_SLED_LEN)?.to_le_bytes());
    } else {
        code.push(0xc3);
    }
    Some(code)
}

/// Length of a stub: 6 bytes (exit) or 10 (tail).
pub(super) fn stub_len(tail: bool) -> usize {
    if tail {
        10
    } else {
        6
    }
}

/// `jmp rel32` from `sled` to `stub`.
pub(super) fn jmp_to(sled: u64, stub: u64) -> Option<[u8; 5]> {
    let r = i32::try_from(stub as i64 - (sled as i64 + 5))
        .ok()?
        .to_le_bytes();
    Some([0xe9, r[0], r[1], r[2], r[3]])
}

/// Probe path: an exit or tail sled of the function at `func` (the trampoline's `ops` slot)
/// was reached; `regs.sp` is its return-address slot. Closes the function's no-hijack
/// graph entry with the return registers, as the return trampoline would (`regs.sp` one
/// word above the slot, `regs.ip` the return address).
pub(super) unsafe extern "C" fn xray_exit_func(
    _ip: u64,
    _parent_ip: u64,
    func: *const (),
    regs: *mut PtRegs,
) {
    let t = probe_state::this_thread();
    let sp = probe_state::stack_pointer();
    let _ = t.enter(probe_state::Entry::Here(sp));
    // SAFETY: the trampoline's frame, live for this call.
    let regs = unsafe { &*regs };
    let mut ret = *regs;
    // SAFETY: regs.sp is the traced function's return-address slot on the live stack (the
    // stack pointer at its exit or tail sled).
    ret.ip = unsafe { *(regs.sp as *const u64) };
    ret.sp = regs.sp + 8;
    // The return callbacks run under the ftrace recursion guard, as from the return
    // trampoline: a traced function they call is not entered. The exit itself is always
    // closed.
    let guard = t.in_ftrace.get() == 0;
    if guard {
        t.in_ftrace.set(sp);
    }
    // SAFETY: probe path, from the exit sled of `func`; regs.sp as the entry's.
    unsafe { fgraph::function_graph_exit_nohijack(func as u64, regs.sp, &ret) };
    if guard {
        t.in_ftrace.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sled_shapes_and_stubs() {
        // ret; cs nopw 0x200(%rax,%rax,1)
        let exit = [
            0xc3, 0x2e, 0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x02, 0x00, 0x00,
        ];
        assert!(is_exit_sled(&exit));
        // jmp .+11; nopw 0x200(%rax,%rax,1): a tail (or entry) sled, not an exit sled
        let tail = [
            0xeb, 0x09, 0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x02, 0x00, 0x00,
        ];
        assert!(!is_exit_sled(&tail) && is_xray_sled(&tail));
        // mov $1,%r10d; jmp rel32 (the XRay runtime's patched exit): not a sled
        assert!(!is_exit_sled(&[0x41, 0xba, 1, 0, 0, 0, 0xe9, 0, 0, 0, 0]));
        // call 0x2000 (from 0x1000); ret
        assert_eq!(
            stub_code(0x1000, 0x500, false, 0x2000),
            Some(vec![0xe8, 0xfb, 0x0f, 0, 0, 0xc3])
        );
        // call 0x2000; jmp 0x50b (the sled at 0x500 + 11)
        assert_eq!(
            stub_code(0x1000, 0x500, true, 0x2000),
            Some(vec![0xe8, 0xfb, 0x0f, 0, 0, 0xe9, 0x01, 0xf5, 0xff, 0xff])
        );
        assert_eq!(
            stub_code(0x1000, 0x500, true, 0x2000).unwrap().len(),
            stub_len(true)
        );
        // jmp 0x1000 from 0x500: e9 fb 0a 00 00
        assert_eq!(jmp_to(0x500, 0x1000), Some([0xe9, 0xfb, 0x0a, 0, 0]));
    }
}
