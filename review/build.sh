#!/bin/sh
# Builds every reproducer (gcc 12 / g++ 12, Debian 12).
set -e
cd "$(dirname "$0")"
gcc -O2 -g -pthread mt_loop.c -o mt_loop
gcc -O2 -g sigjmp.c -o sigjmp
gcc -O2 -g sigjmp_r.c -o sigjmp_r
gcc -O2 -g -pg -mfentry -mnop-mcount -mrecord-mcount -fno-pie -no-pie -c sigjmp_r.c -o sigjmp_fentry.o
gcc -no-pie sigjmp_fentry.o -o sigjmp_fentry
gcc -O2 -g sigctx.c -o sigctx
g++ -O2 -g cxx.cpp -o cxx
g++ -O2 -g -pg -mfentry -mrecord-mcount -c cxx.cpp -o cxx_fentry.o
g++ cxx_fentry.o -o cxx_fentry
gcc -O1 -fno-builtin -g -pthread libcloop.c -o libcloop
gcc -O2 -g crash.c -o crash
gcc -O2 -g forkexec.c -o forkexec
gcc -O2 -g -pthread -fpatchable-function-entry=5 patch.c -o patch
gcc -O2 -g -pthread attach.c -o attach
gcc -O2 -g badptr.c -o badptr
gcc -O2 -g -pthread tsd.c -o tsd
gcc -O2 -g segvctx.c -o segvctx
gcc -O2 -g regs.c -o regs
gcc -O2 -g -pthread sigalt.c -o sigalt
gcc -O2 -g spawn.c -o spawn
gcc -O2 -g lj.c -o lj
g++ -O2 -g -pthread exitpaths.cpp -o exitpaths
gcc -O2 -g vfork.c -o vfork
gcc -O2 -g -pthread verify.c -o verify
gcc -O2 -g -pthread cancel.c -o cancel
