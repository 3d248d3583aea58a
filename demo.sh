#!/usr/bin/env bash
# Set up and run ftprobe's main job on a real program: Lua 5.4 (built from the lua-src crate's
# sources with ftrace sites) running its bundled script, traced with the function tracer on
# luaH_* and two kprobe events with arguments on the same sites. Extra arguments replace
# those (e.g. ./demo.sh -F 'luaV_*').
set -euo pipefail
cd "$(dirname "$0")"

# The system packages the build needs (compilers, libiberty, <sys/sdt.h>): installed if
# missing, quietly.
scripts/deps.sh build
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
