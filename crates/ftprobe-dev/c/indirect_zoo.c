/* Calls and jumps through memory for the engine's int3 kprobe tests (linked into
 * libfxsites.a; crates/ftprobe/tests/indirect_kprobes.rs). Assembly, so the offsets are exact:
 *
 *   izoo_callv+7    call *(%rax)          rax = *obj (a vtable), calls vtable[0](obj)
 *   izoo_callsp+21  call *0x18(%rsp)      f(x), a decoy at 0x10(%rsp)
 *   izoo_jtab+10    jmp *(%rax,%rcx,8)    i in 0..3: 100 * (i + 1)
 */
__asm__(
    "  .text\n"
    "  .globl izoo_callv\n  .type izoo_callv,@function\n"
    "izoo_callv:\n"
    "  push %rbp\n"
    "  mov %rsp,%rbp\n"
    "  mov (%rdi),%rax\n"
    "  call *(%rax)\n" /* +7 */
    "  pop %rbp\n"
    "  ret\n"
    "  .size izoo_callv,.-izoo_callv\n"

    "  .globl izoo_callsp\n  .type izoo_callsp,@function\n"
    "izoo_callsp:\n"
    "  push %rbp\n"
    "  mov %rsp,%rbp\n"
    "  sub $0x20,%rsp\n"
    "  mov %rdi,0x18(%rsp)\n"
    "  mov %rdx,0x10(%rsp)\n"
    "  mov %rsi,%rdi\n"
    "  call *0x18(%rsp)\n" /* +21 */
    "  leave\n"
    "  ret\n"
    "  .size izoo_callsp,.-izoo_callsp\n"

    "  .globl izoo_jtab\n  .type izoo_jtab,@function\n"
    "izoo_jtab:\n"
    "  lea izoo_jtab_table(%rip),%rax\n"
    "  mov %rdi,%rcx\n"
    "  jmp *(%rax,%rcx,8)\n" /* +10 */
    "1: mov $100,%eax\n  ret\n"
    "2: mov $200,%eax\n  ret\n"
    "3: mov $300,%eax\n  ret\n"
    "  .size izoo_jtab,.-izoo_jtab\n"
    "  .section .data.rel.ro,\"aw\"\n  .balign 8\n"
    "izoo_jtab_table: .quad 1b, 2b, 3b\n"
    "  .text\n");
