#!/usr/bin/env bash
# Installs the build tree into a temporary prefix and builds
# tests/install/consumer.c with nothing but the installed dragon.pc: the
# search path holds only the install's pkgconfig folder and the default one
# is an empty folder, so pkg-config sees no other .pc file (a machine with
# only the runtime packages of Lua and cJSON has none of theirs). Runs the
# consumer and the installed dragon-gen.
#
#   check_install.sh BUILD_DIR SOURCE_DIR
#
# CFLAGS: extra flags for the consumer (e.g. the sanitizers the library was
# built with).
set -euo pipefail
build="$1"
src="$2"
prefix=$(mktemp -d /tmp/dragon-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
pcdir=$(dirname "$(find "$prefix" -name dragon.pc -path '*pkgconfig*' | head -n 1)")
test -f "$pcdir/dragon.pc"
test -f "$prefix/include/dragon/dragon.h"
mkdir "$prefix/no-pc"
export PKG_CONFIG_PATH="$pcdir"
export PKG_CONFIG_LIBDIR="$prefix/no-pc"
unset PKG_CONFIG_SYSROOT_DIR

fail() {
  echo "check_install: $*" >&2
  exit 1
}

# dragon.pc asks for no other .pc file: a shared libdragon brings its own
# dependencies, and a static link gets them from Libs.private. (pkgconf
# looks at Requires.private only with --static, pkg-config 0.29 always:
# hence the grep as well as the calls.)
if grep -q '^Requires' "$pcdir/dragon.pc"; then
  fail "dragon.pc has a Requires line; a consumer without the dependencies' .pc files cannot use it"
fi
libs=$(pkg-config --libs dragon) || fail "pkg-config --libs dragon fails with only dragon.pc on the path"
cflags=$(pkg-config --cflags dragon) || fail "pkg-config --cflags dragon fails"
static=$(pkg-config --static --libs dragon) || fail "pkg-config --static --libs dragon fails"
case " $static " in
  *" -ldragon "*) ;;
  *) fail "pkg-config --static --libs dragon lacks -ldragon: $static" ;;
esac
case " $static " in
  *" -llua"*) ;;
  *) fail "pkg-config --static --libs dragon lacks Lua for a static link: $static" ;;
esac
libdir=$(pkg-config --variable=libdir dragon)
test -d "$libdir" || fail "libdir $libdir (from dragon.pc) does not exist"

# shellcheck disable=SC2086 # the flags are words
cc -std=c17 -Wall -Wextra -Werror ${CFLAGS:-} "$src/tests/install/consumer.c" \
  $cflags $libs -Wl,-rpath,"$libdir" -o "$prefix/consumer"
DRAGON_CACHE_DIR="$prefix/cache" "$prefix/consumer"
"$prefix/bin/dragon-gen" --version
"$prefix/bin/dragon" --version
"$prefix/bin/dragon-gen" render --op pack_i8x4 --canonical
echo "check_install: 1 passed, 0 failed"
