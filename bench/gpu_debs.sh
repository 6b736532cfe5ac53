#!/usr/bin/env bash
# bench/gpu_debs.sh — fetch (not install) the Debian packages that bench/gpu_check.sh builds
# against into .debs/ (ignored by git), for carrying to a lent GPU machine, which has no package
# registry (../shared/device/README.md):
#
#   bash bench/gpu_debs.sh [SHARED_DIR]     # SHARED_DIR: default ../shared
#
# The shared packer's default list, plus what a configure against those packages alone was
# found to need (rehearsed here: `ZINF_GPU_CHECK_SYSROOT=/tmp/sr bash bench/gpu_check.sh`
# configures and links against the unpacked packages, the GPU parts skipping): TBB's CMake
# targets name libtbbbind (libtbbbind-2-5, which wants libhwloc15), the tests link GMock
# (libgmock-dev), and the image may lack pkg-config (pkgconf, pkgconf-bin, libpkgconf3).
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${1:-../shared}
grep -qx "/.debs/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.debs/ >>.git/info/exclude; }
bash "$shared/device/pack-debs.sh" .debs
bash "$shared/device/pack-debs.sh" .debs libtbbbind-2-5 libhwloc15 libgmock-dev pkgconf \
  pkgconf-bin libpkgconf3
cp "$shared/device/unpack-debs.sh" .debs/
