//! int3 kprobes (arch/x86/kernel/kprobes/core.c): a breakpoint on any instruction boundary.
//!
//! Arming writes `int3` over the instruction's first byte. On a hit the SIGTRAP handler
//! (`text_poke`'s, which calls [`handle_trap`] for traps that are not its own) runs the
//! pre_handlers with `regs.ip = addr + 1`, then makes the thread execute the displaced
//! instruction: emulated in the handler (branches, calls, returns: no slot), or copied into an
//! XOL slot within rel32 reach (RIP-relative operands fixed up) that either ends with a `jmp`
//! back (boosted: no second trap) or with an `int3`, whose trap runs the post_handlers with
//! `regs.ip = addr + len` and resumes after the original instruction. A probe already running
//! on the thread (a handler hit another probe) counts `nmissed` and the instruction runs
//! without handlers, as the kernel's `reenter_kprobe()`.
//!
//! A `call`/`jmp` through memory (`call *(%rax)`, `call *foo@GOTPCREL(%rip)`,
//! `jmp *(%rax,%rcx,8)`) is emulated too, as uprobes accepts them: the handler computes the
//! operand's address from the interrupted registers (before the push, for `%rsp`-based
//! operands), reads the target with [`crate::sys::read_u64_nofault`], then pushes and jumps
//! as the instruction would. When that read fails the program must get exactly the fault it
//! would have had: the thread goes to the instruction's *fault slot*, the instruction
//! relocated followed by `jmp addr+len`, which faults at its first byte, and [`abort_xol`]
//! shows the fault at the probed instruction. The race: memory mapped by another thread
//! between the failed read and the copy's own access lets the copy succeed; a `call` then
//! returns through the slot's `jmp` (its callee sees a return address in the slot) and
//! on, and the hit runs no post_handler. And one difference while the read is a
//! `process_vm_readv`: that ignores memory protection keys, so a target in memory the
//! thread's PKRU denies is read and the call made, where the CPU would fault (a read by the
//! thread itself, in the handler, fails there and takes the fault slot, which runs with the
//! thread's own PKRU).
//!
//! Everything reached from [`handle_trap`] is async-signal-safe: published tables read with
//! atomics, no allocation, no lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{published, Kprobe, KprobeError};
use crate::arch::x86_64::insn::{self, Emulate, GpReg, XolPlan};
use crate::arch::x86_64::nops::INT3;
use crate::arch::x86_64::text_poke;
use crate::ftrace::{self as ft, PtRegs, SymbolAddr};
use crate::probe_state::{self, mask_word, Entry, Xol, SLOT_BLOCKED};

/// One armed address.
#[derive(Clone)]
struct Armed {
    addr: u64,
    orig: u8,
    len: u8,
    plan: XolPlan,
    /// XOL slot ending with `int3` (0 when emulated): used with post_handlers, or when the
    /// instruction may not be boosted.
    slot_step: u64,
    /// XOL slot ending with `jmp addr+len` (0 when not boostable). For an emulated
    /// `call`/`jmp` through memory: its fault slot, where the thread goes when the read of
    /// the operand fails (see the module docs).
    slot_boost: u64,
    /// The relocated instructions of the probe's optprobe detour, while it is (being)
    /// optimized: a hit of the int3 continues there instead of in a slot (the kernel's
    /// `setup_detour_execution()`), so no thread steps into the replaced bytes.
    detour_body: u64,
}

/// What the trap handler reads: the armed addresses, sorted.
struct Table {
    by_addr: Vec<Armed>,
}

/// One XOL slot. Slots are never freed (a thread may still be in one after its probe was
/// disarmed) and are reused when the same instruction is armed again.
#[derive(Clone, Copy)]
struct Slot {
    /// The slot's first byte.
    start: u64,
    /// Its last instruction: the final `int3` (non-boosted) or the `jmp` back (boosted).
    end: u64,
    /// The probed instruction, and the address after it.
    addr: u64,
    next: u64,
    /// Ends with `int3`.
    step: bool,
}

/// Every slot ever made, sorted by start: the trap handler recognises a slot's trap by the
/// slot, not by the probe table (a thread may reach it after the probe left the table), and
/// a fault handler maps a PC inside a slot back to the probed instruction.
struct Slots {
    by_start: Vec<Slot>,
}

impl Slots {
    /// The slot holding `pc`.
    fn containing(&self, pc: u64) -> Option<&Slot> {
        let i = self
            .by_start
            .partition_point(|s| s.start <= pc)
            .checked_sub(1)?;
        let s = &self.by_start[i];
        (pc <= s.end).then_some(s)
    }
}

struct Ctrl {
    armed: BTreeMap<u64, Armed>,
    /// The slots made for an address and its instruction's bytes: (step, boost).
    slots: BTreeMap<(u64, Vec<u8>), (u64, u64)>,
    all_slots: Vec<Slot>,
    /// Published tables: kept, never freed (a handler may still read one).
    #[allow(clippy::vec_box)]
    retired: Vec<Box<Table>>,
    #[allow(clippy::vec_box)]
    retired_slots: Vec<Box<Slots>>,
}

static CTRL: Mutex<Ctrl> = Mutex::new(Ctrl {
    armed: BTreeMap::new(),
    slots: BTreeMap::new(),
    all_slots: Vec::new(),
    retired: Vec::new(),
    retired_slots: Vec::new(),
});
static TABLE: AtomicPtr<Table> = AtomicPtr::new(std::ptr::null_mut());
static SLOTS: AtomicPtr<Slots> = AtomicPtr::new(std::ptr::null_mut());

fn publish(c: &mut Ctrl) {
    let by_addr: Vec<Armed> = c.armed.values().cloned().collect();
    let t = Box::into_raw(Box::new(Table { by_addr }));
    // Release pairs with the Acquire load in `handle_trap`.
    let old = TABLE.swap(t, Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: old came from Box::into_raw above; kept alive in `retired` for readers.
        c.retired.push(unsafe { Box::from_raw(old) });
    }
}

fn publish_slots(c: &mut Ctrl) {
    let mut by_start = c.all_slots.clone();
    by_start.sort_unstable_by_key(|s| s.start);
    let t = Box::into_raw(Box::new(Slots { by_start }));
    // Release pairs with the Acquire load in `slots`.
    let old = SLOTS.swap(t, Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: old came from Box::into_raw above; kept alive for readers.
        c.retired_slots.push(unsafe { Box::from_raw(old) });
    }
}

/// Probe path: every slot made so far.
fn slots() -> Option<&'static Slots> {
    // Acquire pairs with the Release swap in `publish_slots`.
    let p = SLOTS.load(Ordering::Acquire);
    // SAFETY: published slot tables are never freed (see Ctrl::retired_slots).
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Names on the probe path (the handler and what it calls): refused as targets, as the
/// kernel's NOKPROBE_SYMBOL list.
const BLACKLIST: &[&str] = &[
    "syscall",
    "prctl",
    "process_vm_readv",
    "getpid",
    "gettid",
    "__tls_get_addr",
    "raise",
    "sigaction",
    "__restore_rt",
    "membarrier",
    // errno is saved and restored around the SIGTRAP handler's work.
    "__errno_location",
];

/// Whether `name` (a raw symbol name) is the engine's own code, wherever it is linked: the
/// agent refuses its whole object by name, but a program may link the engine itself (the
/// Rust crate, `libftprobe.a`/`.so` of the C API): a probe there would trap inside the probe
/// path (the kernel's `__kprobes` section and NOKPROBE_SYMBOL). Rust names of the `ftprobe`
/// crates (legacy `_ZN7ftprobe`, `_ZN9ftprobe_c`, v0 `_R...7ftprobe`/`9ftprobe_c`) and the
/// `ftprobe_` C symbols.
fn is_engine_symbol(name: &str) -> bool {
    const CRATES: [&str; 2] = ["7ftprobe", "9ftprobe_c"];
    let rust = |rest: &str| CRATES.iter().any(|c| rest.starts_with(c));
    name.starts_with("ftprobe_")
        || name.strip_prefix("_ZN").is_some_and(rust)
        || name.strip_prefix("_R").is_some_and(|r| {
            // v0: the crate root is `C` + optional disambiguator `s..._` + length + name.
            r.find('C').is_some_and(|i| {
                let after = &r[i + 1..];
                let after = match after.strip_prefix('s') {
                    Some(d) => d.find('_').map_or(after, |j| &d[j + 1..]),
                    None => after,
                };
                rust(after)
            })
        })
}

/// Functions (and their glibc aliases) that glibc's `posix_spawn` child calls after it has
/// reset every signal handler to the default and before it execs (glibc
/// sysdeps/unix/sysv/linux/spawni.c, `__spawni_child`; found by probing each and watching
/// `system()`, `popen()` and `posix_spawn()` children die of SIGTRAP, and from the spawn
/// attributes and file actions that call the others). The kernel's uprobes handle their trap
/// in the kernel; ours needs our handler, which that child no longer has.
const SPAWN_CHILD: &[&str] = &[
    "execve",
    "__execve",
    "dup2",
    "__dup2",
    "sigprocmask",
    "__sigprocmask",
    "pthread_sigmask",
    "__pthread_sigmask",
    "__libc_sigaction",
    "_exit",
    "_Exit",
    "chdir",
    "fchdir",
    "setsid",
    "setpgid",
    "__setpgid",
    "sched_setparam",
    "sched_setscheduler",
    // Its file actions (posix_spawn_file_actions_addopen/addclose/addclosefrom_np/
    // addtcsetpgrp_np): glibc's internal open and close, and the closefrom fallback (found
    // by a user: a probe on __close_nocancel killed the child).
    "__open_nocancel",
    "__open64_nocancel",
    "__close_nocancel",
    "__close_nocancel_nostatus",
    "close_range",
    "__close_range",
    "closefrom",
    "__closefrom",
    "__closefrom_fallback",
    "getdents64",
    "__getdents64",
    "tcsetpgrp",
    "__tcsetpgrp",
    // The child's own function (internal: named by the debug file only).
    "__spawni_child",
];

fn lock() -> std::sync::MutexGuard<'static, Ctrl> {
    CTRL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The function's code as it is in the file: memory, with the int3s already armed in it
/// replaced by their original bytes, and `jumps` (optprobes' `jmp`s: where, what they
/// replaced) undone.
fn original_code(func: &SymbolAddr, c: &Ctrl, jumps: &[(u64, [u8; 5])]) -> Vec<u8> {
    // 16 bytes when the symbol has no size (one instruction at +0 is all that can be probed
    // then), which may run past the end of the mapping: read without faulting, and keep what
    // could be read.
    original_bytes(func.addr, func.size.max(16) as usize, c, jumps)
}

fn original_bytes(start: u64, len: usize, c: &Ctrl, jumps: &[(u64, [u8; 5])]) -> Vec<u8> {
    let mut code = vec![0u8; len];
    let len = crate::sys::read_nofault(start, &mut code);
    code.truncate(len);
    for (a, orig) in jumps {
        for (k, b) in orig.iter().enumerate() {
            let at = a.wrapping_add(k as u64).wrapping_sub(start);
            if let Some(slot) = code.get_mut(at as usize) {
                *slot = *b;
            }
        }
    }
    for (a, armed) in c.armed.range(start..start + len as u64) {
        code[(a - start) as usize] = armed.orig;
    }
    code
}

/// [`original_code`] for `kprobes::opt`.
pub(super) fn function_code(func: &SymbolAddr, jumps: &[(u64, [u8; 5])]) -> Vec<u8> {
    original_code(func, &lock(), jumps)
}

/// The original code of `start .. start + len` (int3s and `jumps` undone), as far as mapped.
pub(super) fn code_range(start: u64, len: usize, jumps: &[(u64, [u8; 5])]) -> Vec<u8> {
    original_bytes(start, len, &lock(), jumps)
}

/// SIGTRAP handlers in [`handle_trap`], by the parity of [`TRAP_EPOCH`] they started in
/// (a user-space SRCU: [`synchronize_traps`] waits for the ones that may hold an older
/// table).
static TRAP_READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static TRAP_EPOCH: AtomicUsize = AtomicUsize::new(0);

/// Wait until every SIGTRAP handler that may have read a table published before this call
/// is done (those that start later read the new one).
pub(super) fn synchronize_traps() {
    // SeqCst, with the SeqCst increment in `handle_trap`: a handler counted in the old half
    // after the wait below read it as zero loads the table after that, so after the publish.
    let old = TRAP_EPOCH.fetch_add(1, Ordering::SeqCst) & 1;
    while TRAP_READERS[old].load(Ordering::SeqCst) != 0 {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// The armed int3 addresses in `lo..hi`.
pub(super) fn armed_in(lo: u64, hi: u64) -> Vec<u64> {
    lock().armed.range(lo..hi).map(|(a, _)| *a).collect()
}

/// The XOL slots made for `addr`, as `start..end` ranges (a thread inside one will continue
/// at the instruction after `addr`).
pub(super) fn slot_ranges(addr: u64) -> Vec<(u64, u64)> {
    let c = lock();
    c.all_slots
        .iter()
        .filter(|s| s.addr == addr)
        .map(|s| (s.start, s.end + 5))
        .collect()
}

/// Send hits of the int3 at `addr` to a detour's relocated instructions (`body`), or back to
/// the XOL slot (0). Returns whether `addr` is armed.
pub(super) fn set_detour(addr: u64, body: u64) -> bool {
    let mut c = lock();
    let Some(a) = c.armed.get_mut(&addr) else {
        return false;
    };
    if a.detour_body != body {
        a.detour_body = body;
        publish(&mut c);
    }
    true
}

/// Check that `addr` can take an int3 probe and arm it (idempotent for an armed address).
pub(super) fn arm(
    addr: u64,
    func: &SymbolAddr,
    jumps: &[(u64, [u8; 5])],
) -> Result<(), KprobeError> {
    let mut c = lock();
    if c.armed.contains_key(&addr) {
        return Ok(());
    }
    // By every name of the function: glibc exports most of these under two (`sigaction`,
    // `__sigaction`), and the symbol table may give either.
    let mut names = ft::names_at(func.addr);
    names.push(func.name.clone());
    let named = |list: &[&str]| names.iter().any(|n| list.contains(&n.as_str()));
    if ft::is_ftprobe_code(addr)
        || ft::module_of(addr).is_some_and(|m| m.starts_with("libftprobe_agent"))
        || named(BLACKLIST)
        || names.iter().any(|n| is_engine_symbol(n))
    {
        return Err(KprobeError::Blacklisted(format!(
            "{}+{:#x}",
            crate::elf::display_name(&func.name),
            addr - func.addr
        )));
    }
    if named(SPAWN_CHILD) && ft::module_of(addr).is_some_and(|m| m.starts_with("libc.so")) {
        return Err(KprobeError::SpawnChild(format!(
            "{}+{:#x}",
            crate::elf::display_name(&func.name),
            addr - func.addr
        )));
    }
    let code = original_code(func, &c, jumps);
    // Classify first (the slot's address matters only to RIP-relative operands).
    let plan = insn::plan(&code, func.addr, addr, addr).map_err(KprobeError::from)?;
    let len = match &plan {
        XolPlan::Xol { len, .. } | XolPlan::Emulate { len, .. } => *len,
    };
    let (mut slot_step, mut slot_boost) = (0, 0);
    if let XolPlan::Xol { boostable, .. } = plan {
        let off = (addr - func.addr) as usize;
        let key = (addr, code[off..off + len as usize].to_vec());
        if let Some(&(step, boost)) = c.slots.get(&key) {
            (slot_step, slot_boost) = (step, boost);
        } else {
            slot_step = xol_slot(&code, func.addr, addr, false)?;
            if boostable {
                slot_boost = xol_slot(&code, func.addr, addr, true)?;
            }
            let code_len = xol_code_len(&plan) as u64;
            let next = addr + len as u64;
            c.all_slots.push(Slot {
                start: slot_step,
                end: slot_step + code_len,
                addr,
                next,
                step: true,
            });
            if slot_boost != 0 {
                c.all_slots.push(Slot {
                    start: slot_boost,
                    end: slot_boost + code_len,
                    addr,
                    next,
                    step: false,
                });
            }
            c.slots.insert(key, (slot_step, slot_boost));
            publish_slots(&mut c);
        }
    } else if let XolPlan::Emulate {
        insn: Emulate::CallMem { .. } | Emulate::JmpMem { .. },
        ..
    } = plan
    {
        let off = (addr - func.addr) as usize;
        let key = (addr, code[off..off + len as usize].to_vec());
        if let Some(&(_, fault)) = c.slots.get(&key) {
            slot_boost = fault;
        } else {
            let (fault, copy_len) = fault_slot(&code, func.addr, addr, len)?;
            slot_boost = fault;
            c.all_slots.push(Slot {
                start: fault,
                end: fault + copy_len as u64,
                addr,
                next: addr + len as u64,
                step: false,
            });
            c.slots.insert(key, (0, fault));
            publish_slots(&mut c);
        }
    }
    ft::check_code(addr)?;
    if slot_step != 0 || slot_boost != 0 {
        // A fault in a slot is shown at the probed instruction, and resets the slot state.
        text_poke::install_fault_handlers(abort_xol).map_err(|e| KprobeError::Ftrace(e.into()))?;
        // An asynchronous signal in a slot is shown at the probed instruction too.
        text_poke::wrap_program_handlers(Some(shown_pc))
            .map_err(|e| KprobeError::Ftrace(e.into()))?;
    }
    let orig = code[(addr - func.addr) as usize];
    c.armed.insert(
        addr,
        Armed {
            addr,
            orig,
            len,
            plan,
            slot_step,
            slot_boost,
            detour_body: 0,
        },
    );
    publish(&mut c);
    text_poke::set_trap_hook(handle_trap);
    // SAFETY: addr is an instruction boundary (insn::plan checked it by decoding the function
    // from its start) in code made writable above; int3 is a whole instruction.
    if let Err(e) = unsafe { text_poke::poke_byte(addr, INT3) } {
        c.armed.remove(&addr);
        publish(&mut c);
        return Err(KprobeError::Ftrace(e.into()));
    }
    Ok(())
}

/// Bytes of the relocated instruction in a slot.
fn xol_code_len(plan: &XolPlan) -> usize {
    match plan {
        XolPlan::Xol { code, .. } => code.len(),
        XolPlan::Emulate { .. } => 0,
    }
}

/// Make an XOL slot near `addr`: the instruction relocated for the slot's address, then
/// `jmp addr+len` (`boost`) or `int3`.
fn xol_slot(code: &[u8], func_addr: u64, addr: u64, boost: bool) -> Result<u64, KprobeError> {
    let mut planned: Option<Result<(), insn::InsnError>> = None;
    let slot = ft::alloc_code_near(addr, 15 + 5, |slot| {
        match insn::plan(code, func_addr, addr, slot) {
            Ok(XolPlan::Xol { code, len, .. }) => {
                planned = Some(Ok(()));
                let mut bytes = code.clone();
                if boost {
                    let back = crate::arch::x86_64::nops::call_rel32(
                        slot + code.len() as u64,
                        addr + len as u64,
                    )
                    .map(|mut c| {
                        c[0] = 0xe9; // jmp rel32: same encoding as call but the opcode
                        c
                    });
                    match back {
                        Some(j) => bytes.extend_from_slice(&j),
                        None => bytes.push(INT3),
                    }
                } else {
                    bytes.push(INT3);
                }
                bytes
            }
            Ok(XolPlan::Emulate { .. }) => {
                planned = Some(Ok(()));
                vec![INT3]
            }
            Err(e) => {
                planned = Some(Err(e));
                vec![INT3]
            }
        }
    })?;
    planned.expect("alloc_code_near calls make")?;
    Ok(slot)
}

/// Make the fault slot of an emulated `call`/`jmp` through memory near `addr`: the
/// instruction (RIP-relative operand fixed up), then `jmp addr+len`. Returns the slot and the
/// length of the copy.
fn fault_slot(
    code: &[u8],
    func_addr: u64,
    addr: u64,
    len: u8,
) -> Result<(u64, usize), KprobeError> {
    let mut planned: Option<Result<usize, KprobeError>> = None;
    let slot = ft::alloc_code_near(addr, 15 + 5, |slot| {
        let copy = insn::mem_branch_copy(code, func_addr, addr, slot).map_err(KprobeError::from);
        let back = copy.as_ref().ok().and_then(|c| {
            crate::arch::x86_64::nops::call_rel32(slot + c.len() as u64, addr + len as u64)
        });
        match (copy, back) {
            (Ok(mut bytes), Some(mut jmp)) => {
                planned = Some(Ok(bytes.len()));
                jmp[0] = 0xe9; // jmp rel32: same encoding as call but the opcode
                bytes.extend_from_slice(&jmp);
                bytes
            }
            (Err(e), _) => {
                planned = Some(Err(e));
                vec![INT3]
            }
            (Ok(_), None) => {
                planned = Some(Err(KprobeError::from(insn::InsnError::OutOfReach {
                    target: addr + len as u64,
                })));
                vec![INT3]
            }
        }
    })?;
    let copy_len = planned.expect("alloc_code_near calls make")?;
    Ok((slot, copy_len))
}

/// Put the original byte back (the slot stays: a thread may still be in it).
pub(super) fn disarm(addr: u64) -> Result<(), KprobeError> {
    let mut c = lock();
    let Some(a) = c.armed.get(&addr) else {
        return Ok(());
    };
    // SAFETY: addr holds the int3 `arm` wrote over this original byte.
    unsafe { text_poke::poke_byte(addr, a.orig) }.map_err(|e| KprobeError::Ftrace(e.into()))?;
    c.armed.remove(&addr);
    publish(&mut c);
    Ok(())
}

/// Forget the armed addresses in `ranges` (objects that were unloaded) without writing:
/// their code is not mapped any more (the kernel's `kill_kprobe()` for a going module's
/// probes). Slots stay (never freed).
pub(super) fn forget(ranges: &[(u64, u64)]) {
    let mut c = lock();
    let before = c.armed.len();
    c.armed
        .retain(|a, _| !ranges.iter().any(|&(lo, hi)| *a >= lo && *a < hi));
    if c.armed.len() != before {
        publish(&mut c);
    }
}

// ---- probe path ------------------------------------------------------------------------

fn to_regs(g: &[libc::greg_t; 23]) -> PtRegs {
    let r = |i: libc::c_int| g[i as usize] as u64;
    PtRegs {
        r15: r(libc::REG_R15),
        r14: r(libc::REG_R14),
        r13: r(libc::REG_R13),
        r12: r(libc::REG_R12),
        rbp: r(libc::REG_RBP),
        rbx: r(libc::REG_RBX),
        r11: r(libc::REG_R11),
        r10: r(libc::REG_R10),
        r9: r(libc::REG_R9),
        r8: r(libc::REG_R8),
        rax: r(libc::REG_RAX),
        rcx: r(libc::REG_RCX),
        rdx: r(libc::REG_RDX),
        rsi: r(libc::REG_RSI),
        rdi: r(libc::REG_RDI),
        orig_rax: u64::MAX,
        ip: r(libc::REG_RIP),
        cs: 0x33,
        flags: r(libc::REG_EFL),
        sp: r(libc::REG_RSP),
        ss: 0x2b,
    }
}

fn from_regs(g: &mut [libc::greg_t; 23], regs: &PtRegs) {
    let mut w = |i: libc::c_int, v: u64| g[i as usize] = v as libc::greg_t;
    w(libc::REG_R15, regs.r15);
    w(libc::REG_R14, regs.r14);
    w(libc::REG_R13, regs.r13);
    w(libc::REG_R12, regs.r12);
    w(libc::REG_RBP, regs.rbp);
    w(libc::REG_RBX, regs.rbx);
    w(libc::REG_R11, regs.r11);
    w(libc::REG_R10, regs.r10);
    w(libc::REG_R9, regs.r9);
    w(libc::REG_R8, regs.r8);
    w(libc::REG_RAX, regs.rax);
    w(libc::REG_RCX, regs.rcx);
    w(libc::REG_RDX, regs.rdx);
    w(libc::REG_RSI, regs.rsi);
    w(libc::REG_RDI, regs.rdi);
    w(libc::REG_RIP, regs.ip);
    w(libc::REG_RSP, regs.sp);
    w(libc::REG_EFL, regs.flags);
}

fn gp(regs: &mut PtRegs, r: GpReg) -> &mut u64 {
    match r.index() {
        0 => &mut regs.rax,
        1 => &mut regs.rcx,
        2 => &mut regs.rdx,
        3 => &mut regs.rbx,
        4 => &mut regs.sp,
        5 => &mut regs.rbp,
        6 => &mut regs.rsi,
        7 => &mut regs.rdi,
        8 => &mut regs.r8,
        9 => &mut regs.r9,
        10 => &mut regs.r10,
        11 => &mut regs.r11,
        12 => &mut regs.r12,
        13 => &mut regs.r13,
        14 => &mut regs.r14,
        _ => &mut regs.r15,
    }
}

/// The target of a `call`/`jmp` through `mem`, read without faulting; `None` when it cannot
/// be read, or is not canonical (48-bit): the CPU raises #GP at the instruction itself then,
/// before any push, which the fault slot reproduces exactly (a target above 47 bits on a
/// 5-level-paging machine takes the slot too, where it works).
fn mem_target(mem: insn::MemOperand, regs: &mut PtRegs) -> Option<u64> {
    let at = mem.address(|r| *gp(regs, r));
    crate::sys::read_u64_nofault(at).filter(|&to| ((to as i64) << 16) >> 16 == to as i64)
}

/// Execute an emulated instruction on `regs` (the kernel's `int3_emulate_*`). Returns false,
/// with `regs` unchanged, when a `call`/`jmp` through memory cannot read its target: the
/// caller runs the instruction from its fault slot instead.
fn emulate(e: &Emulate, addr: u64, len: u64, regs: &mut PtRegs) -> bool {
    let next = addr + len;
    let push = |regs: &mut PtRegs, v: u64| {
        regs.sp -= 8;
        // SAFETY: the thread's stack below sp: what the call instruction itself would write.
        unsafe { std::ptr::write_volatile(regs.sp as *mut u64, v) };
    };
    regs.ip = match *e {
        Emulate::CallRel { target } => {
            push(regs, next);
            target
        }
        Emulate::JmpRel { target } => target,
        Emulate::Jcc { cond, target } => {
            if cond.holds(regs.flags) {
                target
            } else {
                next
            }
        }
        Emulate::Loop {
            kind,
            target,
            addr32,
        } => {
            if insn::loop_taken(kind, addr32, &mut regs.rcx, regs.flags) {
                target
            } else {
                next
            }
        }
        Emulate::Ret { pop } => {
            // SAFETY: the return address at sp, which the ret instruction itself would read.
            let to = unsafe { std::ptr::read_volatile(regs.sp as *const u64) };
            regs.sp += 8 + pop as u64;
            to
        }
        Emulate::CallReg { reg } => {
            let to = *gp(regs, reg);
            push(regs, next);
            to
        }
        Emulate::JmpReg { reg } => *gp(regs, reg),
        Emulate::CallMem { mem } => {
            // The operand's address from the registers before the push (`call *8(%rsp)`).
            let Some(to) = mem_target(mem, regs) else {
                return false;
            };
            push(regs, next);
            to
        }
        Emulate::JmpMem { mem } => {
            let Some(to) = mem_target(mem, regs) else {
                return false;
            };
            to
        }
        Emulate::Nop => next,
    };
    true
}

fn run_post(probes: &[&'static Kprobe], regs: &mut PtRegs, t: &probe_state::ThreadState) {
    for p in probes.iter().filter(|p| !p.is_disabled()) {
        if let Some(post) = p.post_handler {
            t.kprobe.set(*p as *const Kprobe);
            post(p, regs, 0);
        }
    }
}

/// Probe path: a SIGTRAP that is not a text_poke batch's. Returns whether it was ours.
pub(super) fn handle_trap(uc: &mut libc::ucontext_t) -> bool {
    let e = TRAP_EPOCH.load(Ordering::SeqCst) & 1;
    TRAP_READERS[e].fetch_add(1, Ordering::SeqCst);
    let ours = handle_trap_counted(uc);
    TRAP_READERS[e].fetch_sub(1, Ordering::Release);
    ours
}

fn handle_trap_counted(uc: &mut libc::ucontext_t) -> bool {
    let trap = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64 - 1;
    let st = probe_state::this_thread();
    // This thread's slot, done: the post_handlers, then on after the probed instruction.
    let x = st.xol.get();
    if x.addr != 0 && trap == x.slot_trap {
        st.xol.set(Xol::NONE);
        let mut regs = to_regs(&uc.uc_mcontext.gregs);
        regs.ip = x.next;
        if x.post_due {
            if let Some(probes) = published().and_then(|l| l.get(x.addr)) {
                run_post(probes, &mut regs, st);
            }
        }
        st.kprobe.set(std::ptr::null());
        st.kprobe_sp.set(0);
        *mask_word(&mut uc.uc_sigmask) &= !x.added_mask;
        from_regs(&mut uc.uc_mcontext.gregs, &regs);
        return true;
    }
    // Another slot's trap: a re-entered hit's, or a thread that was in the slot when its
    // probe was disarmed: on after the instruction, no handlers.
    if let Some(s) = slots().and_then(|s| s.containing(trap)) {
        if s.step && trap == s.end {
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] = s.next as i64;
            return true;
        }
    }
    // Acquire pairs with the Release swap in `publish`.
    let t = TABLE.load(Ordering::Acquire);
    if t.is_null() {
        return false;
    }
    // SAFETY: published tables are never freed (see Ctrl::retired).
    let t = unsafe { &*t };
    let Ok(i) = t.by_addr.binary_search_by_key(&trap, |a| a.addr) else {
        return false;
    };
    let unblock = st.enter(Entry::Interrupted(uc));
    *mask_word(&mut uc.uc_sigmask) &= !unblock;
    hit(&t.by_addr[i], uc, st);
    true
}

fn hit(a: &Armed, uc: &mut libc::ucontext_t, st: &probe_state::ThreadState) {
    let probes: &[&'static Kprobe] = published().and_then(|l| l.get(a.addr)).unwrap_or(&[]);
    let mut regs = to_regs(&uc.uc_mcontext.gregs);
    let reentered = !st.kprobe.get().is_null();
    let has_post = probes
        .iter()
        .any(|p| !p.is_disabled() && p.post_handler.is_some());
    let clear = |st: &probe_state::ThreadState| {
        st.kprobe.set(std::ptr::null());
        st.kprobe_sp.set(0);
    };
    if reentered {
        // The engine's own work (`KprobeBusy`) is not the program's: not counted at all.
        if st.kprobe.get() != probe_state::KPROBE_BUSY {
            for p in probes.iter().filter(|p| !p.is_disabled()) {
                p.note_missed();
            }
        }
    } else {
        st.kprobe_sp.set(regs.sp);
        regs.ip = a.addr + 1;
        for p in probes.iter().filter(|p| !p.is_disabled()) {
            st.kprobe.set(*p as *const Kprobe);
            if let Some(pre) = p.pre_handler {
                if pre(p, &mut regs) != 0 {
                    // The handler moved ip: continue there, skip the instruction.
                    clear(st);
                    from_regs(&mut uc.uc_mcontext.gregs, &regs);
                    return;
                }
            }
        }
    }
    if a.detour_body != 0 {
        // Being optimized (no post_handlers then): on in the detour, past the replaced bytes.
        regs.ip = a.detour_body;
        if !reentered {
            clear(st);
        }
        from_regs(&mut uc.uc_mcontext.gregs, &regs);
        return;
    }
    match &a.plan {
        XolPlan::Emulate { insn, .. } => {
            if !emulate(insn, a.addr, a.len as u64, &mut regs) {
                // A call/jmp through memory whose target cannot be read: the instruction
                // itself, from its fault slot, raises the fault the program would have had
                // (shown at addr by `abort_xol`). No post_handler: the instruction faults.
                regs.ip = a.slot_boost;
                if !reentered {
                    clear(st);
                }
                from_regs(&mut uc.uc_mcontext.gregs, &regs);
                return;
            }
            if !reentered {
                if has_post {
                    run_post(probes, &mut regs, st);
                }
                clear(st);
            }
        }
        XolPlan::Xol { code, .. } => {
            if a.slot_boost != 0 && (reentered || !has_post) {
                // The boosted slot jumps back by itself: no second trap.
                regs.ip = a.slot_boost;
                if !reentered {
                    clear(st);
                }
            } else {
                regs.ip = a.slot_step;
                if !reentered {
                    // Until the slot's trap: asynchronous signals wait (see SLOT_BLOCKED).
                    let m = mask_word(&mut uc.uc_sigmask);
                    let added = SLOT_BLOCKED & !*m;
                    *m |= added;
                    st.xol.set(Xol {
                        addr: a.addr,
                        next: a.addr + a.len as u64,
                        slot: a.slot_step,
                        slot_trap: a.slot_step + code.len() as u64,
                        post_due: has_post,
                        added_mask: added,
                    });
                }
            }
        }
    }
    from_regs(&mut uc.uc_mcontext.gregs, &regs);
}

/// How the first relocated instruction of an optprobe's detour runs alone, for a thread
/// that a program's signal interrupted after the hit and before that instruction
/// (`opt::on_program_signal`): as an int3 hit of the same probe would run it.
#[derive(Clone, Copy, Debug)]
pub(super) enum FirstInsn {
    /// From the probe's step slot, which ends with `int3` at `trap`.
    Step { slot: u64, trap: u64 },
    /// Emulated; `len` is the instruction's length.
    Emulate { insn: Emulate, len: u8 },
}

/// How the instruction of the armed probe at `addr` runs alone (`None`: not armed, or no
/// step slot).
pub(super) fn first_insn(addr: u64) -> Option<FirstInsn> {
    let c = lock();
    let a = c.armed.get(&addr)?;
    match &a.plan {
        XolPlan::Xol { code, .. } if a.slot_step != 0 => Some(FirstInsn::Step {
            slot: a.slot_step,
            trap: a.slot_step + code.len() as u64,
        }),
        XolPlan::Emulate { insn, .. } => Some(FirstInsn::Emulate {
            insn: *insn,
            len: a.len,
        }),
        XolPlan::Xol { .. } => None,
    }
}

/// Probe path: the thread of context `uc` stands at the first relocated instruction of the
/// detour of the probe at `addr`, its hit done. Run that instruction alone, then go on at
/// `resume` (the detour's next instruction): emulated at once (returns false), or from the
/// step slot with the asynchronous signals and `held` (first mask word bits) blocked until
/// the slot's trap, as after an int3 hit (returns true: the caller queues the held signal
/// again, and it is delivered after the instruction).
pub(super) fn run_alone(
    uc: &mut libc::ucontext_t,
    addr: u64,
    first: FirstInsn,
    resume: u64,
    held: u64,
) -> bool {
    match first {
        FirstInsn::Step { slot, trap } => {
            let st = probe_state::this_thread();
            if st.xol.get().addr != 0 {
                return false;
            }
            let m = mask_word(&mut uc.uc_sigmask);
            let added = (SLOT_BLOCKED | held) & !*m;
            *m |= added;
            st.xol.set(Xol {
                addr,
                next: resume,
                slot,
                slot_trap: trap,
                post_due: false,
                added_mask: added,
            });
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] = slot as libc::greg_t;
            true
        }
        FirstInsn::Emulate { insn, len } => {
            let mut regs = to_regs(&uc.uc_mcontext.gregs);
            if emulate(&insn, addr, u64::from(len), &mut regs) {
                if regs.ip == addr + u64::from(len) {
                    regs.ip = resume;
                }
                from_regs(&mut uc.uc_mcontext.gregs, &regs);
            }
            false
        }
    }
}

/// Probe path, a fault signal the kernel raised (`SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`):
/// if the thread faulted inside an XOL slot, the program is shown the probed instruction's
/// address instead (uprobes' `arch_uprobe_abort_xol`): the instruction's own address when it
/// faulted, the one after it when the slot had already executed it; and the thread's slot
/// state is dropped (its handler may leave by a non-local exit; if it returns, the thread
/// runs the instruction again from its own address, through the probe). Returns whether the
/// PC was in a slot.
pub(crate) fn abort_xol(uc: &mut libc::ucontext_t) -> bool {
    let pc = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    if let Some(shown) = super::opt::fault_pc(pc) {
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] = shown as i64;
        return true;
    }
    let Some(s) = slots().and_then(|s| s.containing(pc)) else {
        return false;
    };
    let st = probe_state::this_thread();
    let x = st.xol.get();
    if x.addr != 0 && x.slot == s.start {
        st.xol.set(Xol::NONE);
        st.kprobe.set(std::ptr::null());
        st.kprobe_sp.set(0);
        *mask_word(&mut uc.uc_sigmask) &= !x.added_mask;
    }
    let shown = if pc == s.start { s.addr } else { s.next };
    uc.uc_mcontext.gregs[libc::REG_RIP as usize] = shown as i64;
    true
}

/// Probe path, an asynchronous signal's handler: the address the program is shown for `pc`
/// when it is inside an XOL slot (the probed instruction's before the slot ran it, the next
/// one's at the slot's `jmp` back or final `int3`), 0 otherwise.
pub(crate) fn shown_pc(pc: u64) -> u64 {
    if let Some(shown) = super::opt::shown_pc(pc) {
        return shown;
    }
    match slots().and_then(|s| s.containing(pc)) {
        Some(s) if pc == s.start => s.addr,
        Some(s) => s.next,
        None => 0,
    }
}
