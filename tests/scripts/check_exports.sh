#!/usr/bin/env bash
# libdragon's exports are its public API and nothing else: the functions
# the installed headers (include/dragon/*.h) declare with DG_API, each of
# them exported and no other symbol, fewer than 300 of them, no internal name
# (dg__*) among them, and no internal name in an installed header. Fails
# naming what breaks the rule.
#   tests/scripts/check_exports.sh LIBDRAGON SOURCE_DIR
# Symbols the toolchain adds (reserved names: _init, __bss_start, a
# sanitizer's __asan_*) are left out of the count and the comparison.
set -uo pipefail
lib=${1:?libdragon.so}
src=${2:?source dir}
max=299
fail=0
bad() {
  echo "check_exports: $*" >&2
  fail=1
}

exported=$(nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | grep -v '^_' | sort -u) ||
  { echo "check_exports: nm -D $lib failed" >&2; exit 1; }
# Every DG_API declaration: the identifier before the first '(' of the
# line DG_API begins (the name and its '(' are on that line).
declared=$(cat "$src"/include/dragon/*.h | grep -E '^DG_API ' |
  sed -E 's/^([^(]*[^A-Za-z0-9_(])([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\(.*/\2/' | sort -u)

n=$(printf '%s\n' "$exported" | grep -c .)
if [ "$n" -gt "$max" ]; then
  bad "libdragon exports $n symbols, more than $max: mark fewer functions DG_API (declare the library's own in a header beside their sources)"
fi
internal=$(printf '%s\n' "$exported" | grep '^dg__')
[ -z "$internal" ] || bad "internal symbols exported:" $internal
extra=$(comm -23 <(printf '%s\n' "$exported") <(printf '%s\n' "$declared"))
[ -z "$extra" ] || bad "exported without a DG_API declaration in include/dragon/:" $extra
missing=$(comm -13 <(printf '%s\n' "$exported") <(printf '%s\n' "$declared"))
[ -z "$missing" ] || bad "declared DG_API in include/dragon/ but not exported (defined static, or not at all?):" $missing
unmarked=$(grep -nE '^[a-z][a-z0-9_ ]*[ *]dg_[a-z0-9_]+[[:space:]]*\(' "$src"/include/dragon/*.h | grep -v ':typedef ')
[ -z "$unmarked" ] || bad "function declarations in include/dragon/ without DG_API:
$unmarked"
leaked=$(grep -n 'dg__' "$src"/include/dragon/*.h)
[ -z "$leaked" ] || bad "internal (dg__) names in installed headers:
$leaked"

[ "$fail" = 0 ] && echo "check_exports: $n symbols exported (at most $max), each declared DG_API in include/dragon/"
exit "$fail"
