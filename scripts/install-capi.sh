#!/usr/bin/env bash
# Install ftprobe's C API into PREFIX: include/ftprobe.h, lib/libftprobe.so, lib/libftprobe.a,
# lib/pkgconfig/ftprobe.pc (shared) and lib/pkgconfig/ftprobe-static.pc (static).
#
#   scripts/install-capi.sh PREFIX
#
# Builds the release libraries first (cargo build --release -p ftprobe-capi, honouring
# CARGO_TARGET_DIR), unless FTPROBE_CAPI_LIBDIR names a directory that holds them already
# (libftprobe_c.so and libftprobe_c.a: the tests install what `cargo test` built).
#
# Then:  gcc prog.c $(pkg-config --cflags --libs ftprobe)
#        gcc prog.c $(pkg-config --static --cflags --libs ftprobe-static)
# with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig (and LD_LIBRARY_PATH=PREFIX/lib or an rpath to
# run the shared build).
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 PREFIX" >&2
    exit 2
fi
repo="$(cd "$(dirname "$0")/.." && pwd)"
prefix="$(mkdir -p "$1" && cd "$1" && pwd)"
capi="$repo/crates/ftprobe-capi"

libdir="${FTPROBE_CAPI_LIBDIR:-}"
if [ -z "$libdir" ]; then
    (cd "$repo" && cargo build --release -p ftprobe-capi)
    libdir="${CARGO_TARGET_DIR:-$repo/target}/release"
fi
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n1)"

install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 0644 "$capi/include/ftprobe.h" "$prefix/include/ftprobe.h"
# The shared library's SONAME is libftprobe.so (crates/ftprobe-capi/build.rs).
install -m 0755 "$libdir/libftprobe_c.so" "$prefix/lib/libftprobe.so"
install -m 0644 "$libdir/libftprobe_c.a" "$prefix/lib/libftprobe.a"
for pc in ftprobe ftprobe-static; do
    sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$capi/$pc.pc.in" \
        >"$prefix/lib/pkgconfig/$pc.pc"
done
echo "installed ftprobe $version into $prefix"
