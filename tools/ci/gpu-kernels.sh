#!/usr/bin/env bash
# Every GPU kernel compiled on a machine without a GPU (CI): the project's hip
# preset (gfx90a, Debian's hipcc) and cuda preset (sm_90, nvcc through Kokkos's
# nvcc_wrapper), each building Kokkos with the project from the release
# tarball (cmake/SparseMlaKokkos.cmake), with -Werror; their tests run (they
# must skip, with the reason, not fail), `sparse-mla info` must list every
# backend with why it is unavailable, and the kernels' resource report
# (tools/ci/gpu-resources.py) must show no spill to memory.
#   bash tools/ci/gpu-kernels.sh [hip] [cuda]      (default: both)
# Environment:
#   SPARSE_MLA_KOKKOS_SOURCE   Kokkos source tarball (default ../shared/deps/kokkos-4.6.01.tar.xz
#                              beside the checkout or beside the one it was cloned from)
#   SPARSE_MLA_CI_WORK         where the CUDA driver stub is built (default ${TMPDIR:-/tmp}/sparse-mla-ci)
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
source_tarball=$(realpath -m "${SPARSE_MLA_KOKKOS_SOURCE:-$(find_kokkos_source)}")
jobs=$(nproc)
mkdir -p "$work"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(hip cuda)

# build_preset PRESET BUILD_DIR CMAKE_ARGS...: configure and build a GPU preset
# (Kokkos included) into BUILD_DIR, from scratch as a fresh clone would.
build_preset() {
  local preset=$1 build=$2
  shift 2
  rm -rf "$build"
  mkdir -p build
  cmake --preset "$preset" -B "$build" -DSPARSE_MLA_KOKKOS_SOURCE="$source_tarball" -DSPARSE_MLA_BUILD_PYTHON=OFF "$@" \
    > "$build.configure.log" 2>&1 || { tail -n 30 "$build.configure.log"; return 1; }
  cmake --build "$build" -j "$jobs" > "$build.build.log" 2>&1 || { grep -E "error|warning" "$build.build.log" | head -n 30; return 1; }
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
  if [ ! -f "$source_tarball" ]; then
    echo "hip: skipped: no Kokkos source at $source_tarball (set SPARSE_MLA_KOKKOS_SOURCE)"
    return 0
  fi
  local build=build/ci-hip-kernels start=$SECONDS
  # gfx942 (the preset's default, MI300X) needs ROCm 5.7 or later; Debian's clang 15 knows gfx90a.
  build_preset hip "$build" -DSPARSE_MLA_HIP_ARCH=gfx90a || return 1
  echo "hip: Kokkos and every kernel compiled for gfx90a with -Werror in $((SECONDS - start)) s"
  python3 tools/ci/gpu-resources.py hip "$build" --out "$build/resources.md" || return 1
  check_skips "$build" || return 1
  "$build/bin/sparse-mla" info || return 1
}

# make_driver_stub DIR BUILD: DIR/libcuda.so.1 defining every driver function
# (cu...) that BUILD's binaries and libraries import, and those cudart looks
# up first, each returning CUDA_ERROR_STUB_LIBRARY (34).
make_driver_stub() {
  local dir=$1 build=$2 file symbols
  command -v nm >/dev/null || { echo "cuda: nm (binutils) is needed to stub the CUDA driver"; return 1; }
  mkdir -p "$dir"
  symbols=$(find "$build" -type f \( -path "$build/bin/*" -o -name "*.so*" \) | while read -r file; do
    nm -D --undefined-only "$file" 2>/dev/null || true  # not every file there is ELF
  done | awk '$2 ~ /^cu[A-Z]/ { sub(/@.*/, "", $2); print $2 }')
  # Kokkos links the driver: a build that imports none of it was not scanned.
  [ -n "$symbols" ] || { echo "cuda: no driver function imported under $build"; return 1; }
  for file in $symbols cuInit cuDriverGetVersion cuGetProcAddress cuGetProcAddress_v2; do
    echo "int $file(void) { return 34; }"
  done | sort -u > "$dir/libcuda_stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so.1" "$dir/libcuda_stub.c"
}

stage_cuda() {
  if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "cuda: skipped: no nvcc (on PATH or at /usr/local/cuda)"
    return 0
  fi
  if [ ! -f "$source_tarball" ]; then
    echo "cuda: skipped: no Kokkos source at $source_tarball (set SPARSE_MLA_KOKKOS_SOURCE)"
    return 0
  fi
  local build=build/ci-cuda-kernels start=$SECONDS
  build_preset cuda "$build" || return 1
  echo "cuda: Kokkos and every kernel compiled for sm_90 with -Werror in $((SECONDS - start)) s"
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
    make_driver_stub "$work/cuda-stub" "$build" || return 1
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
