#!/usr/bin/env bash
# Run the README's two commands as a new user meets them: on a fresh Debian 12 root.
#
#   scripts/fresh-debian.sh [ROOT]        (as root; ROOT: /var/tmp/ftprobe-fresh-debian)
#
# Makes ROOT anew with `debootstrap --variant=minbase bookworm` (from $DEBIAN_MIRROR,
# http://deb.debian.org/debian by default), binds this machine's Rust toolchain into it
# read-only (`rustc --print sysroot`, at /opt/rust: Rust is the one thing the README assumes
# installed), clones this repository's committed HEAD into it, and runs, in a chroot, the
# commands of the README's "Two commands" block, one after the other, exactly as written.
# The host's CA file ($SSL_CERT_FILE, when set) is copied in for cargo, apt and pip, with
# SSL_CERT_FILE, CARGO_HTTP_CAINFO and PIP_CERT set. Exit status: the first failing command's.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-/var/tmp/ftprobe-fresh-debian}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
say() { printf 'fresh-debian: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { say "run as root (debootstrap, mounts, chroot)"; exit 2; }
# In a mount namespace of its own, with private propagation: the root's mounts never reach
# the host's (a bind of /dev in a shared tree would carry them there), and go with it.
if [ -z "${FRESH_DEBIAN_NS:-}" ]; then
    exec env FRESH_DEBIAN_NS=1 unshare --mount --propagation private "$0" "$@"
fi
command -v debootstrap >/dev/null || {
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}
sysroot=$(rustc --print sysroot)

mounts=()
cleanup() {
    local i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        umount -l "${mounts[i]}" 2>/dev/null || true
    done
}
trap cleanup EXIT
mnt() { # mnt TARGET MOUNT-ARGS...
    mkdir -p "$1"
    mount "${@:2}" "$1"
    mounts+=("$1")
}

# Anew every time: nothing left from an earlier run.
if [ -e "$root" ]; then
    if grep -q " $root/" /proc/mounts; then
        say "$root has mounts; unmount them first"
        exit 2
    fi
    rm -rf "$root"
fi
say "debootstrap --variant=minbase bookworm $root ($mirror)"
start=$SECONDS
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 || {
    tail -n 20 "$root.debootstrap.log" >&2
    exit 1
}
say "root made in $((SECONDS - start)) s"

cp /etc/resolv.conf "$root/etc/resolv.conf"
ca_env=()
if [ -n "${SSL_CERT_FILE:-}" ] && [ -f "$SSL_CERT_FILE" ]; then
    mkdir -p "$root/etc/ssl"
    cp "$SSL_CERT_FILE" "$root/etc/ssl/host-ca.pem"
    ca_env=(SSL_CERT_FILE=/etc/ssl/host-ca.pem CARGO_HTTP_CAINFO=/etc/ssl/host-ca.pem
        PIP_CERT=/etc/ssl/host-ca.pem)
fi
mnt "$root/proc" -t proc proc
mnt "$root/sys" -t sysfs sysfs
mnt "$root/dev" --bind /dev
mnt "$root/dev/pts" -t devpts devpts
mnt "$root/dev/shm" -t tmpfs tmpfs
mnt "$root/opt/rust" --bind "$sysroot"
mount -o remount,bind,ro "$root/opt/rust"

git clone -q "$repo" "$root/home/user/ftprobe"
say "cloned $(git -C "$repo" rev-parse --short HEAD) into /home/user/ftprobe"

# The README's "Two commands" block, comments dropped.
mapfile -t cmds < <(awk '
    /^## Two commands/ { in_sec = 1; next }
    in_sec && /^```sh/ { in_code = 1; next }
    in_code && /^```/ { exit }
    in_code { sub(/[ \t]+#.*$/, ""); if (length($0)) print }
' "$root/home/user/ftprobe/README.md")
[ ${#cmds[@]} = 2 ] || { say "the README's Two commands block has ${#cmds[@]} commands"; exit 1; }

for c in "${cmds[@]}"; do
    say "\$ $c"
    start=$SECONDS
    rc=0
    chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 "${ca_env[@]}" \
        PATH=/opt/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        bash -c "cd /home/user/ftprobe && $c" || rc=$?
    say "exit $rc after $((SECONDS - start)) s: $c"
    [ "$rc" = 0 ] || exit "$rc"
done
say "both README commands passed on a fresh Debian 12 root"
