#!/usr/bin/env bash
# A GPU check on a bare machine: builds what the machine lacks from a
# dependency folder, then runs tools/ci/gpu-check.sh.
#   bash tools/ci/gpu-run.sh DEPS_DIR OUT_DIR [bench options...]
# DEPS_DIR holds: kokkos-4.6.01.tar.xz and kokkos-4.6.01-cuda13.patch (the
# project's shared/deps), googletest-src/ (Debian's /usr/src/googletest),
# prefix/ (CLI11 and nlohmann-json headers with their CMake configs) and,
# optionally, sparse_utils.py (vLLM's, for the reference timing, run with
# REFERENCE_PYTHON or the python3 that has torch). Kokkos (CUDA, Hopper,
# position-independent) and GoogleTest are built under .kokkos/ once.
# tools/ci/gpu-deps.sh assembles DEPS_DIR.
# SETUP_ONLY=1: build them, write OUT_DIR/env.sh (KOKKOS_PREFIX, DEPS_PREFIX,
# REFERENCE_SPARSE_UTILS) for other scripts (gpu-compare.sh), and stop.
set -euo pipefail
deps=$(realpath "${1:?dependency folder}")
out=$(realpath -m "${2:?output folder}")
shift 2
cd "$(dirname "$0")/../.."
mkdir -p "$out" .kokkos
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
jobs=$(nproc)
kokkos=$PWD/.kokkos/install
if [ ! -f "$kokkos/lib/cmake/Kokkos/KokkosConfig.cmake" ] && [ ! -f "$kokkos/lib64/cmake/Kokkos/KokkosConfig.cmake" ]; then
  start=$SECONDS
  rm -rf .kokkos/src .kokkos/build
  mkdir -p .kokkos/src
  tar -xJf "$deps/kokkos-4.6.01.tar.xz" -C .kokkos/src --strip-components=1
  (cd .kokkos/src && patch -p1 < "$deps/kokkos-4.6.01-cuda13.patch")
  cmake -S .kokkos/src -B .kokkos/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$kokkos" \
    -DCMAKE_CXX_COMPILER="$PWD/.kokkos/src/bin/nvcc_wrapper" -DKokkos_ENABLE_CUDA=ON -DKokkos_ARCH_HOPPER90=ON \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_CXX_STANDARD=17 > "$out/kokkos-build.log" 2>&1
  cmake --build .kokkos/build -j "$jobs" >> "$out/kokkos-build.log" 2>&1
  cmake --install .kokkos/build >> "$out/kokkos-build.log" 2>&1
  echo "kokkos: built in $((SECONDS - start)) s"
fi
gtest=$PWD/.kokkos/gtest
if [ ! -d "$gtest/lib/cmake/GTest" ] && [ ! -d "$gtest/lib64/cmake/GTest" ]; then
  cmake -S "$deps/googletest-src" -B .kokkos/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$gtest" -DCMAKE_POSITION_INDEPENDENT_CODE=ON > "$out/gtest-build.log" 2>&1
  cmake --build .kokkos/gtest-build -j "$jobs" >> "$out/gtest-build.log" 2>&1
  cmake --install .kokkos/gtest-build >> "$out/gtest-build.log" 2>&1
fi
export DEPS_PREFIX="$gtest;$deps/prefix"
if [ -f "$deps/sparse_utils.py" ] && [ -z "${REFERENCE_SPARSE_UTILS:-}" ]; then
  export REFERENCE_SPARSE_UTILS="$deps/sparse_utils.py"
fi
if [ -n "${SETUP_ONLY:-}" ]; then
  printf 'export KOKKOS_PREFIX=%q DEPS_PREFIX=%q REFERENCE_SPARSE_UTILS=%q\n' "$kokkos" "$DEPS_PREFIX" \
    "${REFERENCE_SPARSE_UTILS:-}" > "$out/env.sh"
  exit 0
fi
exec bash tools/ci/gpu-check.sh "$kokkos" "$out" "$@"
