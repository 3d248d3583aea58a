#!/bin/bash
# Probe every instruction boundary of glibc's __strlen_evex (AVX-512/EVEX code; the CPU here
# selects it) one at a time under ./libcloop 2, and compare the program's output.
# Needs libc6-dbg (the name comes from the debug file). Usage: libc_offsets.sh [FUNC]
FT=${FT:-/work/target-review/release/ftprobe}
cd "$(dirname "$0")"
F=${1:-__strlen_evex}
L=/lib/x86_64-linux-gnu/libc.so.6
start=$(gdb -q -batch -ex "info address $F" $L | grep -o '0x[0-9a-f]*' | head -1)
end=$(gdb -q -batch -ex "disassemble $F" $L | grep -E '^ +0x' | tail -1 | awk '{print $1}')
offs=$(objdump -d --no-show-raw-insn --start-address=$start --stop-address=$((end+1)) $L | grep -E '^ +[0-9a-f]+:' | while read a rest; do printf "0x%x " $((0x${a%:}-start)); done)
want=$(./libcloop 2)
fail=0; n=0
for o in $offs; do
  got=$($FT trace -o /tmp/rv-lo.txt -e "p:o libc:$F+$o" -- ./libcloop 2 2>/tmp/rv-lo.err); rc=$?
  n=$((n+1))
  if [ "$got" != "$want" ] || [ $rc != 0 ]; then echo "FAIL $F+$o rc=$rc got='$got'"; head -3 /tmp/rv-lo.err; fail=1; fi
done
echo "$n offsets of $F, fail=$fail"
exit $fail
