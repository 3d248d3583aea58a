#!/usr/bin/env bash
# The Debian 12 packages ftprobe needs, in one list, by purpose:
#   scripts/deps.sh build   what `cargo build --workspace` needs (./demo.sh calls this)
#   scripts/deps.sh test    what `cargo test --workspace` needs besides (the README's test
#                           command asks for both groups; so does .ci/run)
# Installs what is missing, quietly (apt's output goes to a log, shown only if it fails);
# uses sudo when not root. Exit 0 when everything asked for is there.
set -euo pipefail

# gcc/g++ and the C library's headers build the fixtures (crates/ftprobe-dev/build.rs, every
# C and C++ test program and Lua, built with the workspace); libiberty-dev is the C++
# demangler ftprobe links (c++filt's: crates/ftprobe/build.rs stops without it);
# systemtap-sdt-dev is <sys/sdt.h>, for the SDT marker fixtures; ca-certificates lets cargo
# fetch crates over HTTPS.
build=(gcc g++ libc6-dev libiberty-dev systemtap-sdt-dev ca-certificates)
# The tests' truths and tools: uftrace (the function_graph comparison), binutils' readelf
# (SDT notes), gdb (an optional check), libc6-dbg (libc's symbols, found by build-id, for the
# stripped-library probes), clang with its XRay runtime (the XRay-sled fixtures), make and
# pkg-config (the C API examples), python3 and pip (the perfetto package reads
# `dump --perfetto`'s traces).
test=(make pkg-config gdb libc6-dbg uftrace clang libclang-rt-14-dev binutils python3 python3-pip)

want=()
for group in "$@"; do
    case $group in
        build) want+=("${build[@]}") ;;
        test) want+=("${test[@]}") ;;
        *) echo "usage: scripts/deps.sh build|test..." >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: scripts/deps.sh build|test..." >&2; exit 2; }

missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "scripts/deps.sh: not root and no sudo: install ${missing[*]} as root" >&2
        exit 1
    fi
}

if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null; then
        echo "scripts/deps.sh: no apt-get: install the equivalents of ${missing[*]}" >&2
        exit 1
    fi
    log=$(mktemp)
    echo "scripts/deps.sh: installing ${missing[*]} (apt-get)" >&2
    if ! as_root env DEBIAN_FRONTEND=noninteractive sh -c \
        'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"' sh "${missing[@]}" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        echo "scripts/deps.sh: apt-get failed (log above)" >&2
        exit 1
    fi
    rm -f "$log"
fi

# The perfetto Python package (a system Python may need --break-system-packages).
if [[ " $* " == *" test "* ]] && ! python3 -c 'import perfetto' 2>/dev/null; then
    echo "scripts/deps.sh: installing the perfetto Python package (pip)" >&2
    pip=(python3 -m pip install -q --disable-pip-version-check perfetto)
    # pip has its own CA bundle: the one the system names, if any (a proxy's CA).
    if [ -z "${PIP_CERT:-}" ] && [ -n "${SSL_CERT_FILE:-}" ]; then
        pip+=(--cert "$SSL_CERT_FILE")
    fi
    if ! "${pip[@]}" 2>/dev/null && ! "${pip[@]}" --break-system-packages >&2; then
        echo "scripts/deps.sh: pip could not install perfetto (tests/perfetto.rs needs it)" >&2
        exit 1
    fi
fi
