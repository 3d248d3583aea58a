#!/usr/bin/env bash
# bench/dlopen.sh [RUNS] [LIB]: how long a program's dlopen of LIB (default libstdc++.so.6)
# takes untraced and under `ftprobe trace -F work` (issue 25, item 8: the agent finds the
# new object's sites before the dlopen returns, as the kernel's ftrace_module_init() runs
# before a module's init). The program is bench/dlopen.c (gcc -O2); each run is a fresh
# process whose first dlopen of LIB is timed by the program itself (clock_gettime around
# the call). Prints the median and min-max in microseconds over RUNS runs (default 20).
# FTPROBE=path/to/ftprobe (default: target/release/ftprobe, else target/debug/ftprobe).
set -u -o pipefail
RUNS=${1:-20}
LIB=${2:-libstdc++.so.6}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [[ -z ${FTPROBE:-} ]]; then
	for f in "$TARGET_DIR/release/ftprobe" "$TARGET_DIR/debug/ftprobe"; do
		[[ -x $f ]] && { FTPROBE=$f; break; }
	done
fi
[[ -x ${FTPROBE:-} ]] || { echo "dlopen: no ftprobe binary (FTPROBE=...)" >&2; exit 1; }
W=$(mktemp -d /tmp/ftprobe-dlopen-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
gcc -O2 -o "$W/dlopen" "$HERE/dlopen.c" -ldl || exit 1
stats() { sort -n | awk '{ v[NR] = $1 } END { printf "%d (%d-%d)", v[int((NR + 1) / 2)], v[1], v[NR] }'; }
run() {
	for ((i = 0; i < RUNS; i++)); do
		"$@" 2>/dev/null | sed -n 's/^dlopen_us_min=//p'
	done
}
untraced=$(run "$W/dlopen" "$LIB" 1 | stats)
traced=$(run "$FTPROBE" trace -F work -o /dev/null -- "$W/dlopen" "$LIB" 1 | stats)
echo "| dlopen($LIB), us, median (min-max) of $RUNS | untraced | ftprobe trace -F work |"
echo "|---|---|---|"
echo "| $FTPROBE | $untraced | $traced |"
