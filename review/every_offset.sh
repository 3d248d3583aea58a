#!/bin/bash
# Probe every instruction boundary of mt_loop's work(), one at a time and all at once,
# and compare kprobe_profile hits with work_truth.py. Usage: every_offset.sh [N] [THREADS]
FT=${FT:-/work/target-review/release/ftprobe}
cd "$(dirname "$0")"
N=${1:-20000}; T=${2:-4}
want=$(N=$N ./mt_loop $T)
./work_truth.py $N $T > /tmp/rv-truth.txt
fail=0; all=()
while read off cnt; do
  all+=(-e "p:o$off work+$off")
  prog=$(N=$N $FT trace -o /tmp/rv-trace.txt -e "p:o$off work+$off" -- ./mt_loop $T 2>/tmp/rv-err.txt); rc=$?; out=$(cat /tmp/rv-trace.txt)
  hits=$(echo "$out" | awk -v e="o$off" '/^# kprobe_profile/{p=1;next} p && $2==e {print $3}')
  opt=$(echo "$out" | grep -c OPTIMIZED)
  if [ "$prog" != "$want" ] || [ "$rc" != 0 ] || [ "$hits" != "$cnt" ]; then
    echo "FAIL work+$off rc=$rc hits=$hits want=$cnt opt=$opt prog='$prog'"; head -3 /tmp/rv-err.txt; fail=1
  else echo "ok work+$off hits=$hits opt=$opt"; fi
done < /tmp/rv-truth.txt
echo "== all at once"
prog=$(N=$N $FT trace -o /tmp/rv-trace.txt "${all[@]}" -- ./mt_loop $T 2>/tmp/rv-err.txt); rc=$?; out=$(cat /tmp/rv-trace.txt)
echo "rc=$rc prog=$prog want=$want optimized=$(echo "$out" | grep -c OPTIMIZED)"
echo "$out" | awk '/^# kprobe_profile/{p=1;next} p {print $2, $3}' | sed 's/^o//' > /tmp/rv-got.txt
diff <(sort /tmp/rv-truth.txt) <(sort /tmp/rv-got.txt) && echo "all-at-once counts ok" || fail=1
exit $fail
