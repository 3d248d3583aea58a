#!/usr/bin/env python3
"""frida_hit.py PROGRAM N: spawns PROGRAM N under Frida with an Interceptor on `target`
whose callback is a CModule native onEnter that counts hits, then waits for the exit
(with FRIDA_HIT_VERBOSE set, prints the count, sent from a hook on exit()).
The address of `target` comes from the symbol table (the program is non-PIE), via nm."""
import os
import subprocess
import sys
import threading

import frida

prog, n = sys.argv[1], sys.argv[2]
addr = None
for line in subprocess.run(["nm", prog], capture_output=True, text=True, check=True).stdout.splitlines():
    f = line.split()
    if len(f) == 3 and f[2] == "target":
        addr = int(f[0], 16)
if addr is None:
    sys.exit("frida_hit: no symbol target in " + prog)

JS = """
const hits = Memory.alloc(8);
const cm = new CModule(`
#include <gum/guminterceptor.h>
extern volatile gint64 hits;
void onEnter(GumInvocationContext *ic) { hits++; }
`, { hits });
Interceptor.attach(ptr('%#x'), cm);
Interceptor.attach(Module.getGlobalExportByName('exit'), {
  onEnter() { send(hits.readS64().toString()); recv('ack', () => {}).wait(); }
});
""" % addr

done = threading.Event()
pid = frida.spawn([prog, n])
session = frida.attach(pid)
session.on("detached", lambda *a: done.set())
script = session.create_script(JS)


def on_message(m, _data):
    if os.environ.get("FRIDA_HIT_VERBOSE"):
        print("frida hits:", m.get("payload", m), file=sys.stderr)
    script.post({"type": "ack"})


script.on("message", on_message)
script.load()
frida.resume(pid)
done.wait(600)
