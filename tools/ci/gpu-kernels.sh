#!/usr/bin/env bash
# Every GPU kernel compiled on a machine without a GPU (CI): Kokkos built
# for HIP (gfx90a, Debian's hipcc) and for CUDA (Hopper, through its
# nvcc_wrapper) outside the source tree, the project's hip and cuda presets
# built against them with -Werror, their tests run (they must skip, with the
# reason, not fail), `sparse-mla info` must list every backend with why it is
# unavailable, and the kernels' resource report (tools/ci/gpu-resources.py)
# must show no spill to memory.
#   bash tools/ci/gpu-kernels.sh [hip] [cuda]      (default: both)
# Environment:
#   SPARSE_MLA_KOKKOS_SOURCE   Kokkos source tarball (default ../shared/deps/kokkos-4.6.01.tar.xz
#                              beside the checkout or beside the one it was cloned from, with
#                              kokkos-4.6.01-cuda13.patch next to it)
#   SPARSE_MLA_KOKKOS_HIP, SPARSE_MLA_KOKKOS_CUDA
#                              installed Kokkos prefixes to use instead of building one
#   SPARSE_MLA_CI_WORK         where Kokkos is built (default ${TMPDIR:-/tmp}/sparse-mla-ci)
# A stage whose compiler or Kokkos source is missing says so and is skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=${SPARSE_MLA_CI_WORK:-${TMPDIR:-/tmp}/sparse-mla-ci}
# The Kokkos source: given, or ../shared/deps beside this checkout, or beside
# the checkout this one was cloned from (CI clones the project afresh).
find_kokkos_source() {
  local origin candidate
  origin=$(git -C "$root" config --get remote.origin.url 2>/dev/null || true)
  for candidate in "$root/../shared/deps" ${origin:+"$origin/../shared/deps"}; do
    if [ -f "$candidate/kokkos-4.6.01.tar.xz" ]; then
      echo "$(realpath "$candidate")/kokkos-4.6.01.tar.xz"
      return
    fi
  done
  echo "$root/../shared/deps/kokkos-4.6.01.tar.xz"
}
source_tarball=${SPARSE_MLA_KOKKOS_SOURCE:-$(find_kokkos_source)}
jobs=$(nproc)
mkdir -p "$work"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(hip cuda)

# build_kokkos NAME PREFIX CMAKE_ARGS...: Kokkos from the tarball into PREFIX, once.
build_kokkos() {
  local name=$1 prefix=$2
  shift 2
  if [ -f "$prefix/lib/cmake/Kokkos/KokkosConfig.cmake" ] || [ -f "$prefix/lib64/cmake/Kokkos/KokkosConfig.cmake" ]; then
    echo "kokkos-$name: using $prefix"
    return 0
  fi
  local start=$SECONDS src=$work/kokkos-$name-src
  rm -rf "$src" "$work/kokkos-$name-build"
  mkdir -p "$src"
  tar -xJf "$source_tarball" -C "$src" --strip-components=1
  local patch=${source_tarball%.tar.xz}-cuda13.patch
  if [ -f "$patch" ]; then (cd "$src" && patch -s -p1 < "$patch"); fi
  cmake -S "$src" -B "$work/kokkos-$name-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_CXX_STANDARD=17 "$@" > "$work/kokkos-$name.log" 2>&1
  cmake --build "$work/kokkos-$name-build" -j "$jobs" >> "$work/kokkos-$name.log" 2>&1
  cmake --install "$work/kokkos-$name-build" >> "$work/kokkos-$name.log" 2>&1
  echo "kokkos-$name: built in $((SECONDS - start)) s ($prefix)"
}

# check_skips BUILD_DIR: the GPU build's tests ran, none failed, and the
# ones that need Kokkos or the device skipped with a reason.
check_skips() {
  local build=$1 log=$1/ctest.log
  if ! ctest --test-dir "$build" -j "$jobs" --timeout 300 --label-exclude "install|python" --output-on-failure \
    > "$log" 2>&1; then
    # Every way a test can end badly (Failed, Timeout, SEGFAULT, Subprocess
    # aborted, Not Run, ...), then the output of the failed ones.
    sed -n '/tests passed/,$p' "$log" | head -n 40
    grep -B2 -A40 -E "\*\*\*(Failed|Timeout|Exception|Not Run)|Subprocess aborted|Child aborted" "$log" | head -n 150
    tail -n 30 "$log"  # what ctest said last (a test list that could not be discovered ends here)
    echo "tests of $build failed (full log: $log)"
    return 1
  fi
  local skipped
  skipped=$(grep -c "\*\*\*Skipped" "$log" || true)
  grep -E "tests passed" "$log"
  if [ "$skipped" -eq 0 ]; then
    echo "tests of $build: none skipped, yet this machine has no GPU: the build did not need its device?"
    return 1
  fi
  echo "skipped: $skipped tests; the reasons given:"
  local binary
  for binary in "$build"/bin/*_test; do
    { "$binary" --gtest_brief=1 2>/dev/null | grep -A1 "Skipped$" | grep -v -E "Skipped$|^--$" | sed 's/^/  /' | head -n 1; } || true
  done | sort | uniq -c
}

stage_hip() {
  if ! command -v hipcc >/dev/null 2>&1; then
    echo "hip: skipped: no hipcc (Debian 12: apt-get install hipcc rocm-device-libs)"
    return 0
  fi
  local kokkos=${SPARSE_MLA_KOKKOS_HIP:-$work/kokkos-hip}
  if [ -z "${SPARSE_MLA_KOKKOS_HIP:-}" ]; then
    if [ ! -f "$source_tarball" ]; then
      echo "hip: skipped: no Kokkos source at $source_tarball (set SPARSE_MLA_KOKKOS_SOURCE or SPARSE_MLA_KOKKOS_HIP)"
      return 0
    fi
    build_kokkos hip "$kokkos" -DCMAKE_CXX_COMPILER=hipcc -DKokkos_ENABLE_HIP=ON -DKokkos_ARCH_AMD_GFX90A=ON \
      -DKokkos_ENABLE_ROCTHRUST=OFF
  fi
  local build=build/ci-hip-kernels start=$SECONDS
  mkdir -p build
  # gfx942 (the preset's default, MI300X) needs ROCm 5.7 or later; Debian's clang 15 knows gfx90a.
  cmake --preset hip -B "$build" -DSPARSE_MLA_HIP_ARCH=gfx90a -DKokkos_ROOT="$kokkos" -DSPARSE_MLA_BUILD_PYTHON=OFF \
    > "$build.configure.log" 2>&1 || { tail -n 30 "$build.configure.log"; return 1; }
  cmake --build "$build" -j "$jobs" > "$build.build.log" 2>&1 || { grep -E "error|warning" "$build.build.log" | head -n 30; return 1; }
  echo "hip: every kernel compiled for gfx90a with -Werror in $((SECONDS - start)) s"
  python3 tools/ci/gpu-resources.py hip "$build" --out "$build/resources.md" || return 1
  check_skips "$build" || return 1
  "$build/bin/sparse-mla" info || return 1
}

# make_driver_stub DIR BUILD KOKKOS: DIR/libcuda.so.1 defining every driver
# function (cu...) that BUILD's binaries and libraries and KOKKOS's shared
# libraries import, and those cudart looks up first, each returning
# CUDA_ERROR_STUB_LIBRARY (34).
make_driver_stub() {
  local dir=$1 build=$2 kokkos=$3 file symbols
  command -v nm >/dev/null || { echo "cuda: nm (binutils) is needed to stub the CUDA driver"; return 1; }
  mkdir -p "$dir"
  symbols=$(find "$build" "$kokkos" -type f \( -path "$build/bin/*" -o -name "*.so*" \) | while read -r file; do
    nm -D --undefined-only "$file" 2>/dev/null || true  # not every file there is ELF
  done | awk '$2 ~ /^cu[A-Z]/ { sub(/@.*/, "", $2); print $2 }')
  # Kokkos links the driver: a build that imports none of it was not scanned.
  [ -n "$symbols" ] || { echo "cuda: no driver function imported under $build and $kokkos"; return 1; }
  for file in $symbols cuInit cuDriverGetVersion cuGetProcAddress cuGetProcAddress_v2; do
    echo "int $file(void) { return 34; }"
  done | sort -u > "$dir/libcuda_stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so.1" "$dir/libcuda_stub.c"
}

stage_cuda() {
  local nvcc
  nvcc=$(command -v nvcc || true)
  [ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || { export PATH=/usr/local/cuda/bin:$PATH; nvcc=/usr/local/cuda/bin/nvcc; }
  if [ -z "$nvcc" ]; then
    echo "cuda: skipped: no nvcc (on PATH or at /usr/local/cuda)"
    return 0
  fi
  local kokkos=${SPARSE_MLA_KOKKOS_CUDA:-$work/kokkos-cuda}
  if [ -z "${SPARSE_MLA_KOKKOS_CUDA:-}" ]; then
    if [ ! -f "$source_tarball" ]; then
      echo "cuda: skipped: no Kokkos source at $source_tarball (set SPARSE_MLA_KOKKOS_SOURCE or SPARSE_MLA_KOKKOS_CUDA)"
      return 0
    fi
    # nvcc_wrapper from the source being built (the patch makes sm_90 its default).
    build_kokkos cuda "$kokkos" -DCMAKE_CXX_COMPILER="$work/kokkos-cuda-src/bin/nvcc_wrapper" -DKokkos_ENABLE_CUDA=ON \
      -DKokkos_ARCH_HOPPER90=ON
  fi
  local build=build/ci-cuda-kernels start=$SECONDS
  mkdir -p build
  cmake --preset cuda -B "$build" -DKokkos_ROOT="$kokkos" -DSPARSE_MLA_BUILD_PYTHON=OFF \
    > "$build.configure.log" 2>&1 || { tail -n 30 "$build.configure.log"; return 1; }
  cmake --build "$build" -j "$jobs" > "$build.build.log" 2>&1 || { grep -E "error|warning" "$build.build.log" | head -n 30; return 1; }
  echo "cuda: every kernel compiled for sm_90 with -Werror in $((SECONDS - start)) s"
  python3 tools/ci/gpu-resources.py cuda "$build" --out "$build/resources.md" || return 1
  # Kokkos links the driver (libcuda.so.1), which a machine without a GPU
  # lacks, and a toolkit's own stub of it is not always installed: a stub
  # built here, whose every call answers CUDA_ERROR_STUB_LIBRARY, lets the
  # binaries load and cudart report "CUDA driver is a stub library".
  # (grep reads all of ldconfig's output: with -q it could stop early and
  # ldconfig's SIGPIPE would fail the pipeline.)
  if ldconfig -p 2>/dev/null | grep "libcuda.so.1 " >/dev/null; then
    echo "cuda: this machine has a CUDA driver; the tests below may run instead of skipping"
  else
    make_driver_stub "$work/cuda-stub" "$build" "$kokkos" || return 1
    export LD_LIBRARY_PATH=$work/cuda-stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  check_skips "$build" || return 1
  "$build/bin/sparse-mla" info || return 1
}

status=0
for stage in "${stages[@]}"; do
  echo "---- gpu kernels: $stage ----"
  "stage_$stage" || status=1
done
exit $status
