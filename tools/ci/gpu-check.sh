#!/usr/bin/env bash
# Builds the `cuda` preset against an installed CUDA-enabled Kokkos and
# checks the build on the GPU: every test, the golden files, the synthetic
# schedules (plain and HiSparse), the tests under compute-sanitizer, then the
# benchmark and the copy floors. Logs go to OUT_DIR.
#   bash tools/ci/gpu-check.sh KOKKOS_PREFIX OUT_DIR [bench options...]
# Environment: DEPS_PREFIX (more CMake prefixes, ';'-separated: GoogleTest,
# CLI11, nlohmann-json where the machine lacks them), WERROR (ON by default),
# REFERENCE_SPARSE_UTILS (vLLM's sparse_utils.py: also time the reference
# engine's conversion beside ours in one Python process, with
# REFERENCE_PYTHON, python3 by default, which needs torch and Triton; the
# Kokkos must then be built with position-independent code).
# Used for the H200 runs recorded in docs/PERFORMANCE.md.
set -uo pipefail
kokkos=${1:?Kokkos prefix}
out=${2:?output folder}
shift 2
cd "$(dirname "$0")/../.."
mkdir -p "$out"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
status=0
stage() { echo "== $1"; }
run() {  # run NAME CMD...: log to OUT_DIR/NAME.log, remember failures
  local name=$1; shift
  local start=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - start)) s)"
  [ $rc -eq 0 ] || { status=1; tail -n 25 "$out/$name.log"; }
  return 0
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
run configure cmake --preset cuda -DKokkos_ROOT="$kokkos" "-DCMAKE_PREFIX_PATH=$kokkos;${DEPS_PREFIX:-}" \
  -DSPARSE_MLA_WERROR="${WERROR:-ON}"
run build cmake --build --preset cuda -j "$(nproc)" -- -k 0
grep -E "error|warning" "$out/build.log" | head -n 40
cli=build/cuda/bin/sparse-mla
run info "$cli" info
run ctest ctest --preset cuda -j 4 --timeout 300
grep -E "tests passed|Failed|Skipped" "$out/ctest.log" | tail -n 15
run golden "$cli" validate --backend cuda --golden tests/data/golden/*.safetensors
run synthetic "$cli" validate --backend cuda --synthetic --layers 61 --index-every 4 --requests 16 --topk 256 --block-size 64 --steps 12 --json
run synthetic-hisparse "$cli" validate --backend cuda --synthetic --hisparse --layers 8 --index-every 4 --requests 8 --topk 128 --hot-slots 256 --block-size 64 --context 4096 --steps 40 --json
# compute-sanitizer, where the toolkit has it: memcheck over every CUDA
# test (API errors are not reported: some tests provoke them on purpose, an
# impossible allocation, elapsed time on events that never ran), racecheck
# and synccheck over the kernel tests. Any hazard fails the check.
if command -v compute-sanitizer >/dev/null; then
  for t in build/cuda/bin/*_test; do
    # A binary without CUDA tests never touches the GPU, which the sanitizer reports as an error.
    [ "$("$t" --gtest_list_tests --gtest_filter='*/cuda' | grep -c '/cuda')" -gt 0 ] || continue
    run "memcheck-$(basename "$t")" compute-sanitizer --tool memcheck --leak-check no --report-api-errors no \
      --error-exitcode 9 "$t" --gtest_filter='*/cuda' --gtest_brief=1
  done
  for t in topk_convert_test topk_convert_dcp_test fp8_upconvert_test hisparse_resolve_test hisparse_rows_test; do
    for tool in racecheck synccheck; do
      run "$tool-$t" timeout "${SANITIZER_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 9 \
        "build/cuda/bin/$t" --gtest_filter='*/cuda' --gtest_brief=1
    done
  done
  grep -h "SUMMARY" "$out"/memcheck-*.log "$out"/racecheck-*.log "$out"/synccheck-*.log | sort | uniq -c
else
  echo "compute-sanitizer: not found, sanitizer stages skipped"
fi
# One bench process per group of cases, each bounded in time, so that one
# slow case cannot cost the others their numbers.
for cases in ceiling floor convert upconvert group-step resolve swap-in pinned-gather miss-gather; do
  run "bench-$cases" timeout "${BENCH_TIMEOUT:-150}" "$cli" bench --backend cuda --filter "^$cases/" "$@"
  sed -n '/^case/,$p' "$out/bench-$cases.log"
done
# The DCP conversion (SPEC section 2a) at the issue's split: 8 ranks,
# interleave 1, compacted, beside the plain conversion in the same process.
run bench-convert-dcp timeout "${BENCH_TIMEOUT:-150}" "$cli" bench --backend cuda --filter "^convert" \
  --dcp-size 8 --dcp-rank 3 --dcp-interleave 1 --compact "$@"
sed -n '/^case/,$p' "$out/bench-convert-dcp.log"
# Plain CUDA kernels that only move the cases' bytes (tools/bench).
if [ -x build/cuda/bin/sparse-mla-floors ]; then
  run floors build/cuda/bin/sparse-mla-floors
  cat "$out/floors.log"
fi
# The reference engine's Triton conversion and ours, timed in one process by
# one method (tools/bench/reference_convert.py --ours).
if [ -n "${REFERENCE_SPARSE_UTILS:-}" ]; then
  run ctypes-build cmake --build --preset cuda --target sparse-mla-convert-ctypes
  run reference timeout "${REFERENCE_TIMEOUT:-600}" "${REFERENCE_PYTHON:-python3}" tools/bench/reference_convert.py \
    "$REFERENCE_SPARSE_UTILS" --ours build/cuda/lib/libsparse-mla-convert-ctypes.so --rounds 2
  cat "$out/reference.log"
  run reference-dcp timeout "${REFERENCE_TIMEOUT:-600}" "${REFERENCE_PYTHON:-python3}" tools/bench/reference_convert.py \
    "$REFERENCE_SPARSE_UTILS" --ours build/cuda/lib/libsparse-mla-convert-ctypes.so --rounds 2 \
    --dcp-size 8 --dcp-rank 3 --dcp-interleave 1 --compact
  cat "$out/reference-dcp.log"
fi
exit $status
