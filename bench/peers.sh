#!/usr/bin/env bash
# bench/peers.sh [--quick]: per-hit cost of ftprobe next to its peers (uftrace, bpftrace, the
# kernel's uprobes via tracefs, LLVM XRay, Frida), in one run, on one tiny C program.
#
# Every row runs a whole process `... PROG N` at two call counts N1 and N2 (median of RUNS
# runs each, interleaved); the slope (T(N2) - T(N1)) / (N2 - N1) is the cost per call, so
# process and tool start-up cancel; minus the untraced slope of the same binary it is the
# cost per hit. min-max: the same slope per run pair (run i at N1 and at N2).
#
# Full run: installs missing peers (apt-get, pip), builds target/release/ftprobe, runs the whole
# harness twice and writes both runs, and their run-to-run differences, to bench/RESULTS-peers.md.
# Also: whole-program slowdown of Lua 5.4 (lua-patchable build) running fib.lua LUA_N (env,
# default 32) under ftprobe and uftrace --patch, and record throughput (events/s, bytes/event). --quick (CI smoke test): tiny N, 1 run each, installs and builds
# nothing, writes nothing into the tree, always exits 0. A peer that cannot run prints
# "skipped: REASON" in its row; the script never fails because of one.
set -u -o pipefail

QUICK=0
case "${1:-}" in
--quick) QUICK=1 ;;
"") ;;
*)
	echo "usage: $0 [--quick]" >&2
	exit 2
	;;
esac

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
FTPROBE=$ROOT/target/release/ftprobe
# Full run: the whole harness twice (two passes of this script), both written into
# RESULTS-peers.md with the relative difference of each row's medians between them.
if ((!QUICK)) && [[ -z ${PEERS_PASS_OUT:-} ]]; then
	D=$(mktemp -d /tmp/ftprobe-peers-runs.XXXXXX)
	for p in 1 2; do
		echo "peers: ==== full run $p of 2" >&2
		PEERS_PASS_OUT=$D/run$p.md "$0" || { rm -rf "$D"; exit 1; }
	done
	{
		cat "$D/run1.md"
		echo
		sed 's/^# .*/# Second run (the same harness, right after the first)/; s/^## /### /; s/^# /## /' "$D/run2.md"
		echo
		echo "## Run to run: second run against the first"
		echo
		echo "Relative difference of the medians, (second - first) / first. Per-hit rows: ns per hit (median minus" \
			"the untraced slope), so a small figure moves a lot in relative terms; Lua rows: seconds of the whole command."
		echo
		echo "| row | first | second | difference | first, in program / events | second | difference |"
		echo "|---|---:|---:|---:|---:|---:|---:|"
		awk -F'\t' '
			function rel(a, b) {return (a + 0 != 0 && a ~ /^-?[0-9.]+$/ && b ~ /^-?[0-9.]+$/) ? sprintf("%+.1f%%", 100 * (b - a) / a) : "n/a"}
			NR == FNR {k[$1 FS $2] = 1; a1[$1 FS $2] = $3; b1[$1 FS $2] = $4; order[++n] = $1 FS $2; next}
			{a2[$1 FS $2] = $3; b2[$1 FS $2] = $4; if (!($1 FS $2 in k)) order[++n] = $1 FS $2}
			END {
				for (i = 1; i <= n; i++) {
					key = order[i]; split(key, p, FS)
					name = (p[1] == "lua" ? "Lua: " p[2] " (s)" : p[2] " (ns/hit)")
					printf "| %s | %s | %s | %s | %s | %s | %s |\n", name, a1[key], a2[key], rel(a1[key], a2[key]),
						b1[key], b2[key], rel(b1[key], b2[key])
				}
			}' "$D/run1.md.tsv" "$D/run2.md.tsv"
	} >"$HERE/RESULTS-peers.md"
	echo "peers: wrote $HERE/RESULTS-peers.md (two runs)" >&2
	rm -rf "$D"
	exit 0
fi
W=$(mktemp -d /tmp/ftprobe-peers.XXXXXX)
TRACEFS=/sys/kernel/tracing
UPROBE_GROUP=ftprobe_peers

if ((QUICK)); then
	RUNS=1 N1=100 NFAST=20000 NMID=5000 NSLOW=2000
else
	RUNS=5 N1=1000 NFAST=2000000 NMID=400000 NSLOW=100000
fi

log() { echo "peers: $*" >&2; }

cleanup() {
	if [[ -w $TRACEFS/uprobe_events ]]; then
		for e in "$TRACEFS/events/$UPROBE_GROUP"/*/enable; do
			[[ -e $e ]] && echo 0 >"$e"
		done
		for d in "$TRACEFS/events/$UPROBE_GROUP"/*/; do
			[[ -d $d ]] && echo "-:$UPROBE_GROUP/$(basename "$d")" >>"$TRACEFS/uprobe_events"
		done
	fi 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT

# ---- rows -------------------------------------------------------------------------------
# Parallel arrays, one entry per row.
ROW_NAME=() ROW_NS=() ROW_MIN=() ROW_MAX=() ROW_LOOP=() ROW_NOTE=() ROW_CMD=()
declare -A BASE_SLOPE BASE_MIN BASE_MAX BASE_LOOP

skip() { # NAME REASON
	ROW_NAME+=("$1") ROW_NS+=("") ROW_MIN+=("") ROW_MAX+=("") ROW_LOOP+=("") ROW_NOTE+=("skipped: $2") ROW_CMD+=("")
	log "$1: skipped: $2"
}

now_ns() { date +%s%N; }

# "WALL LOOP": the wall time in ns of CMD (with @N@ replaced by N), and the time of the call
# loop as the program measured it (hit.c writes it to $HIT_TIME_FILE); fails if CMD fails.
export HIT_TIME_FILE=$W/loop-ns
run_once() { # N CMD...
	local n=$1 a args=()
	shift
	for a in "$@"; do args+=("${a//@N@/$n}"); done
	local t0 t1
	rm -f "$HIT_TIME_FILE"
	t0=$(now_ns)
	"${args[@]}" >/dev/null 2>>"$W/stderr" || return 1
	t1=$(now_ns)
	echo $((t1 - t0)) "$(cat "$HIT_TIME_FILE" 2>/dev/null || echo nan)"
}

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

# Prints "MEDIAN MIN MAX LOOP": slopes in ns per call of CMD's wall time at N1 and N2 (the
# slope of the medians, the min and max of the per-run-pair slopes) and of its loop time.
slopes() { # N2 CMD...
	local n2=$1 i a b
	shift
	local ta=() tb=() la=() lb=() per=() la1 lb1
	for ((i = 0; i < RUNS; i++)); do
		read -r a la1 < <(run_once "$N1" "$@") && [[ -n $a ]] || return 1
		read -r b lb1 < <(run_once "$n2" "$@") && [[ -n $b ]] || return 1
		ta+=("$a") tb+=("$b") la+=("$la1") lb+=("$lb1")
		per+=("$(awk -v a="$a" -v b="$b" -v n1="$N1" -v n2="$n2" 'BEGIN {printf "%.3f", (b-a)/(n2-n1)}')")
	done
	local ma mb lma lmb
	ma=$(printf '%s\n' "${ta[@]}" | median)
	mb=$(printf '%s\n' "${tb[@]}" | median)
	lma=$(printf '%s\n' "${la[@]}" | median)
	lmb=$(printf '%s\n' "${lb[@]}" | median)
	printf '%s\n' "${per[@]}" | sort -g | awk -v a="$ma" -v b="$mb" -v la="$lma" -v lb="$lmb" \
		-v n1="$N1" -v n2="$n2" '{v[NR]=$1} END {
		printf "%.3f %.3f %.3f ", (b-a)/(n2-n1), v[1], v[NR]
		if (la == "nan" || lb == "nan") print "nan"; else printf "%.3f\n", (lb-la)/(n2-n1)}'
}

# Untraced slope of BIN at N2, cached.
base_slope() { # BIN N2
	local key="$1:$2" s
	if [[ -z ${BASE_SLOPE[$key]:-} ]]; then
		s=$(slopes "$2" "$1" @N@) || return 1
		read -r "BASE_SLOPE[$key]" "BASE_MIN[$key]" "BASE_MAX[$key]" "BASE_LOOP[$key]" <<<"$s"
	fi
}

# A traced row: per hit = slope of CMD minus the untraced slope of BIN (run as "BIN N", or
# as BASECMD when given through the BASECMD variable).
row() { # NAME BIN N2 CMD...
	local name=$1 bin=$2 n2=$3 s m lo hi l
	shift 3
	log "$name"
	if ! base_slope "$bin" "$n2"; then
		skip "$name" "untraced $bin failed"
		return
	fi
	: >"$W/stderr"
	if ! s=$(slopes "$n2" "$@"); then
		skip "$name" "command failed: $(tail -n 2 "$W/stderr" | tr '\n' ' ' | cut -c1-150)"
		return
	fi
	read -r m lo hi l <<<"$s"
	local b=${BASE_SLOPE[$bin:$n2]} bl=${BASE_LOOP[$bin:$n2]}
	ROW_NAME+=("$name")
	ROW_NS+=("$(awk -v m="$m" -v b="$b" 'BEGIN {printf "%.1f", m-b}')")
	ROW_MIN+=("$(awk -v m="$lo" -v b="$b" 'BEGIN {printf "%.1f", m-b}')")
	ROW_MAX+=("$(awk -v m="$hi" -v b="$b" 'BEGIN {printf "%.1f", m-b}')")
	ROW_LOOP+=("$(awk -v m="$l" -v b="$bl" 'BEGIN {if (m == "nan" || b == "nan") print "n/a"; else printf "%.1f", m-b}')")
	ROW_NOTE+=("")
	ROW_CMD+=("$(printf '%q ' "$@" | sed "s|$W|\$W|g; s|$ROOT/||g; s|@N@|N|g") (N = $N1, $n2; base: $(basename "$bin") N)")
}

# ---- building ---------------------------------------------------------------------------
have() { command -v "$1" >/dev/null 2>&1; }

APT_UPDATED=0
ensure() { # COMMAND APT_PACKAGE: 0 if COMMAND is there (installing it in a full run)
	have "$1" && return 0
	((QUICK)) && {
		REASON="$1 not installed (--quick installs nothing)"
		return 1
	}
	if ((APT_UPDATED == 0)); then
		log "apt-get update"
		apt-get update -qq >>"$W/apt.log" 2>&1
		APT_UPDATED=1
	fi
	log "apt-get install -y $2"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >>"$W/apt.log" 2>&1
	have "$1" && return 0
	REASON="apt-get install $2 failed: $(tail -n 1 "$W/apt.log")"
	return 1
}

have gcc || {
	echo "peers: gcc is required" >&2
	exit $((QUICK ? 0 : 1))
}
FENTRY_FLAGS="-O2 -pg -mfentry -mnop-mcount -mrecord-mcount -fno-pie -no-pie"
PLAIN_FLAGS="-O2 -fno-pie -no-pie"
PG_FLAGS="-O2 -pg -fno-pie -no-pie"
XRAY_FLAGS="-O2 -fxray-instrument -fxray-instruction-threshold=1 -fno-pie -no-pie"
# Linked with plain gcc (not gcc -pg): no gmon.out profiling; __fentry__/mcount come from glibc.
gcc $FENTRY_FLAGS -c "$HERE/hit.c" -o "$W/hit-fentry.o" && gcc -no-pie "$W/hit-fentry.o" -o "$W/hit-fentry" || exit $((QUICK ? 0 : 1))
gcc $PLAIN_FLAGS "$HERE/hit.c" -o "$W/hit-plain" || exit $((QUICK ? 0 : 1))
gcc $PG_FLAGS -c "$HERE/hit.c" -o "$W/hit-pg.o" && gcc -no-pie "$W/hit-pg.o" -o "$W/hit-pg" || exit $((QUICK ? 0 : 1))

# Instruction boundaries inside target, from objdump: "offset mnemonic" lines.
insns() { # BIN
	local base="" a m
	while read -r a m; do
		[[ -z $base ]] && base=$a
		echo "$((0x$a - 0x$base)) $m"
	done < <(objdump -d --no-show-raw-insn "$1" | awk '
		/^[0-9a-f]+ <target>:/ {on = 1; next}
		on && /^$/ {exit}
		on {a = $1; sub(":", "", a); print a, $2}')
}
# The first ordinary instruction: the second of the plain build (the first, a rip-relative
# mov, is at the entry where bpftrace probes); for the fentry build, the one after the NOP5.
INT3_OFF=$(insns "$W/hit-plain" | awk 'NR == 2 {print $1}')
INT3_INSN=$(insns "$W/hit-plain" | awk 'NR == 2 {print $2}')
FENTRY_SITE=$(insns "$W/hit-fentry" | awk 'NR == 1 {print $2}')
log "target+$INT3_OFF of hit-plain is '$INT3_INSN'; target+0 of hit-fentry is '$FENTRY_SITE'"

# ---- ftprobe ------------------------------------------------------------------------------
FT_OK=1
if ((QUICK)); then
	[[ -x $FTPROBE ]] || { FT_OK=0 FT_REASON="$FTPROBE not built (--quick builds nothing)"; }
else
	log "cargo build --release"
	if ! (cd "$ROOT" && cargo build --release -q) >"$W/cargo.log" 2>&1; then
		[[ -x $FTPROBE ]] && log "cargo build failed; using the existing $FTPROBE" ||
			{ FT_OK=0 FT_REASON="cargo build --release failed: $(tail -n 1 "$W/cargo.log")"; }
	fi
fi
FT_ROWS=("ftprobe function tracer (-F target)" "ftprobe kprobe on the ftrace site (p target)"
	"ftprobe kprobe on the site, 2 args (x=%di y=\$arg1)" "ftprobe int3 kprobe (p target+$INT3_OFF, $INT3_INSN)")
# A 2M-hit run records up to 96 MB; a ring that size keeps events from being dropped.
FT="$FTPROBE trace --buffer-size-kb 262144 -o /dev/null"
if ((FT_OK)); then
	row "${FT_ROWS[0]}" "$W/hit-fentry" "$NFAST" $FT -F target -- "$W/hit-fentry" @N@
	row "${FT_ROWS[1]}" "$W/hit-fentry" "$NFAST" $FT -e 'p target' -- "$W/hit-fentry" @N@
	row "${FT_ROWS[2]}" "$W/hit-fentry" "$NFAST" $FT -e 'p target x=%di y=$arg1' -- "$W/hit-fentry" @N@
	row "${FT_ROWS[3]}" "$W/hit-plain" "$NSLOW" $FT -e "p target+$INT3_OFF" -- "$W/hit-plain" @N@
else
	for r in "${FT_ROWS[@]}"; do skip "$r" "$FT_REASON"; done
fi

# ---- kernel uprobes through tracefs -------------------------------------------------------
# File offset of target+OFF in BIN, through the PT_LOAD program headers.
file_offset() { # BIN OFF
	local va type off vaddr paddr filesz rest
	va=$(nm "$1" | awk '$3 == "target" {print $1}')
	[[ -n $va ]] || return
	va=$((0x$va + $2))
	while read -r type off vaddr paddr filesz rest; do
		[[ $type == LOAD ]] || continue
		if ((va >= vaddr && va < vaddr + filesz)); then
			printf '%#x\n' $((va - vaddr + off))
			return
		fi
	done < <(readelf -lW "$1")
}
uprobe_row() { # NAME EVENT BIN OFF N2 [KIND: p (uprobe, default) or r (uretprobe)]
	local name=$1 ev=$2 bin=$3 off=$4 n2=$5 kind=${6:-p} fo
	fo=$(file_offset "$bin" "$off")
	[[ -n $fo ]] || { skip "$name" "no file offset for target+$off"; return; }
	base_slope "$bin" "$n2" # before the uprobe is armed
	if ! echo "$kind:$UPROBE_GROUP/$ev $bin:$fo" >>"$TRACEFS/uprobe_events" 2>"$W/err" ||
		! echo 1 >"$TRACEFS/events/$UPROBE_GROUP/$ev/enable" 2>>"$W/err"; then
		skip "$name" "uprobe_events: $(cat "$W/err")"
		return
	fi
	row "$name" "$bin" "$n2" "$bin" @N@
	ROW_CMD[-1]="echo '$kind:$UPROBE_GROUP/$ev \$W/$(basename "$bin"):$fo' >> $TRACEFS/uprobe_events; echo 1 > .../enable; ${ROW_CMD[-1]}"
	echo 0 >"$TRACEFS/events/$UPROBE_GROUP/$ev/enable"
	echo "-:$UPROBE_GROUP/$ev" >>"$TRACEFS/uprobe_events"
}
KROWS=("kernel uprobe on the NOP5 site (target+0, fentry build)" "kernel uprobe on an ordinary insn (target+$INT3_OFF, $INT3_INSN)" "kernel uretprobe on target (fentry build)")
if [[ ! -e $TRACEFS/uprobe_events ]] && ! mount -t tracefs nodev "$TRACEFS" 2>"$W/err"; then
	for r in "${KROWS[@]}"; do skip "$r" "tracefs not available: $(cat "$W/err")"; done
elif [[ ! -w $TRACEFS/uprobe_events ]]; then
	for r in "${KROWS[@]}"; do skip "$r" "$TRACEFS/uprobe_events not writable (not root?)"; done
else
	uprobe_row "${KROWS[0]}" nop5 "$W/hit-fentry" 0 "$NMID"
	uprobe_row "${KROWS[1]}" insn "$W/hit-plain" "$INT3_OFF" "$NSLOW"
	uprobe_row "${KROWS[2]}" ret "$W/hit-fentry" 0 "$NSLOW" r
fi

# ---- bpftrace ---------------------------------------------------------------------------
BROWS=("bpftrace uprobe count() (target+0, plain build)" "bpftrace uprobe count() (target+0 = NOP5, fentry build)")
if ensure bpftrace bpftrace; then
	for i in 0 1; do
		bin=$W/hit-plain
		((i == 1)) && bin=$W/hit-fentry
		row "${BROWS[$i]}" "$bin" "$NMID" bpftrace -q -e "uprobe:$bin:target { @c = count(); }" -c "$bin @N@"
	done
else
	for r in "${BROWS[@]}"; do skip "$r" "$REASON"; done
fi

# ---- uftrace ------------------------------------------------------------------------------
UROW="uftrace record (-pg build, mcount)"
if ensure uftrace uftrace; then
	row "$UROW" "$W/hit-pg" "$NFAST" uftrace record -d "$W/uftrace.data" "$W/hit-pg" @N@
else
	skip "$UROW" "$REASON"
fi

# ---- LLVM XRay ----------------------------------------------------------------------------
XROW="LLVM XRay, counting handler (__xray_patch)"
if ensure clang clang; then
	if clang $XRAY_FLAGS "$HERE/hit_xray.c" -o "$W/hit-xray" 2>"$W/err"; then
		row "$XROW" "$W/hit-xray" "$NFAST" env XRAY_HIT_ON=1 "$W/hit-xray" @N@
	else
		skip "$XROW" "clang -fxray-instrument failed: $(head -n 1 "$W/err")"
	fi
else
	skip "$XROW" "$REASON"
fi

# ---- Frida ------------------------------------------------------------------------------
FROW="Frida Interceptor, CModule onEnter count (plain build)"
PY=$(command -v python3 || true)
if [[ -z $PY ]]; then
	skip "$FROW" "no python3"
else
	if ! "$PY" -c 'import frida' 2>/dev/null && ((!QUICK)); then
		log "pip install frida"
		"$PY" -m pip install -q frida >"$W/pip.log" 2>&1
	fi
	if ! "$PY" -c 'import frida' 2>"$W/err"; then
		((QUICK)) && skip "$FROW" "python module frida not installed (--quick installs nothing)" ||
			skip "$FROW" "pip install frida failed: $(tail -n 1 "$W/pip.log")"
	else
		row "$FROW" "$W/hit-plain" "$NMID" "$PY" "$HERE/frida_hit.py" "$W/hit-plain" @N@
	fi
fi

# ---- whole program: Lua 5.4 running fib.lua -----------------------------------------------
# Wall time of whole runs (median of RUNS) of the lua-patchable build (-fpatchable-function-entry=5,
# which both ftprobe and uftrace's --patch can use), untraced and traced, plus the events each
# tool recorded (from one extra run: a tool that drops events is faster for a bad reason).
LUA_N=${LUA_N:-$((QUICK ? 18 : 32))}
LUA_NAME=() LUA_MED=() LUA_MIN=() LUA_MAX=() LUA_EV=() LUA_NOTE=() LUA_CMD=()
lua_skip() { # NAME REASON
	LUA_NAME+=("$1") LUA_MED+=("") LUA_MIN+=("") LUA_MAX+=("") LUA_EV+=("") LUA_NOTE+=("skipped: $2") LUA_CMD+=("")
	log "$1: skipped: $2"
}
# Wall times of CMD (RUNS runs); PRE, if set, is run (untimed) before each run.
lua_row() { # NAME EVENTS CMD...
	local name=$1 ev=$2 i t0 t1 ts=()
	shift 2
	log "lua: $name"
	: >"$W/stderr"
	for ((i = 0; i < RUNS; i++)); do
		[[ -n ${PRE:-} ]] && eval "$PRE"
		t0=$(now_ns)
		"$@" >/dev/null 2>>"$W/stderr" || { lua_skip "$name" "command failed: $(tail -n 2 "$W/stderr" | tr '\n' ' ' | cut -c1-150)"; return 1; }
		t1=$(now_ns)
		ts+=($((t1 - t0)))
	done
	LUA_NAME+=("$name") LUA_NOTE+=("") LUA_EV+=("$ev")
	LUA_MED+=("$(printf '%s\n' "${ts[@]}" | median | awk '{printf "%.3f", $1/1e9}')")
	LUA_MIN+=("$(printf '%s\n' "${ts[@]}" | sort -g | head -n 1 | awk '{printf "%.3f", $1/1e9}')")
	LUA_MAX+=("$(printf '%s\n' "${ts[@]}" | sort -g | tail -n 1 | awk '{printf "%.3f", $1/1e9}')")
	LUA_CMD+=("$(printf '%q ' "$@" | sed "s|$W|\$W|g; s|$ROOT/||g; s|$LUA_BIN|LUA|g; s|$LUA_SCRIPT|fib.lua|g")")
}
# ftprobe's events: entries written, and the lost count, from a run whose trace goes to awk.
ft_events() { # FTPROBE-ARGS... (before --)
	"$FTPROBE" trace --buffer-size-kb 262144 -o /dev/stdout "$@" -- "$LUA_BIN" "$LUA_SCRIPT" "$LUA_N" 2>/dev/null |
		awk '/^# lost events:/ {lost += $4} !/^#/ && !/^fib\(/ {n++} END {printf "%d (lost %d)", n, lost}'
}
# uftrace's calls: its per-thread .dat files hold 16 B per entry and 16 B per exit (no args).
uft_events() { # DIR
	du -cb "$1"/[0-9]*.dat 2>/dev/null | awk 'END {printf "%d", $1/32}'
}
LROWS=("untraced" "ftprobe function tracer, all functions" "ftprobe function tracer, -F 'luaH_*'"
	"uftrace record -P . (all functions, dynamic patching)" "uftrace record -P '^luaH_' (dynamic patching)")
LUA_BIN=$( [[ -x $ROOT/target/release/fixture-path ]] && "$ROOT/target/release/fixture-path" lua-patchable 2>/dev/null)
LUA_SCRIPT=$( [[ -x $ROOT/target/release/fixture-path ]] && "$ROOT/target/release/fixture-path" lua-script:fib.lua 2>/dev/null)
if [[ -z $LUA_BIN || ! -x $LUA_BIN || -z $LUA_SCRIPT || ! -f $LUA_SCRIPT ]]; then
	for r in "${LROWS[@]}"; do lua_skip "$r" "no lua-patchable build or fib.lua (target/release/fixture-path; cargo build --release)"; done
else
	log "lua: $LUA_BIN fib.lua $LUA_N"
	lua_row "${LROWS[0]}" "-" "$LUA_BIN" "$LUA_SCRIPT" "$LUA_N"
	FTL="$FTPROBE trace -o /dev/null --buffer-size-kb 262144"
	if ((FT_OK)); then
		lua_row "${LROWS[1]}" "$(ft_events)" $FTL -- "$LUA_BIN" "$LUA_SCRIPT" "$LUA_N"
		lua_row "${LROWS[2]}" "$(ft_events -F 'luaH_*')" $FTL -F 'luaH_*' -- "$LUA_BIN" "$LUA_SCRIPT" "$LUA_N"
	else
		lua_skip "${LROWS[1]}" "$FT_REASON"
		lua_skip "${LROWS[2]}" "$FT_REASON"
	fi
	if have uftrace; then
		# --no-libcall: only the program's own functions, as ftprobe (libc has no sites).
		PRE='rm -rf "$W/lua-uft.data"'
		if lua_row "${LROWS[3]}" "?" uftrace record --no-libcall -P . -d "$W/lua-uft.data" "$LUA_BIN" "$LUA_SCRIPT" "$LUA_N"; then
			LUA_EV[-1]=$(uft_events "$W/lua-uft.data")
		fi
		if lua_row "${LROWS[4]}" "?" uftrace record --no-libcall -P '^luaH_' -d "$W/lua-uft.data" "$LUA_BIN" "$LUA_SCRIPT" "$LUA_N"; then
			LUA_EV[-1]=$(uft_events "$W/lua-uft.data")
		fi
		PRE=
		rm -rf "$W/lua-uft.data"
	else
		lua_skip "${LROWS[3]}" "uftrace not installed"
		lua_skip "${LROWS[4]}" "uftrace not installed"
	fi
fi
lua_table() {
	local i base=${LUA_MED[0]:-}
	echo "| row (lua-patchable fib.lua $LUA_N) | wall s (median) | min-max | x untraced | events recorded |"
	echo "|---|---:|---:|---:|---:|"
	for i in "${!LUA_NAME[@]}"; do
		if [[ -z ${LUA_MED[$i]} ]]; then
			echo "| ${LUA_NAME[$i]} | ${LUA_NOTE[$i]} | | | |"
			continue
		fi
		printf '| %s | %s | %s to %s | %s | %s |\n' "${LUA_NAME[$i]}" "${LUA_MED[$i]}" "${LUA_MIN[$i]}" "${LUA_MAX[$i]}" \
			"$(awk -v a="${LUA_MED[$i]}" -v b="$base" 'BEGIN {if (b > 0) printf "%.2f", a/b; else print "n/a"}')" "${LUA_EV[$i]}"
	done
}
# Record throughput, from the in-program per-hit rows: one thread, events/s = 1e9 / ns.
throughput() {
	local i n ns b
	for i in "${!ROW_NAME[@]}"; do
		ns=${ROW_LOOP[$i]}
		[[ -n $ns && $ns != n/a ]] || continue
		case ${ROW_NAME[$i]} in
		"${FT_ROWS[0]}") n="ftprobe function tracer" b=32 ;;
		"${FT_ROWS[2]}") n="ftprobe kprobe event, 2 args" b=48 ;;
		"$UROW") n="uftrace record (-pg), per call = entry + exit record" b=32 ;;
		*) continue ;;
		esac
		awk -v n="$n" -v ns="$ns" -v b="$b" 'BEGIN {
			if (ns <= 0) {printf "- %s: %s ns per hit in program: no throughput figure\n", n, ns; exit}
			printf "- %s: %.1f ns per hit in program = %.2f M events/s, %d B per event = %.0f MB/s\n", n, ns, 1e3/ns, b, b*1e3/ns}'
	done
	# The same, whole-program: events recorded per second of added wall time in the Lua rows.
	for i in "${!LUA_NAME[@]}"; do
		[[ -n ${LUA_MED[$i]} && ${LUA_EV[$i]} =~ ^[0-9] && -n ${LUA_MED[0]} ]] || continue
		awk -v n="${LUA_NAME[$i]}" -v t="${LUA_MED[$i]}" -v b="${LUA_MED[0]}" -v e="${LUA_EV[$i]%% *}" 'BEGIN {
			if (t > b && e > 10000) printf "- Lua, %s: %d events in %.3f s added wall time = %.2f M events/s (whole command)\n", n, e, t-b, e/(t-b)/1e6}'
	done
}

# ---- the table ----------------------------------------------------------------------------
REF= REFL=
for i in "${!ROW_NAME[@]}"; do
	[[ ${ROW_NAME[$i]} == "${FT_ROWS[1]}" && -n ${ROW_NS[$i]} ]] && REF=${ROW_NS[$i]} REFL=${ROW_LOOP[$i]}
done
ratio() { awk -v a="$1" -v r="$2" 'BEGIN {if (r > 0 && a != "n/a") printf "%.1f", a/r; else print "n/a"}'; }
table() {
	echo "| row | ns/hit, wall (median) | wall min-max | x site kprobe (wall) | ns/hit, in program | x site kprobe (in program) |"
	echo "|---|---:|---:|---:|---:|---:|"
	local i
	for i in "${!ROW_NAME[@]}"; do
		if [[ -z ${ROW_NS[$i]} ]]; then
			echo "| ${ROW_NAME[$i]} | ${ROW_NOTE[$i]} | | | | |"
			continue
		fi
		printf '| %s | %s | %s to %s | %s | %s | %s |\n' "${ROW_NAME[$i]}" "${ROW_NS[$i]}" "${ROW_MIN[$i]}" \
			"${ROW_MAX[$i]}" "$(ratio "${ROW_NS[$i]}" "$REF")" "${ROW_LOOP[$i]}" "$(ratio "${ROW_LOOP[$i]}" "$REFL")"
	done
}
bases() {
	local k
	for k in "${!BASE_SLOPE[@]}"; do
		printf -- '- untraced %s (N2 = %s): %s ns per call, wall (%s to %s); %s in program\n' \
			"$(basename "${k%%:*}")" "${k##*:}" "${BASE_SLOPE[$k]}" "${BASE_MIN[$k]}" "${BASE_MAX[$k]}" "${BASE_LOOP[$k]}"
	done | sort
}
echo
table
echo
bases
echo "(slope of $RUNS runs at N = $N1 and N2; per hit = median slope minus the untraced slope;"
echo " wall: the whole command, so a tool's own work after the program (draining, formatting) counts;"
echo " in program: hit.c's own clock around its loop)"
echo
lua_table
echo
echo "Record throughput (one thread; bytes per event: ftprobe 32 B per function entry, 48 B per kprobe event with 2 args; uftrace 16 B per entry + 16 B per exit = 32 B per call):"
throughput
((QUICK)) && echo "(--quick: tiny N, one run: a smoke test, the figures mean nothing)"

if ((!QUICK)); then
	OUT=${PEERS_PASS_OUT:-$HERE/RESULTS-peers.md}
	# Medians for the run-to-run comparison: KIND<TAB>NAME<TAB>VALUE<TAB>VALUE2.
	{
		for i in "${!ROW_NAME[@]}"; do
			[[ -n ${ROW_NS[$i]} ]] && printf 'hit\t%s\t%s\t%s\n' "${ROW_NAME[$i]}" "${ROW_NS[$i]}" "${ROW_LOOP[$i]}"
		done
		for i in "${!LUA_NAME[@]}"; do
			[[ -n ${LUA_MED[$i]} ]] && printf 'lua\t%s\t%s\t%s\n' "${LUA_NAME[$i]}" "${LUA_MED[$i]}" "${LUA_EV[$i]%% *}"
		done
	} >"$OUT.tsv"
	{
		echo "# Per-hit cost, ftprobe and its peers (bench/peers.sh)"
		echo
		echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
		echo "- cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
		echo "- kernel: $(uname -r)"
		echo "- versions: $(gcc --version | head -n 1); $(have clang && clang --version | head -n 1);" \
			"$(have uftrace && uftrace --version | head -n 1); $(have bpftrace && bpftrace --version);" \
			"frida $("$PY" -c 'import frida; print(frida.__version__)' 2>/dev/null)"
		echo "- method: wall time of the whole command at N = $N1 and N = N2 calls of target()," \
			"median of $RUNS runs each; slope = (T(N2) - T(N1)) / (N2 - N1); per hit = slope minus the" \
			"untraced slope of the same binary. min-max: the slope of each run pair, minus the same." \
			"In program: the same slopes of the loop's own time (clock_gettime around it in hit.c):" \
			"what the traced program pays, without a tool's work after the program (draining, formatting)."
		echo "- builds: hit-fentry: gcc $FENTRY_FLAGS; hit-plain: gcc $PLAIN_FLAGS;" \
			"hit-pg: gcc $PG_FLAGS; hit-xray: clang $XRAY_FLAGS (bench/hit.c, bench/hit_xray.c)"
		echo
		table
		echo
		bases
		echo
		echo "## Whole program: Lua 5.4 (lua-patchable build) running fib.lua $LUA_N"
		echo
		echo "Wall time of the whole command, median of $RUNS runs; x untraced: median / untraced median." \
			"Build: lua-src's Lua 5.4 with -fpatchable-function-entry=5 (ftprobe-dev's lua-patchable), the one build" \
			"both tools can trace (uftrace cannot use the -pg -mfentry -mnop-mcount NOP5 build; -P/--patch uses the" \
			"patchable entries). Events: ftprobe, trace lines (function entries) of one extra run, and '# lost events';" \
			"uftrace (--no-libcall: the program's own functions only), calls = size of its .dat files / 32 B" \
			"(16 B entry + 16 B exit record), from the last timed run. ftprobe's all-functions row formats every" \
			"event as text after the run (-o /dev/null still formats), uftrace writes binary: see the throughput lines."
		echo
		lua_table
		echo
		echo "## Record throughput (one thread)"
		echo
		echo "From the in-program ns per hit above: events/s = 1e9 / ns. Bytes per event: ftprobe 32 B per function" \
			"entry (tsc, ip, parent_ip), 48 B per kprobe event with 2 args; uftrace 16 B per entry and 16 B per exit," \
			"32 B per call (its row is per call). Whole-program lines: events / (traced - untraced wall) in the Lua rows."
		echo
		throughput
		echo
		echo "Commands (\$W: the temp dir with the builds):"
		echo
		for i in "${!ROW_NAME[@]}"; do
			[[ -n ${ROW_CMD[$i]} ]] && printf -- '- %s: `%s`\n' "${ROW_NAME[$i]}" "${ROW_CMD[$i]}"
		done
		for i in "${!LUA_NAME[@]}"; do
			[[ -n ${LUA_CMD[$i]} ]] && printf -- '- Lua, %s: `%s` (LUA: %s, fib.lua: %s)\n' "${LUA_NAME[$i]}" "${LUA_CMD[$i]}" \
				"${LUA_BIN#$ROOT/}" "${LUA_SCRIPT#$ROOT/}"
		done
	} >"$OUT"
	log "wrote $OUT"
fi
exit 0
