//! Tests of the probe-definition language: malformed commands against the kernel's error
//! names, texts and caret positions; definitions and their listing.

use super::*;
use ProbeErrorKind as E;

/// The kernel's texts, copied independently of the enum's table (kernel/trace/trace_probe.h).
const KERNEL_TEXTS: &[(&str, &str)] = &[
    ("BAD_MAXACT_TYPE", "Maxactive is only for function exit"),
    ("BAD_MAXACT", "Invalid maxactive number"),
    ("MAXACT_TOO_BIG", "Maxactive is too big"),
    ("BAD_PROBE_ADDR", "Invalid probed address or symbol"),
    ("BAD_RETPROBE", "Retprobe address must be an function entry"),
    ("BAD_ADDR_SUFFIX", "Invalid probed address suffix"),
    ("NO_GROUP_NAME", "Group name is not specified"),
    ("GROUP_TOO_LONG", "Group name is too long"),
    (
        "BAD_GROUP_NAME",
        "Group name must follow the same rules as C identifiers",
    ),
    ("NO_EVENT_NAME", "Event name is not specified"),
    ("EVENT_TOO_LONG", "Event name is too long"),
    (
        "BAD_EVENT_NAME",
        "Event name must follow the same rules as C identifiers",
    ),
    ("RETVAL_ON_PROBE", "$retval is not available on probe"),
    ("BAD_STACK_NUM", "Invalid stack number"),
    ("BAD_ARG_NUM", "Invalid argument number"),
    ("BAD_VAR", "Invalid $-variable specified"),
    ("BAD_REG_NAME", "Invalid register name"),
    ("BAD_MEM_ADDR", "Invalid memory address"),
    ("BAD_IMM", "Invalid immediate value"),
    ("IMMSTR_NO_CLOSE", "String is not closed with '\"'"),
    ("FILE_ON_KPROBE", "File offset is not available with kprobe"),
    ("BAD_FILE_OFFS", "Invalid file offset value"),
    ("SYM_ON_UPROBE", "Symbol is not available with uprobe"),
    ("TOO_MANY_OPS", "Dereference is too much nested"),
    ("DEREF_NEED_BRACE", "Dereference needs a brace"),
    ("BAD_DEREF_OFFS", "Invalid dereference offset"),
    ("DEREF_OPEN_BRACE", "Dereference brace is not closed"),
    ("COMM_CANT_DEREF", "$comm can not be dereferenced"),
    ("BAD_FETCH_ARG", "Invalid fetch argument"),
    ("ARRAY_NO_CLOSE", "Array is not closed"),
    ("BAD_ARRAY_SUFFIX", "Array has wrong suffix"),
    ("BAD_ARRAY_NUM", "Invalid array size"),
    ("ARRAY_TOO_BIG", "Array number is too big"),
    ("BAD_TYPE", "Unknown type is specified"),
    ("BAD_STRING", "String accepts only memory argument"),
    (
        "BAD_SYMSTRING",
        "Symbol String doesn't accept data/userdata",
    ),
    ("BAD_BITFIELD", "Invalid bitfield"),
    ("ARG_NAME_TOO_LONG", "Argument name is too long"),
    ("NO_ARG_NAME", "Argument name is not specified"),
    (
        "BAD_ARG_NAME",
        "Argument name must follow the same rules as C identifiers",
    ),
    ("USED_ARG_NAME", "This argument name is already used"),
    ("ARG_TOO_LONG", "Argument expression is too long"),
    ("NO_ARG_BODY", "No argument expression"),
    ("FAIL_REG_PROBE", "Failed to register probe event"),
    ("NOSUP_BTFARG", "BTF is not available or not supported"),
    (
        "NOFENTRY_ARGS",
        "$arg* can be used only on function entry or exit",
    ),
    (
        "DOUBLE_ARGS",
        "$arg* can be used only once in the parameters",
    ),
    (
        "NEED_STRING_TYPE",
        "$comm and immediate-string only accepts string type",
    ),
    ("TOO_MANY_ARGS", "Too many arguments are specified"),
    ("BAD_UPROBE_OFFS", "Invalid uprobe offset"),
    ("BAD_REFCNT", "Invalid reference counter offset"),
    ("REFCNT_OPEN_BRACE", "Reference counter brace is not closed"),
    ("BAD_REFCNT_SUFFIX", "Reference counter has wrong suffix"),
    ("BAD_COMMAND", "Command must start with 'p', 'r' or '-:'"),
    ("NOT_SUPPORTED", "This syntax is not supported by ftprobe"),
];

/// Malformed commands in the selftests' notation: `^` marks where the kernel puts the caret.
/// The first block is tools/testing/selftests/ftrace/test.d/kprobe/kprobe_syntax_errors.tc,
/// case for case, except `p ^non_exist_func` (the engine's) and the BTF cases, which are
/// given as a kernel without BTF answers them.
const MALFORMED: &[(&str, &str)] = &[
    ("p^100 vfs_read", "BAD_MAXACT_TYPE"),
    ("r^1a111 vfs_read", "BAD_MAXACT"),
    ("r^100000 vfs_read", "MAXACT_TOO_BIG"),
    ("p ^hoge-fuga", "BAD_PROBE_ADDR"),
    ("p ^hoge+1000-1000", "BAD_PROBE_ADDR"),
    ("r ^vfs_read+10", "BAD_RETPROBE"),
    ("p:^/bar vfs_read", "NO_GROUP_NAME"),
    (
        "p:^12345678901234567890123456789012345678901234567890123456789012345/bar vfs_read",
        "GROUP_TOO_LONG",
    ),
    ("p:^foo.1/bar vfs_read", "BAD_GROUP_NAME"),
    ("p:^ vfs_read", "NO_EVENT_NAME"),
    (
        "p:foo/^12345678901234567890123456789012345678901234567890123456789012345 vfs_read",
        "EVENT_TOO_LONG",
    ),
    ("p:foo/^bar.1 vfs_read", "BAD_EVENT_NAME"),
    ("p vfs_read ^$retval", "RETVAL_ON_PROBE"),
    ("p vfs_read ^$stack10000", "BAD_STACK_NUM"),
    ("p vfs_read ^$arg10000", "BAD_ARG_NUM"),
    ("p vfs_read ^$none_var", "BAD_VAR"),
    ("p vfs_read ^%none_reg", "BAD_REG_NAME"),
    ("p vfs_read ^@12345678abcde", "BAD_MEM_ADDR"),
    ("p vfs_read ^@+10", "FILE_ON_KPROBE"),
    ("p vfs_read arg1=\\^x", "BAD_IMM"),
    ("p vfs_read arg1=\\\"abcd^", "IMMSTR_NO_CLOSE"),
    // Regression: a lone `\"` was taken for the empty string (found by a user); this
    // kernel's error_log (6.18, through uprobe_events) puts the caret just after the quote.
    ("p vfs_read \\\"^", "IMMSTR_NO_CLOSE"),
    ("p vfs_read x=\\\"^", "IMMSTR_NO_CLOSE"),
    ("p vfs_read \\\"^ %di", "IMMSTR_NO_CLOSE"),
    ("p vfs_read ^+0@0)", "DEREF_NEED_BRACE"),
    ("p vfs_read ^+0ab1(@0)", "BAD_DEREF_OFFS"),
    ("p vfs_read +0(+0(@0^)", "DEREF_OPEN_BRACE"),
    ("p vfs_read +0(^$comm)", "COMM_CANT_DEREF"),
    ("p vfs_read ^&1", "BAD_FETCH_ARG"),
    (
        "p vfs_read +0(^+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(@0))))))))))))))",
        "TOO_MANY_OPS",
    ),
    ("p vfs_read +0(@11):u8[10^", "ARRAY_NO_CLOSE"),
    ("p vfs_read +0(@11):u8[10]^a", "BAD_ARRAY_SUFFIX"),
    ("p vfs_read +0(@11):u8[^10a]", "BAD_ARRAY_NUM"),
    ("p vfs_read +0(@11):u8[^256]", "ARRAY_TOO_BIG"),
    ("p vfs_read @11:^unknown_type", "BAD_TYPE"),
    ("p vfs_read $stack0:^string", "BAD_STRING"),
    ("p vfs_read @11:^b10@a/16", "BAD_BITFIELD"),
    (
        "p vfs_read ^arg123456789012345678901234567890=@11",
        "ARG_NAME_TOO_LONG",
    ),
    ("p vfs_read ^=@11", "NO_ARG_NAME"),
    ("p vfs_read ^var.1=@11", "BAD_ARG_NAME"),
    ("p vfs_read var1=@11 ^var1=@12", "USED_ARG_NAME"),
    (
        "p vfs_read ^+1234567(+1234567(+1234567(+1234567(+1234567(+1234567(@1234))))))",
        "ARG_TOO_LONG",
    ),
    ("p vfs_read arg1=^", "NO_ARG_BODY"),
    ("p vfs_read^%hoge", "BAD_ADDR_SUFFIX"),
    ("p ^vfs_read+10%return", "BAD_RETPROBE"),
    ("p vfs_read args=^$args", "BAD_VAR"),
    ("p vfs_read +0(^$args)", "BAD_VAR"),
    ("p vfs_read $arg* ^$arg*", "DOUBLE_ARGS"),
    ("p vfs_read+8 ^$arg*", "NOFENTRY_ARGS"),
    ("p vfs_read ^hoge", "NOSUP_BTFARG"),
    ("p vfs_read ^$arg*", "NOSUP_BTFARG"),
    // Own cases: targets and names.
    ("^x vfs_read", "BAD_COMMAND"),
    ("^", "BAD_COMMAND"),
    ("-^foo", "BAD_COMMAND"),
    ("-:^", "NO_EVENT_NAME"),
    ("-:^/ev", "NO_GROUP_NAME"),
    ("-:ev ^vfs_read", "NOT_SUPPORTED"),
    ("p:foo ^", "BAD_PROBE_ADDR"),
    ("r^0 vfs_read", "BAD_MAXACT"),
    ("r^4097 vfs_read", "MAXACT_TOO_BIG"),
    ("p ^:vfs_read", "BAD_PROBE_ADDR"),
    ("p ^1vfs_read", "BAD_PROBE_ADDR"),
    ("p ^vfs_read+4294967296", "BAD_PROBE_ADDR"),
    ("p ^vfs_read-4", "BAD_PROBE_ADDR"),
    ("p:^9ev vfs_read", "BAD_EVENT_NAME"),
    ("p:grp.^e-v vfs_read", "BAD_EVENT_NAME"),
    ("r:foo/bar ^vfs_read+1%return", "BAD_RETPROBE"),
    // Own cases: fetch arguments.
    ("p vfs_read ^%rax", "BAD_REG_NAME"),
    ("p vfs_read ^@0x", "BAD_MEM_ADDR"),
    ("p vfs_read ^$stackx", "BAD_VAR"),
    ("p vfs_read ^$stack1x", "BAD_VAR"),
    ("r vfs_read ^$stack2049", "BAD_STACK_NUM"),
    ("p vfs_read ^$arg0", "BAD_ARG_NUM"),
    ("p vfs_read+8 ^$arg1", "NOFENTRY_ARGS"),
    ("p vfs_read+8 a=^$arg1", "NOFENTRY_ARGS"),
    ("p 0xffff0000 ^$arg1", "NOFENTRY_ARGS"),
    ("r vfs_read ^$retval->f_pos", "NOSUP_BTFARG"),
    ("p vfs_read ^-8", "DEREF_NEED_BRACE"),
    ("p vfs_read ^-(%di)", "BAD_DEREF_OFFS"),
    ("p vfs_read +8(%di^", "DEREF_OPEN_BRACE"),
    ("p vfs_read +0(^\\\"abc\")", "COMM_CANT_DEREF"),
    ("p vfs_read \\^", "BAD_IMM"),
    ("p vfs_read ^:u8", "BAD_FETCH_ARG"),
    ("p vfs_read ^common_pid=%di", "USED_ARG_NAME"),
    ("p vfs_read ^__probe_ip=%di", "USED_ARG_NAME"),
    ("p vfs_read arg2=%di ^%si", "USED_ARG_NAME"),
    ("p vfs_read $comm:^u32", "NEED_STRING_TYPE"),
    ("p vfs_read \\\"ab\":^string[2]", "NEED_STRING_TYPE"),
    ("p vfs_read %di:^string", "BAD_STRING"),
    ("r vfs_read $retval:^ustring", "BAD_STRING"),
    ("p vfs_read %di:^u8[2]", "BAD_STRING"),
    ("p vfs_read \\1:^symstr", "BAD_SYMSTRING"),
    ("p vfs_read +0(%di):sym^str[2]", "BAD_STRING"),
    ("p vfs_read @11:^b0@1/8", "BAD_BITFIELD"),
    ("p vfs_read @11:^b5@4/8", "BAD_BITFIELD"),
    ("p vfs_read @11:^b5@3/7", "BAD_TYPE"),
    ("p vfs_read @11:^", "BAD_TYPE"),
    ("p vfs_read %di:^%pd", "BAD_TYPE"),
    ("p vfs_read %di:u8[^0]", "BAD_ARRAY_NUM"),
    ("p vfs_read %di:u8[^65]", "ARRAY_TOO_BIG"),
    // A symbol with a bad offset fails only when the kernel resolves it, after all arguments.
    ("p ^vfs_read @jiffies+zz", "FAIL_REG_PROBE"),
    ("p vfs_read @jiffies+zz ^%bad", "BAD_REG_NAME"),
    ("p ^vfs_read @", "BAD_PROBE_ADDR"),
    // Kernel quirks kept: with `+u`/`-u` the inner argument is counted one byte early, and
    // a type error after a dereference is counted from the outer dereference's inner start.
    ("p vfs_read +u8^($comm)", "COMM_CANT_DEREF"),
    ("p vfs_read -u8^(%bad)", "BAD_REG_NAME"),
    ("p vfs_read +u0(%di):u8[^2]", "BAD_STRING"),
    ("p vfs_read +0(%di):b9@^0/8", "BAD_BITFIELD"),
    ("p vfs_read +0(%di):u8[^0]", "BAD_ARRAY_NUM"),
    ("p vfs_read +0(+0(%di)):b9@^0/8", "BAD_BITFIELD"),
    // PATH:OFFSET (uprobe rules).
    ("p /bin/sh:^0xzz", "BAD_UPROBE_OFFS"),
    ("p /bin/sh:^main", "BAD_UPROBE_OFFS"),
    ("p /bin/sh:0x10^%ret", "BAD_ADDR_SUFFIX"),
    ("p /bin/sh:0x10(^zz)", "BAD_REFCNT"),
    ("p /bin/sh:0x10(0x20^", "REFCNT_OPEN_BRACE"),
    ("p /bin/sh:0x10(0x20)^%return", "BAD_REFCNT_SUFFIX"),
    ("p /bin/sh:^zz(0x20)", "BAD_UPROBE_OFFS"),
    ("p /bin/sh:0x10 ^@jiffies", "SYM_ON_UPROBE"),
    ("p /bin/sh:0x10 ^@+zz", "BAD_FILE_OFFS"),
    ("p /bin/sh:0x10 %di:^symbol", "BAD_TYPE"),
    ("p /bin/sh:0x10 ^$arg1", "NOFENTRY_ARGS"),
    ("p /bin/sh:0x10 ^$retval", "RETVAL_ON_PROBE"),
];

fn kernel_text(name: &str) -> &'static str {
    KERNEL_TEXTS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no text for {name}"))
        .1
}

#[test]
fn malformed_commands_get_the_kernels_error_and_caret() {
    assert!(MALFORMED.len() >= 40);
    for &(marked, name) in MALFORMED {
        let pos = marked.rfind('^').unwrap();
        let cmd = marked.replace('^', "");
        let err = match parse_probe_command(&cmd) {
            Ok(def) => panic!("{marked:?} parsed: {def:?}"),
            Err(e) => e,
        };
        assert_eq!(err.kind.name(), name, "{marked:?}: {err:?}");
        assert_eq!(err.kind.text(), kernel_text(name), "{marked:?}");
        assert_eq!(err.to_string(), kernel_text(name), "{marked:?}");
        assert_eq!(err.pos, pos, "{marked:?}: caret");
        // The selftests' check on the log: the caret line is 13 + pos bytes with "^\n".
        let log = error_log(&cmd, &err);
        let caret_line = log.lines().last().unwrap();
        assert_eq!(caret_line.len() + 1, 13 + pos, "{marked:?}: {log}");
        assert!(log.contains(&format!(": error: {}\n", kernel_text(name))));
    }
}

#[test]
fn every_kernel_text_matches_the_enum() {
    for &(name, text) in KERNEL_TEXTS {
        let kind = E::ALL.iter().find(|k| k.name() == name).unwrap();
        assert_eq!(kind.text(), text, "{name}");
    }
}

#[test]
fn too_many_args() {
    let args: Vec<String> = (0..MAX_TRACE_ARGS).map(|i| format!("a{i}=%di")).collect();
    let ok = format!("p vfs_read {}", args.join(" "));
    let ProbeCommand::Add(def) = parse_probe_command(&ok).unwrap() else {
        panic!()
    };
    assert_eq!(def.args.len(), 128);
    let bad = format!("{ok} a128=%si");
    let err = parse_probe_command(&bad).unwrap_err();
    assert_eq!(err, ProbeError::new(E::TooManyArgs, "p vfs_read ".len()));
}

#[test]
fn nesting_limit() {
    let nest = |n: usize, base: &str| format!("{}{base}{}", "+0(".repeat(n), ")".repeat(n));
    let parse =
        |n: usize, base: &str, ty: &str| parse_probe_command(&format!("p f {}{ty}", nest(n, base)));
    let too_many = Err(ProbeError::new(E::TooManyOps, "p f +0(".len()));
    // A register is one instruction: 14 dereferences fit FETCH_INSN_MAX, 15 do not.
    assert!(parse(14, "%di", "").is_ok());
    assert!(parse(14, "%di", ":string").is_err()); // ARG_TOO_LONG first: 66 bytes
    assert_eq!(parse(15, "%di", ""), too_many);
    // @ADDR is two, @SYM three.
    assert!(parse(13, "@8", "").is_ok());
    assert_eq!(parse(14, "@8", ""), too_many);
    assert!(parse(12, "@s", "").is_ok());
    assert_eq!(parse(13, "@s", ""), too_many);
    // An array adds its loop instruction.
    assert!(parse(11, "@s", ":u8[2]").is_ok());
    assert_eq!(parse(12, "@s", ":u8[2]"), too_many);
}

fn add(cmd: &str) -> ProbeDef {
    match parse_probe_command(cmd) {
        Ok(ProbeCommand::Add(def)) => def,
        other => panic!("{cmd:?}: {other:?}"),
    }
}

/// The definition with every `pos` zeroed (positions differ between spellings).
fn without_pos(mut def: ProbeDef) -> ProbeDef {
    for a in &mut def.args {
        a.pos = 0;
    }
    def
}

#[test]
fn listing_as_the_kernel() {
    let cases = [
        ("p work a=%di:u64", "p:kprobes/p_work_0 work a=%di:u64"),
        (
            "p:myprobe do_sys_open dfd=%ax filename=%dx flags=%cx mode=+4($stack)",
            "p:kprobes/myprobe do_sys_open dfd=%ax filename=%dx flags=%cx mode=+4($stack)",
        ),
        (
            "r:myretprobe do_sys_open $retval",
            "r:kprobes/myretprobe do_sys_open arg1=$retval",
        ),
        ("p vfs_read%return", "r:kprobes/r_vfs_read_0 vfs_read"),
        ("r100 vfs_read", "r100:kprobes/r_vfs_read_0 vfs_read"),
        (
            "p vfs_read+0x10 %di",
            "p:kprobes/p_vfs_read_16 vfs_read+16 arg1=%di",
        ),
        (
            "p 0xffffffff81000000",
            "p:kprobes/p_0xffffffff81000000 0xffffffff81000000",
        ),
        (
            "p 4096",
            "p:kprobes/p_0x0000000000001000 0x0000000000001000",
        ),
        (
            "p:zfree_entry /bin/zsh:0x46420 %ip %ax",
            "p:uprobes/zfree_entry /bin/zsh:0x0000000000046420 arg1=%ip arg2=%ax",
        ),
        (
            "r /bin/bash:0x4245c0",
            "r:uprobes/p_bash_0x4245c0 /bin/bash:0x00000000004245c0",
        ),
        (
            "r5 /bin/bash:0x4245c0",
            "r:uprobes/p_bash_0x4245c0 /bin/bash:0x00000000004245c0",
        ),
        (
            "p /lib/x86_64-linux-gnu/libc.so.6:0x9a0c0%return",
            "r:uprobes/p_libc_0x9a0c0 /lib/x86_64-linux-gnu/libc.so.6:0x000000000009a0c0",
        ),
        (
            "p:grp/ libc.so.6:malloc size=%di:u64",
            "p:grp/p_libc_so_6_malloc_0 libc.so.6:malloc size=%di:u64",
        ),
        (
            "p ld-linux-x86-64.so.2:_dl_start+4",
            "p:kprobes/p_ld_linux_x86_64_so_2__dl_start_4 ld-linux-x86-64.so.2:_dl_start+4",
        ),
        ("p:my-grp.ev f", "p:my-grp/ev f"),
        (
            "p f \\\"hello\" $comm s=\\\"x\":string c=$comm:string",
            "p:kprobes/p_f_0 f arg1=\\\"hello\" arg2=$comm s=\\\"x\" c=$comm",
        ),
        (
            "p f %di:x64 %si:s32",
            "p:kprobes/p_f_0 f arg1=%di arg2=%si:s32",
        ),
        ("p f   a=%di   # comment", "p:kprobes/p_f_0 f a=%di"),
    ];
    for (cmd, listed) in cases {
        assert_eq!(add(cmd).to_string(), listed, "{cmd:?}");
    }
}

#[test]
fn listed_definitions_parse_back() {
    let cmds = [
        "p work a=%di:u64",
        "r10:grp/ev libfoo-1.2.so:bar b=$retval:s32 c=+u8($stack):string d=$arg2",
        "p:ev f a=%r15 b=$arg1 c=$stack0 d=$stack e=$comm f=\\1234 g=\\-5 h=\\\"hello\"",
        "p f a=@0x1000 b=@jiffies+8 c=@jiffies-0x10 d=+8(+0(%di)) e=-8(%bp):s64 f=+0x10(%si):x8",
        "p f a=+0(%di):b4@8/32 b=+0(%si):u32[4] c=+0(%dx):string[2] d=%ax:char e=%cx:symbol",
        "p f a=%di:symstr b=+0(%si):ustring c=%dx:x16 d=%r8:u16 e=%r9:s8 f=\\0xffffffff:x32",
        "p /bin/sh:0x10 a=@+0x40 b=@+-8 c=$stack5000 d=+0(%di):string",
        "r /bin/sh:0x10%return a=$retval",
        "p 0x7f0012345678 a=%flags b=%orig_ax c=%cs d=%ss e=%ip f=%sp",
        "r 0x7f0012345678 $retval $arg3",
        "p f x=\\\"\" y=\\+7 z=-u0x10(%di)",
    ];
    for cmd in cmds {
        let def = add(cmd);
        let listed = def.to_string();
        let again = add(&listed);
        assert_eq!(
            without_pos(again.clone()),
            without_pos(def),
            "{cmd:?} -> {listed:?}"
        );
        assert_eq!(again.to_string(), listed, "{cmd:?}");
    }
}

#[test]
fn auto_names() {
    assert_eq!(add("p work").event, "p_work_0");
    assert_eq!(add("p work").group, "kprobes");
    assert_eq!(add("r work").event, "r_work_0");
    assert_eq!(add("p work+16").event, "p_work_16");
    assert_eq!(add("p work%return").event, "r_work_0");
    assert_eq!(add("p libc.so.6:malloc").event, "p_libc_so_6_malloc_0");
    assert_eq!(add("p 0x7f0012345678").event, "p_0x00007f0012345678");
    assert_eq!(add("r 0x7f0012345678").event, "r_0x00007f0012345678");
    let u = add("r /usr/lib/x86_64-linux-gnu/libc.so.6:0x9a0c0");
    assert_eq!(
        (u.group.as_str(), u.event.as_str()),
        ("uprobes", "p_libc_0x9a0c0")
    );
    assert_eq!(add("p:grp/ work").event, "p_work_0");
    assert_eq!(add("p:grp/ work").group, "grp");
    // Cut to 63 bytes, as snprintf into MAX_EVENT_NAME_LEN.
    let long = "f".repeat(80);
    let ev = add(&format!("p {long}")).event;
    assert_eq!(ev.len(), 63);
    assert_eq!(ev, format!("p_{}", "f".repeat(61)));
    assert_eq!(add("p:ev work").event, "ev");
    assert_eq!(add("p:g.ev work").group, "g");
    assert_eq!(add("p:g.ev work").event, "ev");
}

#[test]
fn default_arg_names() {
    let def = add("p f %di x=%si %dx");
    let names: Vec<_> = def.args.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["arg1", "x", "arg3"]);
    let positions: Vec<_> = def.args.iter().map(|a| a.pos).collect();
    assert_eq!(positions, [4, 8, 14]);
}

#[test]
fn removal() {
    let rm = |cmd| parse_probe_command(cmd).unwrap();
    assert_eq!(
        rm("-:myprobe"),
        ProbeCommand::Remove {
            group: None,
            event: "myprobe".into()
        }
    );
    assert_eq!(
        rm("  -:grp/ev  # x"),
        ProbeCommand::Remove {
            group: Some("grp".into()),
            event: "ev".into()
        }
    );
    assert_eq!(
        rm("-:grp/"),
        ProbeCommand::Remove {
            group: Some("grp".into()),
            event: String::new()
        }
    );
}

#[test]
fn kinds_and_targets() {
    let r = add("r10:grp/ev vfs_read");
    assert_eq!(
        r.kind,
        ProbeKind::Kretprobe {
            maxactive: Some(10)
        }
    );
    assert_eq!((r.group.as_str(), r.event.as_str()), ("grp", "ev"));
    assert_eq!(
        add("r0x10 f").kind,
        ProbeKind::Kretprobe {
            maxactive: Some(16)
        }
    );
    assert_eq!(
        add("r4096 f").kind,
        ProbeKind::Kretprobe {
            maxactive: Some(4096)
        }
    );
    assert_eq!(add("r f").kind, ProbeKind::Kretprobe { maxactive: None });
    assert_eq!(
        add("p f%return").kind,
        ProbeKind::Kretprobe { maxactive: None }
    );
    assert_eq!(
        add("p f+0%return").kind,
        ProbeKind::Kretprobe { maxactive: None }
    );
    assert_eq!(add("p f").kind, ProbeKind::Kprobe);
    // The kernel ignores what follows the letter when no ':' comes.
    assert_eq!(add("pxyz f").kind, ProbeKind::Kprobe);
    assert_eq!(
        add("p libfoo-1.2.so:bar+0x10").target,
        ProbeTarget::Symbol {
            obj: Some("libfoo-1.2.so".into()),
            sym: "bar".into(),
            offset: 16
        }
    );
    assert_eq!(
        add("p f+4294967295").target,
        ProbeTarget::Symbol {
            obj: None,
            sym: "f".into(),
            offset: u64::from(u32::MAX)
        }
    );
    assert_eq!(add("p 0x401000").target, ProbeTarget::Address(0x401000));
    assert_eq!(add("p 010").target, ProbeTarget::Address(8));
    let u = add("p:u/e /bin/bash:0x4245c0 %ip %ax");
    assert_eq!(
        u.target,
        ProbeTarget::FileOffset {
            path: "/bin/bash".into(),
            offset: 0x4245c0,
            ref_ctr_offset: None,
        }
    );
    assert_eq!(u.kind, ProbeKind::Kprobe);
    let ur = add("r3 /bin/bash:0x10");
    assert_eq!(ur.kind, ProbeKind::Kretprobe { maxactive: None });
    assert_eq!(
        add("p /a:b/c:0x10").target,
        ProbeTarget::FileOffset {
            path: "/a:b/c".into(),
            offset: 0x10,
            ref_ctr_offset: None,
        }
    );
    // An SDT marker's semaphore: `(REF_CTR_OFFSET)` ends the word, after `%return`
    // (trace_uprobe.c); listed back as the kernel's `trace_uprobe_show()`.
    let s = add("p:sdt_p/m /bin/x:0x1139(0x4010)");
    assert_eq!(
        s.target,
        ProbeTarget::FileOffset {
            path: "/bin/x".into(),
            offset: 0x1139,
            ref_ctr_offset: Some(0x4010),
        }
    );
    assert_eq!(s.to_string(), "p:sdt_p/m /bin/x:0x0000000000001139(0x4010)");
    let sr = add("p /bin/x:0x1139%return(16)");
    assert_eq!(sr.kind, ProbeKind::Kretprobe { maxactive: None });
}

fn arg(cmd: &str) -> (FetchOp, FetchType) {
    let def = add(cmd);
    let a = def.args.into_iter().next().unwrap();
    (a.fetch, a.ty)
}

#[test]
fn every_fetch_op() {
    use FetchOp as F;
    assert_eq!(arg("p f %di").0, F::Reg(Reg::Di));
    assert_eq!(arg("p f %r8").0, F::Reg(Reg::R8));
    assert_eq!(arg("p f $arg2").0, F::Arg(2));
    assert_eq!(arg("r f $arg6").0, F::Arg(6));
    assert_eq!(arg("p f $stack3").0, F::Stack(3));
    assert_eq!(arg("p f $stack2048").0, F::Stack(2048));
    assert_eq!(arg("p f $stack").0, F::StackPtr);
    assert_eq!(arg("r f $retval").0, F::Retval);
    assert_eq!(arg("r 0x1000 $retval").0, F::Retval);
    assert_eq!(arg("p f $comm"), (F::Comm, FetchType::String));
    assert_eq!(arg("p f $COMM").0, F::Comm);
    assert_eq!(arg("p f \\1234").0, F::Imm(1234));
    assert_eq!(arg("p f \\0x10").0, F::Imm(16));
    assert_eq!(arg("p f \\-5").0, F::Imm(-5i64 as u64));
    assert_eq!(arg("p f \\+5").0, F::Imm(5));
    assert_eq!(
        arg("p f \\\"hello\""),
        (F::ImmStr("hello".into()), FetchType::String)
    );
    assert_eq!(arg("p f \\\"\"").0, F::ImmStr(String::new()));
    assert_eq!(arg("p f @0x1000").0, F::Mem(0x1000));
    assert_eq!(arg("p f @4096").0, F::Mem(4096));
    let sym = |name: &str, offset| F::Sym {
        name: name.into(),
        offset,
    };
    assert_eq!(arg("p f @jiffies").0, sym("jiffies", 0));
    assert_eq!(arg("p f @jiffies+8").0, sym("jiffies", 8));
    assert_eq!(arg("p f @jiffies-0x10").0, sym("jiffies", -16));
    assert_eq!(arg("p /bin/sh:1 @+0x40").0, F::FileOffset(0x40));
    assert_eq!(arg("p /bin/sh:1 @+-8").0, F::FileOffset(-8));
    let deref = |offset, user, inner| F::Deref {
        offset,
        user,
        inner: Box::new(inner),
    };
    assert_eq!(arg("p f +8(%di)").0, deref(8, false, F::Reg(Reg::Di)));
    assert_eq!(arg("p f -8(%bp)").0, deref(-8, false, F::Reg(Reg::Bp)));
    assert_eq!(arg("p f +u8(%si)").0, deref(8, true, F::Reg(Reg::Si)));
    assert_eq!(arg("p f -u0x10(%si)").0, deref(-16, true, F::Reg(Reg::Si)));
    assert_eq!(
        arg("p f +8(+0(%di))").0,
        deref(8, false, deref(0, false, F::Reg(Reg::Di)))
    );
    assert_eq!(arg("p f +4($stack)").0, deref(4, false, F::StackPtr));
    // The kernel keeps only what is inside the last ')'.
    assert_eq!(arg("p f +8(%di)junk").0, deref(8, false, F::Reg(Reg::Di)));
}

#[test]
fn every_fetch_type() {
    use FetchType as T;
    let ty = |t: &str| arg(&format!("p f +0(%di):{t}")).1;
    let scalars = [
        ("u8", T::U8),
        ("u16", T::U16),
        ("u32", T::U32),
        ("u64", T::U64),
        ("s8", T::S8),
        ("s16", T::S16),
        ("s32", T::S32),
        ("s64", T::S64),
        ("x8", T::X8),
        ("x16", T::X16),
        ("x32", T::X32),
        ("x64", T::X64),
        ("char", T::Char),
        ("string", T::String),
        ("ustring", T::Ustring),
        ("symbol", T::Symbol),
        ("symstr", T::Symstr),
    ];
    for (name, t) in scalars {
        assert_eq!(ty(name), t, "{name}");
        assert_eq!(t.to_string(), name);
    }
    assert_eq!(arg("p f %di").1, T::X64);
    assert_eq!(arg("p f %di:symstr").1, T::Symstr);
    assert_eq!(arg("p f \\1:string").1, T::String);
    assert_eq!(
        ty("b4@8/32"),
        T::Bitfield {
            base: Box::new(T::U32),
            width: 4,
            offset: 8
        }
    );
    assert_eq!(
        arg("p f %di:b64@0/64").1,
        T::Bitfield {
            base: Box::new(T::U64),
            width: 64,
            offset: 0
        }
    );
    assert_eq!(
        ty("u32[4]"),
        T::Array {
            elem: Box::new(T::U32),
            len: 4
        }
    );
    assert_eq!(
        ty("string[2]"),
        T::Array {
            elem: Box::new(T::String),
            len: 2
        }
    );
    assert_eq!(
        ty("b1@7/8[64]"),
        T::Array {
            elem: Box::new(T::Bitfield {
                base: Box::new(T::U8),
                width: 1,
                offset: 7
            }),
            len: 64
        }
    );
    assert_eq!(
        arg("p f +u0(%di):string[3]").1,
        T::Array {
            elem: Box::new(T::String),
            len: 3
        }
    );
}

#[test]
fn arguments_keep_their_positions() {
    let cmd = "p:ev  f  a=%di   +8(%si):u32";
    let def = add(cmd);
    assert_eq!(def.args[0].pos, cmd.find("a=").unwrap());
    assert_eq!(def.args[1].pos, cmd.find("+8").unwrap());
}

#[test]
fn error_log_of_a_parse_error() {
    let cmd = "p vfs_read  %none_reg";
    let err = parse_probe_command(cmd).unwrap_err();
    assert_eq!(err.pos, 12);
    let expected = format!(
        "trace_kprobe: error: Invalid register name\n  Command: p vfs_read %none_reg\n{}^\n",
        " ".repeat("  Command: p vfs_read ".len())
    );
    assert_eq!(error_log(cmd, &err), expected);
}

/// Commands stitched from grammar fragments (xorshift, fixed seed): the parser never panics,
/// every error points into the command or just past it, and every definition it accepts lists
/// as a line that parses back to the same definition.
#[test]
fn stitched_commands_never_panic_and_round_trip() {
    const HEADS: &[&str] = &[
        "p", "r", "r4", "p:g/e", "r:e", "p:g/", "-:", "p7", "r:g.e", "x",
    ];
    const TARGETS: &[&str] = &[
        "f",
        "f+8",
        "f%return",
        "libc.so.6:malloc",
        "0x401000",
        "/bin/sh:0x10",
        "/bin/sh:0x10%return",
        "f-1",
        "é",
        "",
    ];
    const PIECES: &[&str] = &[
        "%di", "$arg1", "$stack", "$stack3", "$comm", "$retval", "@", "@0x10", "@s+8", "@+4", "\\",
        "\\\"", "\"", "\\7", "+8(", "-u4(", ")", ":", "u8", "string", "symstr", "[", "]", "2", "=",
        "a", "b4@8/32", "é", "x", "0", "&",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut cmd = format!(
            "{} {}",
            HEADS[next(HEADS.len())],
            TARGETS[next(TARGETS.len())]
        );
        for _ in 0..next(4) {
            cmd.push(' ');
            for _ in 0..1 + next(5) {
                cmd.push_str(PIECES[next(PIECES.len())]);
            }
        }
        match parse_probe_command(&cmd) {
            Err(e) => assert!(e.pos <= cmd.trim_end().len() + 1, "{cmd:?}: {e:?}"),
            Ok(ProbeCommand::Remove { .. }) => {}
            Ok(ProbeCommand::Add(def)) => {
                accepted += 1;
                let listed = def.to_string();
                let again = match parse_probe_command(&listed) {
                    Ok(ProbeCommand::Add(d)) => d,
                    other => panic!("{cmd:?} -> {listed:?} -> {other:?}"),
                };
                assert_eq!(
                    without_pos(again),
                    without_pos(def),
                    "{cmd:?} -> {listed:?}"
                );
            }
        }
    }
    assert!(accepted > 1000, "only {accepted} accepted");
}
