#!/usr/bin/env bash
# Install ftprobe into PREFIX: bin/ftprobe, lib/libftprobe_agent.so (the agent it loads into
# its targets; `ftprobe` finds it in ../lib), and the C API (scripts/install-capi.sh:
# include/ftprobe.h, lib/libftprobe.{so,a}, lib/pkgconfig/ftprobe*.pc).
#
#   scripts/install.sh PREFIX        e.g. scripts/install.sh ~/.local   (then ~/.local/bin on PATH)
#
# Builds the release binaries first (cargo build --release, honouring CARGO_TARGET_DIR). They
# carry no debug info (Cargo.toml's release profile); the installed files are stripped of
# anything left (strip --strip-debug). `cargo install --path crates/ftprobe-cli` works too:
# that `ftprobe` carries the agent and writes it out when it first needs it.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 PREFIX" >&2
    exit 2
fi
repo="$(cd "$(dirname "$0")/.." && pwd)"
prefix="$(mkdir -p "$1" && cd "$1" && pwd)"
(cd "$repo" && cargo build --release --quiet -p ftprobe-cli -p ftprobe-agent -p ftprobe-capi)
out="${CARGO_TARGET_DIR:-$repo/target}/release"
install -d "$prefix/bin" "$prefix/lib"
install -m 0755 "$out/ftprobe" "$prefix/bin/ftprobe"
install -m 0755 "$out/libftprobe_agent.so" "$prefix/lib/libftprobe_agent.so"
if command -v strip >/dev/null; then
    strip --strip-debug "$prefix/bin/ftprobe" "$prefix/lib/libftprobe_agent.so"
fi
FTPROBE_CAPI_LIBDIR="$out" "$repo/scripts/install-capi.sh" "$prefix" >/dev/null
echo "installed ftprobe into $prefix (bin/ftprobe, lib/libftprobe_agent.so, the C API)"
