#!/usr/bin/env bash
# Assembles the dependency folder that tools/ci/gpu-run.sh takes (DEPS_DIR),
# on a machine that has the project's Debian packages (tools/ci/deps.sh), for
# a GPU machine that lacks Kokkos, GoogleTest, CLI11 and nlohmann-json:
#   kokkos-4.6.01.tar.xz, kokkos-4.6.01-cuda13.patch   the project's shared/deps
#   googletest-src/                                     Debian's /usr/src/googletest
#   prefix/include, prefix/share/cmake                  CLI11 and nlohmann-json, headers
#                                                       and their (relocatable) CMake configs
#   sparse_utils.py                                     vLLM's, when its path is given
#                                                       (the reference stage; not in this repository)
#   bash tools/ci/gpu-deps.sh DEPS_DIR [PATH/TO/sparse_utils.py]
# Environment: SPARSE_MLA_KOKKOS_SOURCE, the Kokkos tarball (default
# ../shared/deps/kokkos-4.6.01.tar.xz beside this checkout, the patch next to it).
# DEPS_DIR must be carried to the GPU machine (a folder git ignores, e.g. .deps/gpu).
set -euo pipefail
deps=${1:?dependency folder}
utils=${2:-}
cd "$(dirname "$0")/../.."
tarball=${SPARSE_MLA_KOKKOS_SOURCE:-../shared/deps/kokkos-4.6.01.tar.xz}
patch=${tarball%.tar.xz}-cuda13.patch
missing() { echo "gpu-deps: $1 not found: $2" >&2; exit 1; }
[ -f "$tarball" ] || missing "the Kokkos source" "$tarball (set SPARSE_MLA_KOKKOS_SOURCE)"
[ -f "$patch" ] || missing "the Kokkos CUDA 13 patch" "$patch"
[ -f /usr/src/googletest/CMakeLists.txt ] || missing "GoogleTest's source" "/usr/src/googletest (Debian's googletest package)"
[ -f /usr/share/cmake/CLI11/CLI11Config.cmake ] || missing "CLI11" "/usr/share/cmake/CLI11 (libcli11-dev)"
[ -f /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake ] ||
  missing "nlohmann-json" "/usr/share/cmake/nlohmann_json (nlohmann-json3-dev)"
[ -z "$utils" ] || [ -f "$utils" ] || missing "vLLM's sparse_utils.py" "$utils"
mkdir -p "$deps/prefix/include" "$deps/prefix/share/cmake"
cp "$tarball" "$patch" "$deps/"
rm -rf "$deps/googletest-src"
cp -r /usr/src/googletest "$deps/googletest-src"
cp -r /usr/include/CLI /usr/include/nlohmann "$deps/prefix/include/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$deps/prefix/share/cmake/"
[ -z "$utils" ] || cp "$utils" "$deps/sparse_utils.py"
echo "gpu-deps: $deps ($(du -sh "$deps" | cut -f1)); carry it and run: bash tools/ci/gpu-run.sh $deps OUT_DIR"
