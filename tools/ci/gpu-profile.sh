#!/usr/bin/env bash
# Where one kernel's instructions and stalls go, on the GPU machine: builds
# the CLI of the cuda preset with -lineinfo (build/cuda-profile), runs
# `sparse-mla bench` for the cases FILTER under Nsight Compute (the full
# section set, clocks left alone, one launch of the kernels whose demangled
# name matches KERNEL, after 3 others), and writes to OUT_DIR the report,
# its details page, its source page (SASS, and CUDA source lines) and
# tools/ci/ncu-passes.py's table of instructions per pass (ROWS: the teams
# of the profiled launch, so that figures are per row). Arguments after ROWS
# go to the bench (the DCP options, for instance).
#   bash tools/ci/gpu-profile.sh OUT_DIR KERNEL FILTER [ROWS [BENCH_OPTION...]]
#   e.g. bash tools/ci/gpu-profile.sh prof HiSparseResolve '^resolve/rows=128$' 128
#        bash tools/ci/gpu-profile.sh prof-dcp 'ConvertRounds.*Dcp<' '^convert-dcp/T=1$' 1 \
#          --dcp-size 8 --dcp-rank 3 --dcp-interleave 1 --compact
# The build is the preset's (Kokkos built with the project from the dependency folder,
# as for gpu-check.sh). Environment: PRESET (cuda, or cuda-portable);
# NCU_OPTIONS, more options for ncu (`--warp-sampling-interval 0` samples the
# stalls of a short launch as often as ncu can).
set -uo pipefail
out=$(realpath -m "${1:?output folder}")
kernel=${2:?kernel name pattern}
filter=${3:?bench filter}
rows=${4:-1}
shift $(($# < 4 ? $# : 4))
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$out"
rm -f "$out/configure.log" "$out/build.log"
command -v ncu >/dev/null || export PATH=/usr/local/cuda/bin:$PATH  # Nsight Compute
build=build/${PRESET:-cuda}-profile
if ! cmake --preset "${PRESET:-cuda}" -B "$build" \
       -DSPARSE_MLA_CUDA_LINEINFO=ON -DSPARSE_MLA_BUILD_TESTS=OFF -DSPARSE_MLA_BUILD_PYTHON=OFF > "$out/configure.log" 2>&1 ||
   ! cmake --build "$build" -j "$(nproc)" --target sparse-mla > "$out/build.log" 2>&1; then
  echo "gpu-profile: the build failed (see $out)"
  tail -n 30 "$out/configure.log" "$out/build.log" 2>/dev/null
  exit 1
fi
if ! ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:$kernel" --launch-skip 3 --launch-count 1 \
       --set full --import-source yes ${NCU_OPTIONS:-} -f -o "$out/profile" \
       "$build/bin/sparse-mla" bench --backend cuda --filter "$filter" "$@" > "$out/ncu.log" 2>&1; then
  echo "gpu-profile: ncu failed (see $out/ncu.log)"
  tail -n 20 "$out/ncu.log"
  exit 1
fi
ncu -i "$out/profile.ncu-rep" --page details > "$out/details.txt" 2> "$out/export.log"
ncu -i "$out/profile.ncu-rep" --page source --csv --print-source sass > "$out/sass.csv" 2>> "$out/export.log"
ncu -i "$out/profile.ncu-rep" --page source --csv --print-source cuda > "$out/source.csv" 2>> "$out/export.log"
grep -E "^ +(Duration|Elapsed Cycles|SM Frequency|Executed Ipc Active|Warp Cycles Per Issued Instruction|Executed Instructions|Registers Per Thread|Achieved Occupancy) " \
  "$out/details.txt"
python3 tools/ci/ncu-passes.py "$out/sass.csv" --rows "$rows" --top 20 | tee "$out/passes.md"
