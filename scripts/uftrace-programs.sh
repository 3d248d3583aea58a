#!/usr/bin/env bash
# scripts/uftrace-programs.sh UFTRACE_SRC [FTPROBE]: run uftrace's own test programs that
# exercise return hooking (tests/s-*.c / s-*.cpp: exceptions, longjmp, signals, threads, fork,
# recursion) under `ftprobe trace -t function_graph`, and check, per program:
#   - output and exit status equal the untraced run's;
#   - the graph is well formed: per thread, every `{` is closed (a `}` or a cut-off mark);
#   - its call tree (names and nesting, per thread, program functions only) equals the one
#     `uftrace record --no-libcall` + `replay` gives, when uftrace itself runs the program
#     correctly (same output and status as untraced, within 60 s); otherwise says so.
# uftrace's sources are GPL: they are not in this repository; give a checkout of
# https://github.com/namhyung/uftrace (or its Debian source). Prints one line per program and
# exits 1 if ftprobe changed a program's behaviour or left a graph malformed.
set -u -o pipefail
SRC=${1:?usage: $0 UFTRACE_SRC [FTPROBE]}
HERE=$(cd "$(dirname "$0")" && pwd)
FTPROBE=${2:-$HERE/../target/debug/ftprobe}
W=$(mktemp -d /tmp/ftprobe-uftprogs.XXXXXX)
trap 'rm -rf "$W"' EXIT
PROGS="s-fibonacci.c s-abc.c s-nested.c s-exit.c s-longjmp.c s-longjmp2.c s-longjmp3.c
s-sigsetjmp.c s-signal.c s-signal2.c s-thread.c s-thread-exit.c s-thread-tsd.c s-thread-name.c
s-fork.c s-fork2.c s-daemon.c s-exception.cpp s-exception2.cpp s-exception3.cpp
s-exception4.cpp s-exception5.cpp"
# A graph, normalized to `TID<TAB>depth-indented call` lines: braces closed or marked, no
# durations, no CPU column.
ftprobe_tree() { # TRACE
	awk -F' [|] ' '!/^#/ && NF >= 2 {
		task = $1; gsub(/^ +| +$/, "", task); n = split(task, p, "-"); tid = p[n]
		c = $2; for (i = 3; i <= NF; i++) c = c " | " $i
		sub(/ \/\*.*\*\/$/, "", c); if (c ~ /^ *\}/) sub(/\}.*/, "}", c)
		if (c ~ /^ *\/\*/ || c ~ /^ *$/) next
		print tid "\t" c}' "$1"
}
uftrace_tree() { # DIR
	uftrace replay --no-libcall -f tid -d "$1" 2>/dev/null | awk -F' [|] ' '!/^#/ && NF >= 2 {
		tid = $1; gsub(/[^0-9]/, "", tid)
		c = $2; for (i = 3; i <= NF; i++) c = c " | " $i
		sub(/ \/\*.*\*\/$/, "", c); if (c ~ /^ *\}/) sub(/\}.*/, "}", c)
		if (c ~ /^ *\/\*/ || c ~ /^ *$/) next
		print tid "\t" c}'
}
# Per thread, shifted to depth 0 and sorted by thread (thread ids differ between runs); a
# call opened and closed with nothing traced in between is a leaf, `f();` (ftrace prints it so
# when its return is the thread's next record; uftrace when it is the next line).
shapes() { # TREE-FILE
	python3 - "$1" <<'PY'
import sys, collections
t = collections.OrderedDict()
for line in open(sys.argv[1]):
    tid, _, call = line.rstrip("\n").partition("\t")
    t.setdefault(tid, []).append(call)
out = []
for lines in t.values():
    shift = min(len(l) - len(l.lstrip()) for l in lines)
    lines = [l[shift:] for l in lines]
    merged = []
    for l in lines:
        if l.strip() == "}" and merged and merged[-1].endswith("() {") and \
                len(merged[-1]) - len(merged[-1].lstrip()) == len(l) - len(l.lstrip()):
            merged[-1] = merged[-1][:-len(" {")] + ";"
        else:
            merged.append(l)
    out.append("|".join(merged))
print("\n".join(sorted(out)))
PY
}
balanced() { # TREE-FILE: per thread, calls left open (> 0: never returned, e.g. at exit()),
	# or closes of calls entered before the thread's records began (< 0: a forked child closes
	# what its parent entered)
	awk -F'\t' '{if ($2 ~ /\{$/) o[$1]++; else if ($2 ~ /^ *\}$/) o[$1]--}
		END {for (k in o) if (o[k] != 0) {
			if (o[k] > 0) print "thread " k ": " o[k] " left open"
			else print "thread " k ": closes " -o[k] " entered before its first record"
			bad = 1}; exit bad}' "$1"
}
fail=0
printf '%-20s %-10s %-10s %s\n' PROGRAM BEHAVIOUR GRAPH "TREE vs uftrace"
for p in $PROGS; do
	[[ -f $SRC/tests/$p ]] || { printf '%-20s not in %s\n' "$p" "$SRC/tests"; continue; }
	exe=$W/${p%.*}
	cc=gcc; [[ $p == *.cpp ]] && cc=g++
	if ! $cc -O0 -pg -pthread -o "$exe" "$SRC/tests/$p" >"$W/cc.log" 2>&1; then
		printf '%-20s does not build: %s\n' "$p" "$(head -n1 "$W/cc.log")"; continue
	fi
	(cd "$W" && timeout 60 "$exe" >"$W/plain.out" 2>&1; echo "status $?" >>"$W/plain.out")
	(cd "$W" && timeout 120 "$FTPROBE" trace -t function_graph -O funcgraph-proc \
		-O nofuncgraph-cpu -O nofuncgraph-duration -o "$W/ft.trace" -- "$exe" >"$W/ft.out" 2>&1
		echo "status $?" >>"$W/ft.out")
	grep -v '^ftprobe:' "$W/ft.out" >"$W/ft.out2"
	if cmp -s "$W/plain.out" "$W/ft.out2"; then beh=same; else beh=CHANGED; fail=1; fi
	ftprobe_tree "$W/ft.trace" >"$W/ft.tree"
	if why=$(balanced "$W/ft.tree"); then graph=closed; else graph="see-below"; fi
	rm -rf "$W/uft.data"
	(cd "$W" && timeout 60 uftrace record --no-libcall -d "$W/uft.data" "$exe" >"$W/uft.out" 2>&1
		echo "status $?" >>"$W/uft.out")
	if ! cmp -s "$W/plain.out" "$W/uft.out"; then
		cmpr="uftrace itself changed the program (or timed out): not compared"
	else
		uftrace_tree "$W/uft.data" >"$W/uft.tree"
		if [[ $(shapes "$W/ft.tree") == "$(shapes "$W/uft.tree")" ]]; then cmpr="equal"
		else cmpr="DIFFERENT (diff <(shapes ft) <(shapes uftrace) in the script's terms)"; fi
	fi
	printf '%-20s %-10s %-10s %s\n' "$p" "$beh" "$graph" "$cmpr"
	[[ $graph == see-below ]] && printf '    %s\n' "$(printf '%s' "$why" | paste -sd';' -)"
done
exit $fail
