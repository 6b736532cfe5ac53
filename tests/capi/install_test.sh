#!/bin/bash
# The embedding package end to end: `cmake --install` of the build into a temporary prefix,
# then examples/embed built against it with find_package(zinf) and with pkg-config, each
# linked to libzinf.so and to libzinf.a, and run; and libzinf.so exports nothing but zinf_*
# (under its version node).
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" --component zinf > "$tmp/install.log"
test -f "$tmp/prefix/include/zinf/zinf.h"
lib=$(ls "$tmp"/prefix/lib*/libzinf.so)
# Exported symbols: zinf_* only.
bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^zinf_' | grep -v '^ZINF_0\.1$' || true)
if [ -n "$bad" ]; then
  echo "libzinf.so exports symbols outside zinf_*:"; echo "$bad" | head -20; exit 1
fi
nm -D --defined-only "$lib" | grep -q ' zinf_io_pread@@ZINF_0.1$' ||
  { echo "zinf_io_pread is not under the version node ZINF_0.1"; exit 1; }
mkdir -p "$tmp/work"
# find_package(zinf)
cmake -S "$src/examples/embed" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_RPATH="$(dirname "$lib")" > "$tmp/cmake.log"
cmake --build "$tmp/cmake-build" > "$tmp/build.log"
"$tmp/cmake-build/embed" "$tmp/work"
"$tmp/cmake-build/embed-static" "$tmp/work"
if ldd "$tmp/cmake-build/embed-static" | grep -q libzinf; then
  echo "embed-static loads libzinf.so"; exit 1
fi
# pkg-config
export PKG_CONFIG_PATH=$(dirname "$lib")/pkgconfig
cc -std=c99 -Wall -Wextra -Werror "$src/examples/embed/embed.c" -o "$tmp/embed-pc" \
  $(pkg-config --cflags --libs zinf) -lm -Wl,-rpath,"$(dirname "$lib")"
"$tmp/embed-pc" "$tmp/work"
cc -std=c99 -Wall -Wextra -Werror "$src/examples/embed/embed.c" -o "$tmp/embed-pc-static" \
  $(pkg-config --cflags --libs zinf-static) -lm
"$tmp/embed-pc-static" "$tmp/work"
echo "install_test: ok"
