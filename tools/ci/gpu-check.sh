#!/usr/bin/env bash
# Builds a CUDA preset against an installed CUDA-enabled Kokkos and checks
# the build on the GPU: every test, the golden files, the synthetic
# schedules (plain and HiSparse), the tests under compute-sanitizer, the
# benchmark and the copy floors, and (with PYTHON) the Python module's
# suite on torch CUDA tensors and the captured-graph check beside the
# reference engine's conversion. Logs go to OUT_DIR.
#   bash tools/ci/gpu-check.sh KOKKOS_PREFIX OUT_DIR [bench options...]
# Environment:
#   PRESET                 cuda (default) or cuda-portable (the device primitives' portable forms)
#   STAGES                 which stages run, of: build tests sanitizers bench reference python
#                          (default: all of them; build is needed by the others once per tree)
#   BENCH_GROUPS           the bench stage's case groups (default: all of them; ceiling is
#                          always timed with each); BENCH_TIMEOUT bounds each group (150 s)
#   DEPS_PREFIX            more CMake prefixes, ';'-separated: GoogleTest, CLI11,
#                          nlohmann-json where the machine lacks them
#   WERROR                 ON by default
#   REFERENCE_SPARSE_UTILS vLLM's sparse_utils.py: time the reference engine's conversion
#                          beside ours in one Python process (reference stage) and check the
#                          Python module against it (python stage); the Kokkos must then be
#                          built with position-independent code
#   PYTHON                 the interpreter with torch and Triton (default python3) for the
#                          module, the reference and the python stage
# Used for the GPU runs recorded in docs/PERFORMANCE.md.
set -uo pipefail
kokkos=${1:?Kokkos prefix}
out=${2:?output folder}
shift 2
cd "$(dirname "$0")/../.."
mkdir -p "$out"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
status=0
preset=${PRESET:-cuda}
stages=" ${STAGES:-build tests sanitizers bench reference python} "
python=${PYTHON:-${REFERENCE_PYTHON:-python3}}
want() { [[ "$stages" == *" $1 "* ]]; }
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
build=build/$preset
cli=$build/bin/sparse-mla
if want build; then
  run configure cmake --preset "$preset" -DKokkos_ROOT="$kokkos" "-DCMAKE_PREFIX_PATH=$kokkos;${DEPS_PREFIX:-}" \
    -DSPARSE_MLA_WERROR="${WERROR:-ON}" -DSPARSE_MLA_PYTHON="$(command -v "$python" || echo "$python")"
  run build cmake --build --preset "$preset" -j "$(nproc)" -- -k 0
  grep -E "error|warning" "$out/build.log" | head -n 40
fi
run info "$cli" info
cat "$out/info.log"
if want tests; then
  # The python label is the python stage's (torch CUDA tensors), below.
  run ctest ctest --preset "$preset" -j 4 --timeout 300 --label-exclude python
  grep -E "tests passed|Failed|Skipped" "$out/ctest.log" | tail -n 15
  run golden "$cli" validate --backend cuda --golden tests/data/golden/*.safetensors
  run synthetic "$cli" validate --backend cuda --synthetic --layers 61 --index-every 4 --requests 16 --topk 256 --block-size 64 --steps 12 --json
  run synthetic-hisparse "$cli" validate --backend cuda --synthetic --hisparse --layers 8 --index-every 4 --requests 8 --topk 128 --hot-slots 256 --block-size 64 --context 4096 --steps 40 --json
  # Production rows (K = 2048, H = 4096): the resolve in LRU order.
  run synthetic-hisparse-production "$cli" validate --backend cuda --synthetic --hisparse --layers 8 --index-every 4 --requests 4 --topk 2048 --hot-slots 4096 --block-size 64 --context 16384 --steps 8 --json
fi
# compute-sanitizer, where the toolkit has it: memcheck over every CUDA
# test (API errors are not reported: some tests provoke them on purpose, an
# impossible allocation, elapsed time on events that never ran), racecheck
# and synccheck over the kernel tests. Any hazard fails the check.
if ! want sanitizers; then
  :
elif command -v compute-sanitizer >/dev/null; then
  for t in "$build"/bin/*_test; do
    # A binary without CUDA tests never touches the GPU, which the sanitizer reports as an error.
    [ "$("$t" --gtest_list_tests --gtest_filter='*/cuda' | grep -c '/cuda')" -gt 0 ] || continue
    run "memcheck-$(basename "$t")" compute-sanitizer --tool memcheck --leak-check no --report-api-errors no \
      --error-exitcode 9 "$t" --gtest_filter='*/cuda' --gtest_brief=1
  done
  for t in topk_convert_test topk_convert_dcp_test fp8_upconvert_test model1_gather_test hisparse_resolve_test hisparse_rows_test; do
    for tool in racecheck synccheck; do
      run "$tool-$t" timeout "${SANITIZER_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 9 \
        "$build/bin/$t" --gtest_filter='*/cuda' --gtest_brief=1
    done
  done
  grep -h "SUMMARY" "$out"/memcheck-*.log "$out"/racecheck-*.log "$out"/synccheck-*.log | sort | uniq -c
else
  echo "compute-sanitizer: not found, sanitizer stages skipped"
fi
# One bench process per group of cases, each bounded in time, so that one
# slow case cannot cost the others their numbers.
bench_groups=" ${BENCH_GROUPS:-ceiling floor convert upconvert group-step resolve swap-in model-step pinned-gather miss-gather} "
bench_group() { [[ "$bench_groups" == *" $1 "* ]]; }
if want bench; then
  for cases in $bench_groups; do
    run "bench-$cases" timeout "${BENCH_TIMEOUT:-150}" "$cli" bench --backend cuda --filter "^$cases/" \
      --json-file "$out/bench-$cases.json" "$@"
    sed -n '/^case/,$p' "$out/bench-$cases.log"
  done
  if bench_group model-step; then
    # The HiSparse hit-rate sweep of a whole decode step: the table, and the
    # plot where an interpreter here has matplotlib.
    plotter=python3 plot=()
    for candidate in python3 "$python"; do
      if "$candidate" -c "import matplotlib" 2>/dev/null; then plotter=$candidate plot=(--png "$out/hisparse-sweep.png"); break; fi
    done
    [ ${#plot[@]} -gt 0 ] || echo "hisparse-sweep: no interpreter with matplotlib here, table only"
    run hisparse-sweep "$plotter" tools/bench/plot_hisparse.py "$out/bench-model-step.json" "${plot[@]}"
    cat "$out/hisparse-sweep.log"
  fi
  if bench_group convert; then
    # The DCP conversion (SPEC section 2a) at the issue's split: 8 ranks,
    # interleave 1, compacted, beside the plain conversion in the same process.
    run bench-convert-dcp timeout "${BENCH_TIMEOUT:-150}" "$cli" bench --backend cuda --filter "^convert" \
      --dcp-size 8 --dcp-rank 3 --dcp-interleave 1 --compact "$@"
    sed -n '/^case/,$p' "$out/bench-convert-dcp.log"
  fi
  # Plain CUDA kernels that only move the cases' bytes (tools/bench).
  if bench_group floor && [ -x "$build/bin/sparse-mla-floors" ]; then
    run floors "$build/bin/sparse-mla-floors"
    cat "$out/floors.log"
  fi
  # The HiSparse swap-in beside SGLang's kernel for it (tools/bench/resolve_vs_sglang.cpp).
  if { bench_group resolve || bench_group swap-in; } && [ -x "$build/bin/sparse-mla-resolve-vs-sglang" ]; then
    run resolve-vs-sglang timeout "${BENCH_TIMEOUT:-150}" "$build/bin/sparse-mla-resolve-vs-sglang"
    cat "$out/resolve-vs-sglang.log"
  fi
fi
# The reference engine's Triton conversion and ours, timed in one process by
# one method (tools/bench/reference_convert.py --ours).
if want reference && [ -n "${REFERENCE_SPARSE_UTILS:-}" ]; then
  run ctypes-build cmake --build --preset "$preset" --target sparse-mla-convert-ctypes
  run reference timeout "${REFERENCE_TIMEOUT:-600}" "$python" tools/bench/reference_convert.py \
    "$REFERENCE_SPARSE_UTILS" --ours "$build/lib/libsparse-mla-convert-ctypes.so" --rounds 2
  cat "$out/reference.log"
  run reference-dcp timeout "${REFERENCE_TIMEOUT:-600}" "$python" tools/bench/reference_convert.py \
    "$REFERENCE_SPARSE_UTILS" --ours "$build/lib/libsparse-mla-convert-ctypes.so" --rounds 2 \
    --dcp-size 8 --dcp-rank 3 --dcp-interleave 1 --compact
  cat "$out/reference-dcp.log"
fi
# The Python module on torch CUDA tensors (python/tests with
# SPARSE_MLA_TEST_BACKEND=cuda), then the seed's protocol from Python in a
# torch.cuda.graph capture beside the reference's conversion.
if want python; then
  if [ ! -d "$build/python" ] || ! ls "$build"/python/sparse_mla/_native*.so >/dev/null 2>&1; then
    echo "python: the module was not built (see $out/configure.log)"
    status=1
  else
    run python-suite env SPARSE_MLA_TEST_BACKEND=cuda PYTHONPATH="$build/python" "$python" -m pytest -q -p no:cacheprovider \
      python/tests
    tail -n 3 "$out/python-suite.log"
    run python-overhead env PYTHONPATH="$build/python" "$python" tools/bench/python_call_overhead.py --backend cuda
    cat "$out/python-overhead.log"
    if [ -n "${REFERENCE_SPARSE_UTILS:-}" ]; then
      run python-graph env PYTHONPATH="$build/python" "$python" tools/bench/python_graph_check.py "$REFERENCE_SPARSE_UTILS"
      cat "$out/python-graph.log"
      run torch-ops env PYTHONPATH="$build/python" "$python" tools/bench/torch_ops_check.py "$REFERENCE_SPARSE_UTILS"
      cat "$out/torch-ops.log"
    fi
  fi
fi
exit $status
