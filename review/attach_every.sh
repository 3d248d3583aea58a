#!/bin/bash
# Attach to ./verify (3 threads checking work()'s results) and, one attach at a time, probe each
# instruction boundary of work() for 0.3 s, with a fetch arg; the program must report bad=0.
FT=${FT:-/work/target-review/release/ftprobe}
cd "$(dirname "$0")"
base=$(nm verify | awk '$3=="work"{print $1}')
offs=$(objdump -d --no-show-raw-insn verify | awk '/<work>:/,/^$/' | grep -E '^ +[0-9a-f]+:' | while read a rest; do printf "0x%x " $((0x${a%:}-0x$base)); done)
./verify 1000 > /tmp/rv-vr.out 2>&1 & P=$!
sleep 0.3
n=0
for o in $offs; do
  $FT trace -p $P -o /tmp/rv-vr.txt -e "p:o work+$o x=%di s=+0(%si):string" --duration 0.1 2>/tmp/rv-vr.err || { echo "attach work+$o failed"; cat /tmp/rv-vr.err; }
  kill -0 $P 2>/dev/null || { echo "verify died after work+$o"; break; }
  n=$((n+1))
done
echo "attached $n times (of $(echo $offs | wc -w) offsets)"; kill -TERM $P 2>/dev/null; wait $P; echo "verify rc=$?"; cat /tmp/rv-vr.out
