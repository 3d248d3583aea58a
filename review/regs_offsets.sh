#!/bin/bash
# Probe every instruction of regs' mix() (one at a time, then all at once; optimized and not)
# and compare the program's result with the untraced run's.
FT=${FT:-/work/target-review/release/ftprobe}
cd "$(dirname "$0")"
n=${1:-2000}
want=$(./regs $n 2>/dev/null)
offs=$(objdump -d --no-show-raw-insn regs | awk '/<mix>:/,/^$/' | grep -E '^ +[0-9a-f]+:' | while read a rest; do printf "0x%x " $((0x${a%:}-0x$(nm regs | awk '$3=="mix"{print $1}'))); done)
fail=0
for opt in 1 0; do
  all=()
  for o in $offs; do
    all+=(-e "p:o$o mix+$o a=%ax c=%cx f=%flags")
    got=$(FTPROBE_KPROBES_OPTIMIZATION=$opt $FT trace -o /tmp/rv-rg.txt -e "p:o mix+$o a=%ax c=%cx" -- ./regs $n 2>/tmp/rv-rg.err); rc=$?
    st=$(grep -c OPTIMIZED /tmp/rv-rg.txt); hits=$(awk '$2=="o"{print $3}' /tmp/rv-rg.txt)
    if [ "$got" != "$want" ] || [ $rc != 0 ] || { [ "$hits" != $((n*50)) ] && [ "$hits" != 50 ]; }; then echo "FAIL opt=$opt mix+$o rc=$rc got=$got want=$want hits=$hits optimized=$st"; head -3 /tmp/rv-rg.err; fail=1; else echo "ok opt=$opt mix+$o optimized=$st"; fi
  done
  got=$(FTPROBE_KPROBES_OPTIMIZATION=$opt $FT trace -o /tmp/rv-rg.txt "${all[@]}" -- ./regs $n 2>/tmp/rv-rg.err); rc=$?
  echo "all opt=$opt rc=$rc got=$got want=$want optimized=$(grep -c OPTIMIZED /tmp/rv-rg.txt)"; [ "$got" == "$want" ] || { fail=1; head -3 /tmp/rv-rg.err; }
done
rm -f /tmp/rv-rg.txt
exit $fail
