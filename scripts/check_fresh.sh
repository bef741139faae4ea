#!/usr/bin/env bash
# Proves the README's quick start on a fresh machine: debootstraps a minimal
# Debian 12 root, mounts the CUDA toolkit into it read-only (nothing else of
# this machine), clones this repo's HEAD there, and runs the two quick-start
# commands. Needs root, debootstrap and the Debian package mirror this
# machine's apt sources name (the first bookworm "main" source).
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
# The mirror: the URI of the first binary ("deb") source of bookworm's main
# component, from the deb822 .sources files or the one-line sources.list
# format (whose [options] may precede the URI). No host is written here:
# debootstrap gets what this machine's apt already uses.
mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
         { types = suites = comps = uri = ""
           for (i = 1; i <= NF; i++) {
             if ($i ~ /^Types:/) types = " " substr($i, 7) " "
             else if ($i ~ /^Suites:/) suites = " " substr($i, 8) " "
             else if ($i ~ /^Components:/) comps = " " substr($i, 12) " "
             else if ($i ~ /^URIs:/) { split(substr($i, 6), u, " "); uri = u[1] } }
           if (types ~ /[ \t]deb[ \t]/ && suites ~ /[ \t]bookworm[ \t]/ && comps ~ /[ \t]main[ \t]/ && uri != "") {
             print uri; exit } }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" { i = 2
           if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
           if ($(i + 1) != "bookworm") next
           for (k = i + 2; k <= NF; k++) if ($k == "main") { print $i; exit } }' "$f"
  done
}
url=$(mirror | head -n 1)
[ -n "$url" ] || { echo "check_fresh: no bookworm source in /etc/apt/sources*; debootstrap needs a mirror" >&2; exit 2; }

trap cleanup EXIT
cleanup
debootstrap --variant=minbase bookworm "$root" "$url" >/dev/null
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
