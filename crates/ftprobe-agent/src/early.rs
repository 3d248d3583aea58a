//! Starting the agent before any other object's initializer runs.
//!
//! The dynamic loader runs initializers dependencies first (glibc `_dl_init`, in the order
//! `_dl_sort_maps` computed): a preloaded library depends on nothing of the program's, so
//! every library the program links (and its constructors, which may call traced functions,
//! `malloc`, ...) is initialized *before* the agent's own constructor. Calls made there were
//! lost.
//!
//! Relocation happens in the same order, before any initializer runs: when the loader
//! relocates the agent, every object that will be initialized before it is already
//! relocated, and none has run any code. The agent holds one GNU indirect function
//! (`ftprobe_agent_early`): the loader calls its resolver while it processes the agent's
//! `R_X86_64_IRELATIVE` relocation, which both GNU ld and lld put after every other dynamic
//! relocation, so the agent's GOT is complete by then. The resolver makes no allocation,
//! touches no thread-local (the TLS blocks are initialized after relocation), and only
//! redirects, in each object initialized before the agent, the *first* initializer the
//! loader will call (`DT_INIT`, else `DT_INIT_ARRAY[0]`) to a stub of ours. The first stub
//! called (the loader is in `_dl_init`: everything is relocated, libc is initialized) puts
//! every redirected entry back, starts the agent, and calls the initializer it replaced.
//! The agent's own constructor then finds it started.
//!
//! Not redirected: the loader itself, the vDSO, and the objects the agent needs initialized
//! first (its own `DT_NEEDED`: libc and libgcc_s; see [`AGENT_NEEDS`]). Objects with no
//! initializer need nothing. At most [`MAX_HOOKS`] objects are redirected; with more, the
//! ones past that start before the agent, and the agent says so on stderr.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Objects whose first initializer can be redirected.
pub const MAX_HOOKS: usize = 64;

/// Basename prefixes of the objects the agent itself needs initialized before it runs (its
/// `DT_NEEDED`, checked by a test), and of the loader and the vDSO.
pub const AGENT_NEEDS: &[&[u8]] = &[
    b"libc.so",
    b"libgcc_s.so",
    b"ld-linux",
    b"linux-vdso.so",
    b"linux-gate.so",
];

/// One redirected initializer.
struct Hook {
    /// Address of the word we replaced (the `d_ptr` of `DT_INIT`, or `DT_INIT_ARRAY[0]`).
    slot: AtomicU64,
    /// The word's original value.
    original: AtomicU64,
    /// The function the loader would have called (`l_addr + d_ptr`, or the array entry).
    function: AtomicU64,
    /// Protection of the slot's page after the write (`PROT_*`).
    prot: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Hook = Hook {
    slot: AtomicU64::new(0),
    original: AtomicU64::new(0),
    function: AtomicU64::new(0),
    prot: AtomicU64::new(0),
};

static HOOKS: [Hook; MAX_HOOKS] = [EMPTY; MAX_HOOKS];
/// Hooks in use: written by the resolver (one thread, before any code of the program ran).
static NR_HOOKS: AtomicUsize = AtomicUsize::new(0);
/// Objects with an initializer that could not be redirected (more than [`MAX_HOOKS`]).
static UNHOOKED: AtomicUsize = AtomicUsize::new(0);
/// The resolver ran.
static RESOLVED: AtomicBool = AtomicBool::new(false);
/// Set once, by whichever comes first: a stub, or the agent's own constructor.
static STARTED: AtomicBool = AtomicBool::new(false);

type InitFn = unsafe extern "C" fn(libc::c_int, *mut *mut libc::c_char, *mut *mut libc::c_char);

/// Claim the start: `true` for the first caller only.
pub fn claim_start() -> bool {
    !STARTED.swap(true, Ordering::AcqRel)
}

/// Whether the relocation-time resolver ran (the IFUNC was processed), and how many
/// objects' initializers could not be redirected.
pub fn status() -> (bool, usize) {
    (
        RESOLVED.load(Ordering::Acquire),
        UNHOOKED.load(Ordering::Relaxed),
    )
}

/// Put every redirected initializer back. Idempotent.
pub fn unhook_all() {
    let n = NR_HOOKS.swap(0, Ordering::AcqRel);
    for h in &HOOKS[..n] {
        let slot = h.slot.load(Ordering::Relaxed);
        if slot != 0 {
            write_word(
                slot,
                h.original.load(Ordering::Relaxed),
                h.prot.load(Ordering::Relaxed) as i32,
            );
        }
    }
}

/// Called by stub `i` in place of the object's first initializer.
fn fired(i: usize, argc: libc::c_int, argv: *mut *mut libc::c_char, env: *mut *mut libc::c_char) {
    let function = HOOKS[i].function.load(Ordering::Relaxed);
    unhook_all();
    if claim_start() {
        crate::start_agent();
    }
    if function != 0 {
        // SAFETY: the initializer the loader was about to call, with the loader's arguments.
        unsafe { std::mem::transmute::<usize, InitFn>(function as usize)(argc, argv, env) };
    }
}

macro_rules! stubs {
    ($($i:literal)*) => {
        /// One stub per hook: the loader calls a bare function pointer, so the hook is known
        /// by which stub runs.
        static STUBS: [InitFn; MAX_HOOKS] = [$({
            unsafe extern "C" fn stub(
                argc: libc::c_int,
                argv: *mut *mut libc::c_char,
                env: *mut *mut libc::c_char,
            ) {
                fired($i, argc, argv, env)
            }
            stub
        }),*];
    };
}
stubs!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
       32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
       62 63);

/// Write one word of a loaded object's read-only-after-relocation data, leaving its page
/// with `prot`.
fn write_word(addr: u64, value: u64, prot: i32) {
    let page = addr & !4095;
    // SAFETY: `addr` is a word inside a mapped segment of a loaded object (its dynamic
    // section or init array, found through its program headers); only the protection of
    // that page changes, back to what its segment says right after.
    unsafe {
        if libc::mprotect(page as *mut _, 4096, libc::PROT_READ | libc::PROT_WRITE) != 0 {
            return;
        }
        std::ptr::write_volatile(addr as *mut u64, value);
        libc::mprotect(page as *mut _, 4096, prot);
    }
}

/// `Elf64_Dyn` (ELF gABI): a tag and a value or address.
#[repr(C)]
struct Elf64Dyn {
    d_tag: i64,
    d_un: u64,
}
const DT_NULL: i64 = 0;
const DT_INIT: i64 = 12;
const DT_INIT_ARRAY: i64 = 25;
const DT_INIT_ARRAYSZ: i64 = 27;
const DT_PREINIT_ARRAYSZ: i64 = 33;

/// The basename of a NUL-terminated path.
fn basename(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// State of the walk over the loaded objects in the resolver.
struct Walk {
    /// The agent's own load address (found by an address inside it).
    own_text: u64,
    /// Seen the agent: objects after it are initialized before it.
    past_agent: bool,
}

/// `dl_iterate_phdr` callback: redirect the first initializer of each object that the
/// loader initializes before the agent.
unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info, and `data` is the `Walk` on the
    // resolver's stack.
    let (info, walk) = unsafe { (&*info, &mut *(data as *mut Walk)) };
    let bias = info.dlpi_addr;
    // SAFETY: the loader's program headers of this object, `dlpi_phnum` of them.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let contains = |a: u64| {
        phdrs.iter().any(|p| {
            p.p_type == libc::PT_LOAD && a >= bias + p.p_vaddr && a < bias + p.p_vaddr + p.p_memsz
        })
    };
    if contains(walk.own_text) {
        walk.past_agent = true;
        return 0;
    }
    if !walk.past_agent {
        return 0;
    }
    let name = if info.dlpi_name.is_null() {
        &b""[..]
    } else {
        // SAFETY: the loader's NUL-terminated name of the object.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
    };
    let base = basename(name);
    if base.is_empty() || AGENT_NEEDS.iter().any(|n| base.starts_with(n)) {
        return 0;
    }
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else {
        return 0;
    };
    // The protection a word of this object has after relocation: its segment's, without
    // write inside PT_GNU_RELRO.
    let prot_of = |a: u64| -> i32 {
        let mut prot = libc::PROT_READ;
        // Every segment on the word's page (old binaries share a page between segments).
        let page = a & !4095;
        for p in phdrs {
            if p.p_type == libc::PT_LOAD
                && page + 4096 > bias + p.p_vaddr
                && page < bias + p.p_vaddr + p.p_memsz
            {
                if p.p_flags & libc::PF_W != 0 {
                    prot |= libc::PROT_WRITE;
                }
                if p.p_flags & libc::PF_X != 0 {
                    prot |= libc::PROT_EXEC;
                }
            }
        }
        // The pages the loader made read-only (glibc `_dl_protect_relro`): from the page of
        // the segment's start to the page of its end, both rounded down (a last partial page
        // stays writable).
        let relro = phdrs.iter().any(|p| {
            p.p_type == libc::PT_GNU_RELRO
                && page >= ((bias + p.p_vaddr) & !4095)
                && page < ((bias + p.p_vaddr + p.p_memsz) & !4095)
        });
        if relro {
            prot &= !libc::PROT_WRITE;
        }
        prot
    };
    let mut init: Option<*mut u64> = None;
    let mut init_array: Option<u64> = None;
    let mut init_arraysz = 0u64;
    let mut d = (bias + dynamic.p_vaddr) as *mut Elf64Dyn;
    // SAFETY: the object's dynamic section, as mapped by the loader, ends with DT_NULL.
    unsafe {
        while (*d).d_tag != DT_NULL {
            match (*d).d_tag {
                DT_INIT => init = Some(std::ptr::addr_of_mut!((*d).d_un)),
                DT_INIT_ARRAY => init_array = Some((*d).d_un),
                DT_INIT_ARRAYSZ => init_arraysz = (*d).d_un,
                _ => {}
            }
            d = d.add(1);
        }
    }
    // DT_INIT runs first (glibc `call_init`); its d_ptr is relative to the load address,
    // which the loader adds when it calls it. DT_INIT_ARRAY's entries are absolute (the
    // object is relocated already).
    let (slot, original, function, relative) = match (init, init_array) {
        (Some(p), _) => {
            // SAFETY: the d_un word of the dynamic entry found above.
            let v = unsafe { *p };
            (p as u64, v, bias.wrapping_add(v), true)
        }
        (None, Some(a)) if init_arraysz >= 8 => {
            let slot = bias.wrapping_add(a);
            // SAFETY: the first entry of the object's init array, inside its mapping.
            let v = unsafe { *(slot as *const u64) };
            (slot, v, v, false)
        }
        _ => return 0,
    };
    let i = NR_HOOKS.load(Ordering::Relaxed);
    if i == MAX_HOOKS {
        UNHOOKED.fetch_add(1, Ordering::Relaxed);
        return 0;
    }
    let stub = STUBS[i] as usize as u64;
    let prot = prot_of(slot);
    let h = &HOOKS[i];
    h.slot.store(slot, Ordering::Relaxed);
    h.original.store(original, Ordering::Relaxed);
    h.function.store(function, Ordering::Relaxed);
    h.prot.store(prot as u64, Ordering::Relaxed);
    NR_HOOKS.store(i + 1, Ordering::Release);
    write_word(
        slot,
        if relative {
            stub.wrapping_sub(bias)
        } else {
            stub
        },
        prot,
    );
    0
}

/// The resolver of `ftprobe_agent_early`, run by the loader while it relocates the agent
/// (see the module docs). Returns the implementation: [`early_ran`].
#[no_mangle]
extern "C" fn ftprobe_agent_early_resolver() -> usize {
    if !RESOLVED.swap(true, Ordering::AcqRel) {
        let mut walk = Walk {
            own_text: ftprobe_agent_early_resolver as *const () as u64,
            past_agent: false,
        };
        // SAFETY: a callback that reads what the loader passes and writes only our statics;
        // `walk` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(visit), &mut walk as *mut Walk as *mut libc::c_void) };
    }
    early_ran as *const () as usize
}

/// What `ftprobe_agent_early` resolves to: whether the resolver ran.
extern "C" fn early_ran() -> bool {
    RESOLVED.load(Ordering::Acquire)
}

std::arch::global_asm!(
    ".globl ftprobe_agent_early",
    ".hidden ftprobe_agent_early",
    ".type ftprobe_agent_early, @gnu_indirect_function",
    ".set ftprobe_agent_early, ftprobe_agent_early_resolver",
);

extern "C" {
    /// The GNU indirect function whose relocation runs [`ftprobe_agent_early_resolver`].
    fn ftprobe_agent_early() -> bool;
}

/// Whether the relocation-time resolver ran (its IFUNC was bound).
pub fn resolver_ran() -> bool {
    // SAFETY: an IFUNC bound to `early_ran`, which takes nothing and reads an atomic.
    unsafe { ftprobe_agent_early() }
}

/// How many functions the executable's `DT_PREINIT_ARRAY` holds: the loader runs them before
/// any library is initialized, libc included, so before the agent can start (which needs
/// libc initialized); the agent says that calls made there are not traced.
pub fn executable_preinit_functions() -> u64 {
    // SAFETY: getauxval has no preconditions.
    let (phdr, phnum) = unsafe {
        (
            libc::getauxval(libc::AT_PHDR),
            libc::getauxval(libc::AT_PHNUM),
        )
    };
    if phdr == 0 {
        return 0;
    }
    // SAFETY: AT_PHDR/AT_PHNUM describe the executable's program headers, mapped by the
    // kernel for the process's whole life.
    let phdrs =
        unsafe { std::slice::from_raw_parts(phdr as *const libc::Elf64_Phdr, phnum as usize) };
    // The load bias: where PT_PHDR says the headers are against where they are.
    let Some(bias) = phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_PHDR)
        .map(|p| phdr.wrapping_sub(p.p_vaddr))
    else {
        return 0;
    };
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else {
        return 0;
    };
    let mut d = bias.wrapping_add(dynamic.p_vaddr) as *const Elf64Dyn;
    // SAFETY: the executable's dynamic section, mapped by the kernel, ends with DT_NULL.
    unsafe {
        while (*d).d_tag != DT_NULL {
            if (*d).d_tag == DT_PREINIT_ARRAYSZ {
                return (*d).d_un / 8;
            }
            d = d.add(1);
        }
    }
    0
}
