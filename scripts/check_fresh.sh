#!/usr/bin/env bash
# Proves the README's quick start on a fresh machine: debootstraps a minimal
# Debian 12 root, mounts the CUDA toolkit into it read-only (nothing else of
# this machine), clones this repo's HEAD there, and runs the two quick-start
# commands. Needs root, debootstrap and Debian's package mirror.
#   scripts/check_fresh.sh [ROOT_DIR]   (default /tmp/dragon-fresh; removed after)
set -euo pipefail
cd "$(dirname "$0")/.."
root="${1:-/tmp/dragon-fresh}"
cuda="$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")"
[ "$(id -u)" -eq 0 ] || { echo "check_fresh: needs root (chroot, mount)" >&2; exit 2; }
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null

cleanup() {
  umount "$root/proc" 2>/dev/null || true
  umount "$root$cuda" 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT
cleanup
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
mkdir -p "$root$cuda"
mount --bind "$cuda" "$root$cuda"
mount -o remount,bind,ro "$root$cuda"
ln -sfn "$cuda" "$root/usr/local/cuda"
mount -t proc proc "$root/proc"
cp /etc/resolv.conf "$root/etc/resolv.conf"
git clone -q . "$root/root/dragon"
chroot "$root" /bin/bash -c 'cd /root/dragon && export HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin &&
  scripts/setup.sh && scripts/test.sh'
echo "check_fresh: 1 passed, 0 failed"
