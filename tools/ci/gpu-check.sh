#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU, the CUDA toolkit, CMake,
# Ninja and a python3 with torch, pybind11 and pytest, and nothing else
# prepared: Kokkos, GoogleTest, CLI11 and nlohmann-json come from the
# dependency folder (.deps in the tree or SPARSE_MLA_DEPS_DIR;
# tools/ci/gpu-deps.sh assembles it), or an installed Kokkos from Kokkos_ROOT.
# Each stage logs to OUT_DIR/<step>.log and prints its wall time:
#   workflow    `cmake --workflow --preset cuda`: configure (Kokkos built with the
#               project), build with -Werror, every test
#   tests       the golden files and the synthetic schedules (plain and HiSparse) on the GPU
#   sanitizers  the CUDA tests under compute-sanitizer
#   bench       the benchmark and the copy floors
#   reference   the reference engine's conversion beside ours (REFERENCE_SPARSE_UTILS)
#   python      `SPARSE_MLA_BACKEND=cuda pip install --no-build-isolation` into OUT_DIR/site,
#               then the module's suite on torch CUDA tensors and the captured-graph check
#   bash tools/ci/gpu-check.sh OUT_DIR [bench options...]
# Environment:
#   PRESET                 cuda (default) or cuda-portable (the device primitives' portable forms)
#   STAGES                 which stages run, of: workflow tests sanitizers bench reference python
#                          (default: all of them; workflow is needed by the next four once per tree)
#   BENCH_GROUPS           the bench stage's case groups (default: all of them; ceiling is
#                          always timed with each); BENCH_TIMEOUT bounds each group (150 s)
#   REFERENCE_SPARSE_UTILS vLLM's sparse_utils.py (default: the dependency folder's, where it has
#                          one): time the reference engine's conversion beside ours in one Python
#                          process (reference stage) and check the Python module against it
#                          (python stage)
#   PYTHON                 the interpreter with torch and Triton (default python3) for the
#                          module, the reference and the python stage
# Used for the GPU runs recorded in docs/PERFORMANCE.md.
set -uo pipefail
out=$(realpath -m "${1:?output folder}")
shift
cd "$(dirname "$0")/../.."
mkdir -p "$out"
status=0
preset=${PRESET:-cuda}
stages=" ${STAGES:-workflow tests sanitizers bench reference python} "
python=${PYTHON:-${REFERENCE_PYTHON:-python3}}
deps=${SPARSE_MLA_DEPS_DIR:-.deps}
if [ -z "${REFERENCE_SPARSE_UTILS:-}" ] && [ -f "$deps/sparse_utils.py" ]; then
  REFERENCE_SPARSE_UTILS=$(realpath "$deps/sparse_utils.py")
fi
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
if want workflow; then
  run workflow cmake --workflow --preset "$preset"
  # Where Kokkos and the rest came from, any diagnostic, and ctest's summary.
  grep -E "^-- sparse-mla: |error:|warning:" "$out/workflow.log" | head -n 40
  sed -n '/tests passed/,$p' "$out/workflow.log" | head -n 40
fi
run info "$cli" info
cat "$out/info.log"
if want tests; then
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
elif sanitizer=$(command -v compute-sanitizer || command -v /usr/local/cuda/bin/compute-sanitizer); then
  for t in "$build"/bin/*_test; do
    # A binary without CUDA tests never touches the GPU, which the sanitizer reports as an error.
    [ "$("$t" --gtest_list_tests --gtest_filter='*/cuda' | grep -c '/cuda')" -gt 0 ] || continue
    run "memcheck-$(basename "$t")" "$sanitizer" --tool memcheck --leak-check no --report-api-errors no \
      --error-exitcode 9 "$t" --gtest_filter='*/cuda' --gtest_brief=1
  done
  for t in topk_convert_test topk_convert_dcp_test fp8_upconvert_test model1_gather_test hisparse_resolve_test hisparse_rows_test; do
    for tool in racecheck synccheck; do
      run "$tool-$t" timeout "${SANITIZER_TIMEOUT:-300}" "$sanitizer" --tool $tool --error-exitcode 9 \
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
# The Python module as a torch user installs it (pip, the preset's build
# through setup.py, into OUT_DIR/site), its suite on torch CUDA tensors
# (python/tests with SPARSE_MLA_TEST_BACKEND=cuda), then the seed's protocol
# from Python in a torch.cuda.graph capture beside the reference's conversion.
if want python; then
  rm -rf "$out/site"
  cmake_args=""
  [ "$preset" != cuda-portable ] || cmake_args="-DSPARSE_MLA_PORTABLE_PRIMITIVES=ON"
  run pip-install env SPARSE_MLA_BACKEND=cuda SPARSE_MLA_CMAKE_ARGS="$cmake_args" \
    "$python" -m pip install --no-build-isolation --no-deps --target "$out/site" .
  tail -n 2 "$out/pip-install.log"
  run python-suite env SPARSE_MLA_TEST_BACKEND=cuda PYTHONPATH="$out/site" "$python" -c \
    'import sys, pytest, sparse_mla; print("module:", sparse_mla.__file__); sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "python/tests"]))'
  grep -E "^module:" "$out/python-suite.log"
  tail -n 3 "$out/python-suite.log"
  run python-overhead env PYTHONPATH="$out/site" "$python" tools/bench/python_call_overhead.py --backend cuda
  cat "$out/python-overhead.log"
  if [ -n "${REFERENCE_SPARSE_UTILS:-}" ]; then
    run python-graph env PYTHONPATH="$out/site" "$python" tools/bench/python_graph_check.py "$REFERENCE_SPARSE_UTILS"
    cat "$out/python-graph.log"
    run torch-ops env PYTHONPATH="$out/site" "$python" tools/bench/torch_ops_check.py "$REFERENCE_SPARSE_UTILS"
    cat "$out/torch-ops.log"
  fi
fi
exit $status
