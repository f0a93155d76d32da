#!/usr/bin/env bash
# Assembles the dependency folder (SPARSE_MLA_DEPS_DIR; default .deps in the
# source tree, which the build finds by itself and git ignores) for a machine
# without network that lacks Kokkos, GoogleTest, CLI11 or nlohmann-json (a
# bare GPU machine), from this machine's Debian packages (tools/ci/deps.sh):
#   kokkos-4.6.01.tar.xz                Kokkos's release source (../shared/deps)
#   googletest/                         GoogleTest's source (Debian's /usr/src/googletest)
#   include/CLI/, include/nlohmann/     CLI11's and nlohmann-json's headers
#   share/cmake/CLI11/, share/cmake/nlohmann_json/
#                                       their (relocatable) CMake package files
#   sparse_utils.py                     vLLM's, when its path is given (gpu-check.sh's
#                                       reference stage; not in this repository)
#   bash tools/ci/gpu-deps.sh [DEPS_DIR [PATH/TO/sparse_utils.py]]
# Environment: SPARSE_MLA_KOKKOS_SOURCE, the Kokkos tarball (default
# ../shared/deps/kokkos-4.6.01.tar.xz beside this checkout).
# Checks every source first and writes nothing when one is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
deps=${1:-.deps}
utils=${2:-}
tarball=${SPARSE_MLA_KOKKOS_SOURCE:-../shared/deps/kokkos-4.6.01.tar.xz}
missing() { echo "gpu-deps: $1 not found: $2" >&2; exit 1; }
[ -f "$tarball" ] || missing "the Kokkos source" "$tarball (set SPARSE_MLA_KOKKOS_SOURCE)"
[ -f /usr/src/googletest/CMakeLists.txt ] || missing "GoogleTest's source" "/usr/src/googletest (Debian's googletest package)"
[ -f /usr/share/cmake/CLI11/CLI11Config.cmake ] || missing "CLI11" "/usr/share/cmake/CLI11 (libcli11-dev)"
[ -f /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake ] ||
  missing "nlohmann-json" "/usr/share/cmake/nlohmann_json (nlohmann-json3-dev)"
[ -z "$utils" ] || [ -f "$utils" ] || missing "vLLM's sparse_utils.py" "$utils"
mkdir -p "$deps/include" "$deps/share/cmake"
cp "$tarball" "$deps/kokkos-4.6.01.tar.xz"
rm -rf "$deps/googletest" "$deps/include/CLI" "$deps/include/nlohmann" "$deps/share/cmake/CLI11" \
  "$deps/share/cmake/nlohmann_json"
cp -r /usr/src/googletest "$deps/googletest"
cp -r /usr/include/CLI /usr/include/nlohmann "$deps/include/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$deps/share/cmake/"
[ -z "$utils" ] || cp "$utils" "$deps/sparse_utils.py"
echo "gpu-deps: $deps ($(du -sh "$deps" | cut -f1)); the presets find it as .deps in the tree, or name it with SPARSE_MLA_DEPS_DIR"
