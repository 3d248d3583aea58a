#!/usr/bin/env bash
# bench/cpu-per-hit.sh: per-hit cost by CPU time, for a machine whose wall time is unusable
# (other jobs taking the CPUs away): what BENCHMARKS.md's "Per-site trampolines" section
# used to compare two builds. Not part of peers.sh; its numbers are not peers.sh's.
#
#   bench/cpu-per-hit.sh api HIT_API N RUNS MODE...
#       hit_api's modes (HIT_MODE), by `perf stat -e task-clock` of the whole process: the
#       slope between 1000 and N calls, minus the untraced mode's; median and min of RUNS.
#   bench/cpu-per-hit.sh cli FTPROBE N RUNS AGENT...
#       `ftprobe trace -e 'p target'` and `-e 'p target x=%di y=$arg1'` on bench/hit-rusage.c
#       (built as peers.sh builds hit.c's fentry binary) with each agent ($FTPROBE_AGENT):
#       the loop thread's user + system time (getrusage RUSAGE_THREAD) per call minus the
#       untraced loop's; median and min of RUNS, interleaved.
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d /tmp/ftprobe-cpu-per-hit.XXXXXX)
trap 'rm -rf "$W"' EXIT
med() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {printf "%.2f %.2f", v[int((NR+1)/2)], v[1]}'; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a - b}'; }
declare -A S
case "${1:-}" in
api)
	BIN=$2 N=$3 R=$4
	shift 4
	tc() { HIT_MODE=$1 perf stat -x, -e task-clock "$BIN" "$2" 2>&1 >/dev/null | awk -F, '/task-clock/ {print $1 * 1e6}'; }
	for ((i = 0; i < R; i++)); do
		for m in none "$@"; do
			a=$(tc "$m" 1000) b=$(tc "$m" "$N")
			S[$m]+="$(awk -v a="$a" -v b="$b" -v n="$N" 'BEGIN {printf "%.3f", (b - a) / (n - 1000)}') "
		done
	done
	read -r bm bmin <<<"$(echo "${S[none]}" | med)"
	echo "none: $bm ns/call (min $bmin)"
	for m in "$@"; do
		read -r mm mmin <<<"$(echo "${S[$m]}" | med)"
		echo "$m: per hit $(sub "$mm" "$bm") ns (median of $R; min run $(sub "$mmin" "$bmin"))"
	done
	;;
cli)
	FT=$2 N=$3 R=$4
	shift 4
	gcc -O2 -pg -mfentry -mnop-mcount -mrecord-mcount -fno-pie -no-pie -c "$HERE/hit-rusage.c" -o "$W/hr.o" &&
		gcc -no-pie "$W/hr.o" -o "$W/hit" || exit 1
	export HIT_TIME_FILE=$W/t
	cpu() { awk -v n="$N" '{printf "%.3f", ($1 + $2) / n}' "$HIT_TIME_FILE"; }
	EVS=('p target' 'p target x=%di y=$arg1')
	for ((i = 0; i < R; i++)); do
		"$W/hit" "$N" && S[base]+="$(cpu) "
		for ag in "$@"; do
			for ev in "${EVS[@]}"; do
				FTPROBE_AGENT=$ag "$FT" trace --buffer-size-kb 262144 -o /dev/null -e "$ev" -- "$W/hit" "$N" >/dev/null || exit 1
				S["$ag|$ev"]+="$(cpu) "
			done
		done
	done
	read -r bc bcm <<<"$(echo "${S[base]}" | med)"
	echo "untraced: $bc ns/call (min $bcm)"
	for ag in "$@"; do
		for ev in "${EVS[@]}"; do
			read -r c cm <<<"$(echo "${S["$ag|$ev"]}" | med)"
			echo "$ag | $ev: per hit $(sub "$c" "$bc") ns (median of $R; min run $(sub "$cm" "$bcm"))"
		done
	done
	;;
*)
	sed -n '2,16p' "$0" >&2
	exit 2
	;;
esac
