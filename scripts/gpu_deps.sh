#!/usr/bin/env bash
# Fetches the Debian packages a GPU machine without network needs to build
# and test dragon (Lua 5.4, cJSON, Criterion and the libraries they load,
# pkgconf) into .gpu/debs, for scripts/gpu_test.sh to unpack there, the
# built-in corpus (scripts/corpus.sh) into .gpu/corpus/shakespeare.txt
# (4.8 MiB), and the wheels the Python tests install (pytest, setuptools)
# into .gpu/wheels.
#
#   scripts/gpu_deps.sh            (run here: Debian 12, amd64, with network)
#
# Idempotent: a package whose .deb is already there is not fetched again, and
# .debs no longer wanted are removed. `apt-get update` runs only when apt
# cannot find a package. The folder is ignored by git; it travels to the GPU
# machine when named in the device tool's `carry` (".gpu/debs",
# ".gpu/corpus").
#
# What is fetched: the -dev packages (headers, .pc files, .so links) without
# their dependencies (gpu_test.sh rewrites the .pc files for a shared build,
# so Criterion's Requires.private of libgit2-dev & co. are not needed), and
# the run-time closure of the shared libraries and of pkgconf, minus what any
# Linux with a C compiler has (libc6, libgcc-s1, libstdc++6, zlib1g).
# Whether the GPU machine already has one of these libraries is decided
# there, by soname: gpu_test.sh only puts the missing ones on the path.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=.gpu/debs
dev=(liblua5.4-dev libcjson-dev libcriterion-dev)
runtime_roots=(liblua5.4-0 libcjson1 libcriterion3 pkgconf)
assumed=(libc6 libgcc-s1 libstdc++6 zlib1g gcc-12-base debconf)
limit=$((32 * 1024 * 1024)) # the working tree that travels is capped at 64 MiB

arch=$(dpkg --print-architecture)
if [ "$arch" != amd64 ]; then
  echo "gpu_deps.sh: this machine is $arch; the GPU machine is amd64: run this on an amd64 Debian 12" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

# The run-time closure, by package name (apt-cache prints virtual packages in
# <angle brackets>; a real package always provides them in the list too).
closure() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${runtime_roots[@]}" 2>/dev/null |
    grep -v '^ ' | grep -v '^<' | sort -u
}
uris() { apt-get download --print-uris "$@" 2>/dev/null; }

if ! apt-cache show "${dev[@]}" "${runtime_roots[@]}" >/dev/null 2>&1 ||
   [ -z "$(uris "${dev[@]}")" ]; then
  echo "gpu_deps.sh: apt does not know the packages yet; running apt-get update" >&2
  $SUDO apt-get update -qq
fi

mapfile -t deps < <(closure)
pkgs=("${dev[@]}")
for p in "${deps[@]}"; do
  skip=0
  for a in "${assumed[@]}"; do [ "$p" = "$a" ] && skip=1; done
  [ "$skip" = 1 ] || pkgs+=("$p")
done

# name → the file apt-get download writes (version and arch in it).
declare -A want=()
while read -r _url file _size _hash; do
  want["$file"]=1
done < <(uris "${pkgs[@]}")
if [ "${#want[@]}" -ne "${#pkgs[@]}" ]; then
  echo "gpu_deps.sh: apt found ${#want[@]} of ${#pkgs[@]} packages (${pkgs[*]}); try 'apt-get update'" >&2
  exit 1
fi

mkdir -p "$dir"
for f in "$dir"/*.deb; do
  [ -e "$f" ] || continue
  if [ -z "${want[$(basename "$f")]+x}" ]; then
    echo "gpu_deps.sh: removing $(basename "$f") (no longer wanted)" >&2
    rm -f "$f"
  fi
done
missing=()
for file in "${!want[@]}"; do
  [ -s "$dir/$file" ] || missing+=("${file%%_*}") # files are NAME_VERSION_ARCH.deb
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "gpu_deps.sh: fetching ${missing[*]}" >&2
  sandbox=()
  [ "$(id -u)" -eq 0 ] && sandbox=(-o APT::Sandbox::User=root) # _apt cannot write here
  (cd "$dir" && apt-get download -qq "${sandbox[@]}" "${missing[@]}")
fi

printf '%-48s %10s\n' "package file" "bytes"
total=0
for f in "$dir"/*.deb; do
  n=$(stat -c %s "$f")
  total=$((total + n))
  printf '%-48s %10d\n' "$(basename "$f")" "$n"
done
printf '%-48s %10d (%.1f MiB, %d files; %d fetched now)\n' total "$total" \
  "$(awk -v t="$total" 'BEGIN { print t / 1048576 }')" "${#want[@]}" "${#missing[@]}"
if [ "$total" -gt "$limit" ]; then
  echo "gpu_deps.sh: $dir holds $total bytes, over the $limit this script allows (the tree that travels is capped at 64 MiB)" >&2
  exit 1
fi
scripts/corpus.sh --out .gpu/corpus/shakespeare.txt
# The Python package's tests there (tests/scripts/check_python.sh, offline:
# pip --no-index --find-links .gpu/wheels): pytest and setuptools as
# pure-Python wheels, for any Python 3 the machine has.
wheels=.gpu/wheels
mkdir -p "$wheels"
if ! ls "$wheels"/pytest-*.whl "$wheels"/setuptools-*.whl >/dev/null 2>&1; then
  echo "gpu_deps.sh: fetching the pytest and setuptools wheels" >&2
  python3 -m pip download -q --only-binary=:all: --dest "$wheels" pytest setuptools
fi
echo "gpu_deps.sh: ready; on the GPU machine run scripts/gpu_test.sh with carry [\"$dir\", \".gpu/corpus\", \"$wheels\"]" >&2
