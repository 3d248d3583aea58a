#!/usr/bin/env bash
# bench/attach.sh [RUNS]: time to attach `ftprobe trace -p` to a running program, and to
# detach, with 1, 8 and 64 threads (issue 13: "time to attach, threads stopped to first
# event").
#
# The target is bench/attach_threads.c (built here with gcc -pg -mfentry -mnop-mcount): N
# threads calling work() in a loop, 1 ms of nanosleep after each call. Each run starts a
# fresh target, attaches twice (`FTPROBE_TIMING=1 ftprobe trace -p PID -F work --duration
# 0.3 -o FILE`): the first attach loads the agent (dlopen), the second finds it loaded;
# then kills the target. ftprobe's timing line gives, in ms from the first thread seen
# stopped: every thread stopped, the agent started (its entry returned: sites patched),
# every thread let go, the first records drained into the output (the CLI polls its rings:
# this includes its first poll's work); and for the detach, from its start: every thread
# stopped, the agent stopped (every byte back), every thread let go.
# Prints a markdown table of median (min-max) over RUNS runs (default 10).
# FTPROBE=path/to/ftprobe (default: target/release/ftprobe, else target/debug/ftprobe of
# $CARGO_TARGET_DIR or the repository; its libftprobe_agent.so beside it).
set -u -o pipefail

RUNS=${1:-10}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [[ -z ${FTPROBE:-} ]]; then
	for f in "$TARGET_DIR/release/ftprobe" "$TARGET_DIR/debug/ftprobe"; do
		if [[ -x $f ]]; then
			FTPROBE=$f
			break
		fi
	done
fi
[[ -x ${FTPROBE:-} ]] || {
	echo "attach: no ftprobe binary (cargo build -p ftprobe-cli -p ftprobe-agent, or FTPROBE=...)" >&2
	exit 1
}
W=$(mktemp -d /tmp/ftprobe-attach-bench.XXXXXX)
TARGET_PID=
cleanup() {
	[[ -n $TARGET_PID ]] && kill "$TARGET_PID" 2>/dev/null && wait "$TARGET_PID" 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT

gcc -O2 -pg -mfentry -mnop-mcount -mrecord-mcount -fno-pie -c "$HERE/attach_threads.c" -o "$W/at.o" &&
	gcc -no-pie "$W/at.o" -o "$W/attach_threads" -lpthread || exit 1

# One attach: its timing line's fields as "N kind all_stopped agent_started resumed
# first_event detach_stopped detach_agent_stopped detach_resumed".
attach_once() {
	local n=$1 kind=$2 line
	line=$(FTPROBE_TIMING=1 "$FTPROBE" trace -p "$TARGET_PID" -F work --duration 0.3 \
		-o "$W/trace.txt" 2>&1 | grep '^ftprobe: timing:') || {
		echo "attach: no timing line ($n threads, $kind)" >&2
		return 1
	}
	grep -q ' work <-' "$W/trace.txt" || {
		echo "attach: no event traced ($n threads, $kind)" >&2
		return 1
	}
	echo "$line" | awk -v n="$n" -v kind="$kind" '{
		for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		if (v["threads"] != n) { print "attach: " v["threads"] " threads held, not " n > "/dev/stderr"; exit 1 }
		print n, kind, v["all_stopped"], v["agent_started"], v["resumed"], v["first_event"],
			v["detach_stopped"], v["detach_agent_stopped"], v["detach_resumed"]
	}'
}

for n in 1 8 64; do
	for ((r = 1; r <= RUNS; r++)); do
		"$W/attach_threads" "$n" >"$W/ready" &
		TARGET_PID=$!
		until grep -q ready "$W/ready" 2>/dev/null; do
			kill -0 "$TARGET_PID" 2>/dev/null || {
				echo "attach: the target did not start ($n threads)" >&2
				exit 1
			}
			sleep 0.01
		done
		attach_once "$n" "first" >>"$W/samples" || exit 1
		attach_once "$n" "again" >>"$W/samples" || exit 1
		kill "$TARGET_PID"
		wait "$TARGET_PID" 2>/dev/null
		TARGET_PID=
	done
	echo "attach: $n threads done" >&2
done

echo "| threads | attach | all stopped | agent started | threads resumed | first event out | detach: stopped | agent stopped | resumed |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|"
for n in 1 8 64; do
	for kind in first again; do
		row="| $n | $kind"
		for col in 3 4 5 6 7 8 9; do
			row+=" | $(awk -v n="$n" -v k="$kind" -v c="$col" '$1 == n && $2 == k { print $c }' "$W/samples" |
				sort -g | awk '{ v[NR] = $1 } END {
					m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
					printf "%.1f (%.1f-%.1f)", m, v[1], v[NR] }')"
		done
		echo "$row |"
	done
done
