/* insn_zoo: small functions, in assembly, holding one instruction of each class an int3
 * kprobe must emulate or refuse (see crates/ftprobe/tests/kprobes.rs). No ftrace sites. */
long zoo_data = 41;
long (*zoo_ptr)(long);

__asm__(
    ".text\n"
    ".globl zoo_helper\n .type zoo_helper,@function\n"
    "zoo_helper:\n lea 1(%rdi),%rax\n ret\n .size zoo_helper,.-zoo_helper\n"

    /* jcc rel8 and rel32: x < 10 ? 1 : 2 */
    ".globl zoo_jcc\n .type zoo_jcc,@function\n"
    "zoo_jcc:\n mov $1,%eax\n cmp $10,%rdi\n jl 1f\n mov $2,%eax\n"
    " cmp $100,%rdi\n {disp32} jl 1f\n mov $3,%eax\n1: ret\n .size zoo_jcc,.-zoo_jcc\n"

    /* loop: returns n (n >= 1) */
    ".globl zoo_loop\n .type zoo_loop,@function\n"
    "zoo_loop:\n mov %rdi,%rcx\n xor %eax,%eax\n1: inc %rax\n loop 1b\n ret\n .size zoo_loop,.-zoo_loop\n"

    /* jrcxz: 0 if n == 0, else 5 */
    ".globl zoo_jrcxz\n .type zoo_jrcxz,@function\n"
    "zoo_jrcxz:\n mov %rdi,%rcx\n xor %eax,%eax\n jrcxz 1f\n mov $5,%eax\n1: ret\n .size zoo_jrcxz,.-zoo_jrcxz\n"

    /* call rel32, call *%reg, jmp rel8, jmp *%reg: x + 1 + 1 */
    ".globl zoo_calls\n .type zoo_calls,@function\n"
    "zoo_calls:\n push %rbx\n call zoo_helper\n mov %rax,%rdi\n lea zoo_helper(%rip),%rbx\n call *%rbx\n"
    " jmp 1f\n ud2\n1: pop %rbx\n mov %rax,%rdi\n lea zoo_helper(%rip),%rax\n jmp *%rax\n .size zoo_calls,.-zoo_calls\n"

    /* ret $8 through a caller that pushed a word: returns x */
    ".globl zoo_retimm\n .type zoo_retimm,@function\n"
    "zoo_retimm:\n push $0\n call zoo_retimm_inner\n ret\n .size zoo_retimm,.-zoo_retimm\n"
    ".globl zoo_retimm_inner\n .type zoo_retimm_inner,@function\n"
    "zoo_retimm_inner:\n mov %rdi,%rax\n ret $8\n .size zoo_retimm_inner,.-zoo_retimm_inner\n"

    /* RIP-relative operands, one with an immediate after the displacement: zoo_data + 1 */
    ".globl zoo_riprel\n .type zoo_riprel,@function\n"
    "zoo_riprel:\n mov zoo_data(%rip),%rax\n cmpq $41,zoo_data(%rip)\n jne 1f\n inc %rax\n"
    "1: ret\n .size zoo_riprel,.-zoo_riprel\n"

    /* x + 7, through cpuid at +3 (0f a2: not boostable, so a probe there steps through a slot
     * that ends with a trap) */
    ".globl zoo_cpuid\n .type zoo_cpuid,@function\n"
    "zoo_cpuid:\n push %rbx\n xor %eax,%eax\n cpuid\n pop %rbx\n lea 7(%rdi),%rax\n ret\n"
    " .size zoo_cpuid,.-zoo_cpuid\n"

    /* refused: syscall, int3 (call and jmp through memory are emulated: planned, never run) */
    ".globl zoo_refused\n .type zoo_refused,@function\n"
    "zoo_refused:\n mov $39,%eax\n syscall\n call *zoo_ptr(%rip)\n jmp *zoo_ptr(%rip)\n int3\n ret\n"
    " .size zoo_refused,.-zoo_refused\n");
