#!/usr/bin/env bash
# bench/fgraph-cost.sh [RUNS]: per-call cost of ftprobe's function_graph tracer (and of the
# function tracer, and untraced) on bench/hit-rusage.c, split into the loop thread's user and
# system CPU time (getrusage RUSAGE_THREAD) and wall time, as slopes between N1 and N2 calls
# (start-up cancels), median of RUNS (default 5) runs each.
# CPU time is less sensitive than wall time to other processes on a shared machine (time
# spent waiting for a CPU is not counted); instruction counters would be better still, but
# this VM has no PMU (`perf stat -e instructions:u` is "not supported").
# AGENTS="name=path ..." compares agent builds (runs interleaved); default: the release
# build next to target/release/ftprobe. FTPROBE: the CLI (default target/release/ftprobe).
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
FT=${FTPROBE:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ftprobe}
RUNS=${1:-5}
N1=${N1:-1000000}
N2=${N2:-3000000}
W=$(mktemp -d /tmp/fgraph-cost.XXXXXX)
trap 'rm -rf "$W"' EXIT
gcc -O2 -pg -mfentry -mnop-mcount -mrecord-mcount -fno-pie -no-pie -c "$HERE/hit-rusage.c" -o "$W/hit.o" &&
	gcc -no-pie "$W/hit.o" -o "$W/hit" || exit 1
read -r -a AG <<<"${AGENTS:-default=}"
# run MODE AGENT N: prints "user sys faults wall" (ns, ns, count, ns) of the loop
run() {
	local f=$W/t agent=()
	[[ -n $2 ]] && agent=(--agent "$2")
	case $1 in
	untraced) HIT_TIME_FILE=$f "$W/hit" "$3" ;;
	function) HIT_TIME_FILE=$f "$FT" trace "${agent[@]}" --buffer-size-kb 262144 -o /dev/null -F target -- "$W/hit" "$3" ;;
	function_graph) HIT_TIME_FILE=$f "$FT" trace "${agent[@]}" --buffer-size-kb 262144 -o /dev/null -t function_graph -F target -- "$W/hit" "$3" ;;
	esac >/dev/null 2>&1
	cat "$f"
}
med() { sort -g | awk '{a[NR] = $1} END {printf "%.1f", a[int((NR + 1) / 2)]}'; }
printf '%-10s %-15s %8s %8s %8s %8s %12s\n' agent mode user sys cpu wall faults/call
for mode in untraced function function_graph; do
	declare -A U S C WL F
	for a in "${AG[@]}"; do U[$a]=""; S[$a]=""; C[$a]=""; WL[$a]=""; F[$a]=""; done
	for r in $(seq "$RUNS"); do
		for a in "${AG[@]}"; do
			path=${a#*=}
			read -r au as af aw < <(run "$mode" "$path" "$N1")
			read -r bu bs bf bw < <(run "$mode" "$path" "$N2")
			d=$((N2 - N1))
			U[$a]+="$(awk "BEGIN{print ($bu-$au)/$d}") "
			S[$a]+="$(awk "BEGIN{print ($bs-$as)/$d}") "
			C[$a]+="$(awk "BEGIN{print ($bu+$bs-$au-$as)/$d}") "
			WL[$a]+="$(awk "BEGIN{print ($bw-$aw)/$d}") "
			F[$a]+="$(awk "BEGIN{print ($bf-$af)/$d}") "
		done
	done
	for a in "${AG[@]}"; do
		m() { tr ' ' '\n' | grep . | med; }
		printf '%-10s %-15s %8s %8s %8s %8s %12s\n' "$([[ $mode == untraced ]] && echo - || echo "${a%%=*}")" "$mode" "$(m <<<"${U[$a]}")" \
			"$(m <<<"${S[$a]}")" "$(m <<<"${C[$a]}")" "$(m <<<"${WL[$a]}")" \
			"$(tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {printf "%.4f", a[int((NR + 1) / 2)]}' <<<"${F[$a]}")"
		[[ $mode == untraced ]] && break
	done
	unset U S C WL F
done
