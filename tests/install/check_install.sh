#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, builds tests/install/consumer.c
# with nothing but `pkg-config dragon`, runs it, and runs the installed
# dragon-gen. Usage: check_install.sh BUILD_DIR SOURCE_DIR (CFLAGS: extra
# flags for the consumer, e.g. the sanitizers the library was built with)
set -euo pipefail
build="$1"
src="$2"
prefix=$(mktemp -d /tmp/dragon-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(find "$prefix" -name dragon.pc -path '*pkgconfig*' -exec dirname {} \;)
# the install first; where the dependencies come from (a private prefix on
# the GPU machine) stays on the path after it
export PKG_CONFIG_PATH="$libdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
test -f "$prefix/include/dragon/dragon.h"
cc -std=c17 -Wall -Wextra -Werror ${CFLAGS:-} "$src/tests/install/consumer.c" \
  $(pkg-config --cflags --libs dragon) -Wl,-rpath,"$(pkg-config --variable=libdir dragon)" \
  -o "$prefix/consumer"
"$prefix/consumer"
"$prefix/bin/dragon-gen" --version
"$prefix/bin/dragon-gen" render --op pack_i8x4 --canonical
echo "check_install: 1 passed, 0 failed"
