#!/usr/bin/env bash
# Set up and run ftprobe's main job on a real program: Lua 5.4 (built from the lua-src crate's
# sources with ftrace sites) running its bundled script, traced with the function tracer on
# luaH_* and two kprobe events with arguments on the same sites. Extra arguments replace
# those (e.g. ./demo.sh -F 'luaV_*').
set -euo pipefail
cd "$(dirname "$0")"

need=()
command -v cc >/dev/null || need+=(gcc)
command -v g++ >/dev/null || need+=(g++)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
# libiberty: the C++ demangler c++filt uses (ftprobe links it; see crates/ftprobe/build.rs).
[ -e /usr/include/libiberty/demangle.h ] || need+=(libiberty-dev)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq "${need[@]}"
    else
        sudo apt-get update -qq && sudo apt-get install -y -qq "${need[@]}"
    fi
fi
if ! command -v cargo >/dev/null; then
    echo "demo.sh: cargo not found; install Rust (https://rustup.rs), then run this again" >&2
    exit 1
fi

cargo build --release --workspace --quiet
bin="${CARGO_TARGET_DIR:-target}/release"
lua=$("$bin/fixture-path" lua-fentry-nop)
filters=("$@")
[ ${#filters[@]} -gt 0 ] || filters=(
    -F 'luaH_*'
    -e 'p:newtable luaH_new L=%di'
    -e 'p:resize luaH_resize t=$arg2 asize=$arg3:u32 hsize=$arg4:u32'
)
echo "+ ftprobe trace ${filters[*]} -- $lua    (runs the bundled tables.lua)" >&2
exec "$bin/ftprobe" trace "${filters[@]}" -- "$lua"
