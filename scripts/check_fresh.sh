#!/usr/bin/env bash
# Proves the README's quick start on a fresh machine: debootstraps a minimal
# Debian 12 root, mounts the CUDA toolkit into it read-only (nothing else of
# this machine), clones this repo's HEAD commit there, and runs the two
# quick-start commands, scripts/setup.sh then scripts/test.sh, as a user
# would: a clean environment, root, no GPU. At the end it prints how long
# each step took, the test counts and the tests that printed "skipped"
# (test.sh's line), and exits 1 unless both commands passed and nothing
# skipped for a reason other than a missing GPU.
#
# Needs root, debootstrap (installed when missing), the Debian package
# mirror this machine's apt sources name (the first bookworm "main" source)
# and the package index this machine's pip is configured with: its pip.conf
# files, PIP_* environment and the CA file its `cert` names are copied in.
# Took 11 minutes on 2 idle cores, 33 on busy ones (debootstrap 45-83 s,
# setup.sh 71-346 s, test.sh 9-27 min with torch's ~5 GB); CI does not run it.
#   scripts/check_fresh.sh [ROOT_DIR]   (default /tmp/dragon-fresh; removed after)
set -euo pipefail
cd "$(dirname "$0")/.."
root="${1:-/tmp/dragon-fresh}"
root="${root%/}"
cuda="$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")"
head=$(git rev-parse HEAD)
[ "$(id -u)" -eq 0 ] || { echo "check_fresh: needs root (chroot, mount)" >&2; exit 2; }
case "$root" in /?*) ;; *) echo "check_fresh: ROOT_DIR must be an absolute path other than /" >&2; exit 2 ;; esac
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null

# Unmounts what this script mounted under the root, then removes it, but
# never while anything is still mounted there (a bind mount would take the
# files of this machine with it).
cleanup() {
  local m
  for m in "$root/proc" "$root/dev/shm" "$root/dev/pts" "$root$cuda"; do
    mountpoint -q "$m" 2>/dev/null && umount "$m"
  done
  if grep -q " $root[/ ]" /proc/mounts; then
    echo "check_fresh: still mounted under $root; not removing it:" >&2
    grep " $root[/ ]" /proc/mounts >&2
    return 1
  fi
  rm -rf --one-file-system "$root"
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

# pip's configuration, as this machine has it: the global config files, the
# PIP_* variables, and the CA file the `cert` option names (pip's own
# answer), copied to a file of its own there (installing ca-certificates
# rewrites the usual bundle) that PIP_CERT names.
pip_env=()
while IFS= read -r v; do
  case "$v" in PIP_CERT=*) ;; *) pip_env+=("$v") ;; esac
done < <(env | grep '^PIP_' || true)
pip_files=()
for f in /etc/pip.conf /etc/xdg/pip/pip.conf; do [ -f "$f" ] && pip_files+=("$f"); done
cert=$(python3 -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.cert='\(.*\)'\$/\1/p" | tail -n 1 || true)
root_cert=/etc/ssl/pip-ca.pem # inside the root
[ -n "$cert" ] && [ -f "$cert" ] && pip_env+=("PIP_CERT=$root_cert")

now() { date +%s; }
t0=$(now)
trap cleanup EXIT
cleanup
debootstrap --variant=minbase bookworm "$root" "$url" >/dev/null
mkdir -p "$root$cuda" "$root/dev/shm" "$root/dev/pts"
mount --bind "$cuda" "$root$cuda"
mount -o remount,bind,ro "$root$cuda"
[ "$cuda" = /usr/local/cuda ] || ln -sfn "$cuda" "$root/usr/local/cuda"
mount -t proc proc "$root/proc"
mount -t tmpfs tmpfs "$root/dev/shm"
# pseudo-terminals of its own (a test runs dragon on one), as a machine has
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
ln -sfn pts/ptmx "$root/dev/ptmx"
cp /etc/resolv.conf "$root/etc/resolv.conf"
for f in "${pip_files[@]}"; do
  mkdir -p "$root$(dirname "$f")"
  cp "$f" "$root$f"
done
[ -n "$cert" ] && [ -f "$cert" ] && mkdir -p "$root/etc/ssl" && cp "$cert" "$root$root_cert"
for v in "${pip_env[@]}"; do # local folders of wheels pip is told to look in
  case "$v" in PIP_FIND_LINKS=/*) ;; *) continue ;; esac
  for d in ${v#PIP_FIND_LINKS=}; do
    [ -d "$d" ] && mkdir -p "$root$d" && cp -a "$d/." "$root$d/"
  done
done
git clone -q --no-checkout . "$root/root/dragon"
git -C "$root/root/dragon" checkout -q --detach "$head"
t1=$(now)
echo "check_fresh: a Debian 12 root in $root ($((t1 - t0)) s), dragon $head; scripts/setup.sh" >&2

in_root() { # a clean environment: what a login would give, and pip's settings
  env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    "${pip_env[@]}" chroot "$root" /bin/bash -c "cd /root/dragon && $1"
}
log="$root/root/check_fresh.log"
st=0
in_root scripts/setup.sh 2>&1 | tee "$log" || st=1
t2=$(now)
echo "check_fresh: setup.sh $([ $st = 0 ] && echo passed || echo FAILED) ($((t2 - t1)) s); scripts/test.sh" >&2
tst=0
if [ $st = 0 ]; then
  in_root scripts/test.sh 2>&1 | tee -a "$log" || tst=1
fi
t3=$(now)

counts=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$log" | tail -n 1 || true)
skips=$(grep '^test.sh: [0-9]* tests printed "skipped"' "$log" | tail -n 1 || true)
echo "check_fresh: debootstrap $((t1 - t0)) s, setup.sh $((t2 - t1)) s, test.sh $((t3 - t2)) s"
echo "check_fresh: setup.sh $([ $st = 0 ] && echo passed || echo FAILED); test.sh $([ $st = 0 ] && [ $tst = 0 ] && echo passed || echo FAILED): ${counts:-no ctest summary}"
echo "check_fresh: ${skips#test.sh: }"
[ $st = 0 ] && [ $tst = 0 ] && grep -q 'other than a missing GPU: none$' <<<"$skips"
