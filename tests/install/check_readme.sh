#!/usr/bin/env bash
# Compiles every C block of README.md and docs/*.md (every fence tagged c:
# ```c or ~~~c) against an installed dragon, through the installed
# dragon.pc alone, so the documentation's code keeps up with the API a
# user gets.
#
#   check_readme.sh BUILD_DIR SOURCE_DIR
#
# CFLAGS: extra compiler flags (e.g. the sanitizers the library was built
# with).
#
# A block that defines main() is a whole program: it is compiled, linked
# and run (it must exit 0; no GPU is needed for one that uses none, and the
# kernel cache is a temporary folder). Any other block is a fragment: its
# #include lines go to the top of a file, the rest becomes the body of a
# function of its own, each `...` (the README's "handle the error") a
# `return 1;`, and the names a fragment takes from the text around it are
# declared once at file scope, with the types the API gives them (PRELUDE
# below; a fragment's own declaration of one shadows it). Fragments are
# compiled and linked, never run (their pointers are placeholders). A block
# that does not compile, does not link or (a program) fails fails the test.
#
# A compiler catches what types catch (a renamed call, a struct field that
# is gone, an args struct where a tensor goes, a pointer for a value); it
# cannot catch a mistake that is only wrong at run time in a fragment (a
# format that does not match the spec, a shape off by one, a spec text the
# parser refuses): those are the _check twins' business on a device.
set -euo pipefail
build="$1"
src="$2"
docs=("$src/README.md" "$src"/docs/*.md)
work=$(mktemp -d /tmp/dragon-readme-XXXXXX)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
pcdir=$(dirname "$(find "$work/prefix" -name dragon.pc -path '*pkgconfig*' | head -n 1)")
mkdir "$work/no-pc"
export PKG_CONFIG_PATH="$pcdir" PKG_CONFIG_LIBDIR="$work/no-pc"
cflags=$(pkg-config --cflags dragon)
libs=$(pkg-config --libs dragon)
libdir=$(pkg-config --variable=libdir dragon)

# The names README fragments use from their surroundings, as the API types
# them. Add one here when the README starts leaning on a new one.
PRELUDE='
#define DG_README_UNUSED __attribute__((unused))
static dg_spec spec DG_README_UNUSED, dspec DG_README_UNUSED;
static dg_device *dev DG_README_UNUSED;
static int64_t B DG_README_UNUSED = 2, T DG_README_UNUSED = 3;
static int n DG_README_UNUSED = 1;
static dg_dptr sa DG_README_UNUSED, sw DG_README_UNUSED, so DG_README_UNUSED;
static dg_lowrank_fwd_args a DG_README_UNUSED;
static dg_decoder_fwd_args d DG_README_UNUSED;
static dg_tensor x DG_README_UNUSED, w DG_README_UNUSED, out DG_README_UNUSED;
static dg_workspace ws DG_README_UNUSED;
static char msg[256] DG_README_UNUSED;
'

# Split the C blocks into $work/block-N.c (the block's text) and print
# each one's file and line (relative to the source folder).
awk -v dir="$work" -v src="$src" '
  BEGIN { n = 0; inside = 0 }
  {
    line = $0
    if (!inside && match(line, /^[ \t]*(```+|~~~+)[ \t]*[cC][ \t]*([ \t{].*)?$/)) {
      t = line; sub(/^[ \t]*/, "", t); fence = substr(t, 1, 3)
      n++; inside = 1; file = sprintf("%s/block-%d.c", dir, n)
      printf "" > file
      f = FILENAME; if (index(f, src "/") == 1) f = substr(f, length(src) + 2)
      print f ":" FNR > (dir "/lines")
      next
    }
    if (inside) {
      t = line; sub(/^[ \t]*/, "", t)
      if (substr(t, 1, 3) == fence && t ~ /^(```+|~~~+)[ \t]*$/) { inside = 0; close(file); next }
      print line >> file
    }
  }
  END { if (inside) { print "a C block is not closed" > "/dev/stderr"; exit 1 } }
' "${docs[@]}"

n=$(find "$work" -maxdepth 1 -name "block-*.c" | wc -l)
if [ "$n" -eq 0 ]; then
  echo "check_readme: README.md and docs/ have no C block (tagged c); nothing was checked" >&2
  exit 1
fi
mapfile -t lines < "$work/lines"

passed=0
failed=0
objs=()
for i in $(seq 1 "$n"); do
  b="$work/block-$i.c"
  fence=${lines[$((i - 1))]}         # FILE:LINE of the block's fence
  file=${fence%:*}
  start=$((${fence##*:} + 1)) # the block's first line in FILE
  at="$file:$start"
  if grep -Eq '(^|[^A-Za-z0-9_])main[[:space:]]*\(' "$b"; then
    # a whole program; messages name the file's lines
    { echo "#line $start \"$file\""; cat "$b"; } > "$work/program-$i.c"
    # shellcheck disable=SC2086
    if ! cc -std=c17 -Wall -Wextra -Werror ${CFLAGS:-} -D_POSIX_C_SOURCE=200809L "$work/program-$i.c" $cflags $libs \
         -Wl,-rpath,"$libdir" -o "$work/program-$i" 2> "$work/err-$i"; then
      echo "check_readme: $at: the program does not build:" >&2
      cat "$work/err-$i" >&2
      failed=$((failed + 1))
      continue
    fi
    if ! DRAGON_CACHE_DIR="$work/cache" DRAGON_TUNE_DB=none "$work/program-$i" > "$work/out-$i" 2>&1; then
      echo "check_readme: $at: the program fails:" >&2
      cat "$work/out-$i" >&2
      failed=$((failed + 1))
      continue
    fi
    echo "check_readme: $at: program ran: $(head -c 200 "$work/out-$i")"
  else
    # a fragment: a function of its own
    f="$work/fragment-$i.c"
    {
      echo '#include <stdint.h>'
      echo '#include <stdio.h>'
      echo '#include <stdlib.h>'
      echo '#include <string.h>'
      grep -E '^[[:space:]]*#' "$b" || true
      echo '#include <dragon/dragon.h>'
      echo "$PRELUDE"
      echo "int dg_readme_block_$i(void);"
      echo "int dg_readme_block_$i(void)"
      echo '{'
      echo "#line $start \"$file\""
      # (the #include lines went above; blank lines keep the numbering)
      sed -e 's/^[[:space:]]*#.*$//' -e 's/\.\.\./return 1;/g' "$b"
      echo '	return 0;'
      echo '}'
    } > "$f"
    # shellcheck disable=SC2086
    if ! cc -std=c17 -Wall -Wextra -Werror ${CFLAGS:-} -Wno-unused-variable -Wno-unused-but-set-variable \
         -Wno-uninitialized -Wno-maybe-uninitialized -c "$f" $cflags -o "$work/fragment-$i.o" \
         2> "$work/err-$i"; then
      echo "check_readme: $at: the fragment does not compile:" >&2
      cat "$work/err-$i" >&2
      failed=$((failed + 1))
      continue
    fi
    objs+=("$work/fragment-$i.o")
    echo "check_readme: $at: fragment compiles"
  fi
  passed=$((passed + 1))
done

# the fragments link: every function they call is in the installed library
if [ "${#objs[@]}" -gt 0 ]; then
  echo 'int main(void) { return 0; }' > "$work/main.c"
  # shellcheck disable=SC2086
  if ! cc -std=c17 ${CFLAGS:-} "$work/main.c" "${objs[@]}" $libs -Wl,-rpath,"$libdir" -o "$work/fragments" \
       2> "$work/err-link"; then
    echo "check_readme: the fragments do not link against the installed library:" >&2
    cat "$work/err-link" >&2
    failed=$((failed + 1))
  fi
fi
echo "check_readme: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
