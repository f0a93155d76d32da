#!/usr/bin/env bash
# `sparse-mla bench` of another source tree (an earlier commit: `git archive
# REV | tar -x -C DIR`) beside this tree's, in one session on one GPU, each
# group of cases run by the base and then by this tree, so that a change's
# effect on every figure is measured in the same call. Prints each case's
# median and the ratio (this / base); also writes OUT_DIR/compare.json.
#   bash tools/ci/gpu-compare.sh BASE_SRC OUT_DIR [bench options...]
# This tree's build is build/cuda when it has the CLI (else the cuda preset's
# CLI in build/compare). Both trees compile against one Kokkos: Kokkos_ROOT
# where set, else the one this tree's build made, installed into
# build/compare-kokkos; the base builds only its CLI, in build/base, finding
# CLI11 and nlohmann-json installed or in the dependency folder (.deps or
# SPARSE_MLA_DEPS_DIR). CASE_GROUPS: the case groups (default every group of
# gpu-check.sh).
set -uo pipefail
base=$(realpath "${1:?base source tree}")
out=$(realpath -m "${2:?output folder}")
shift 2
cd "$(dirname "$0")/../.."
mkdir -p "$out"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH  # a base tree may need nvcc on PATH
this=build/cuda
if [ ! -x build/cuda/bin/sparse-mla ]; then
  this=build/compare
  { cmake --preset cuda -B "$this" -DSPARSE_MLA_BUILD_TESTS=OFF -DSPARSE_MLA_BUILD_PYTHON=OFF &&
    cmake --build "$this" -j "$(nproc)" --target sparse-mla; } > "$out/build-this.log" 2>&1 ||
    { tail -n 30 "$out/build-this.log"; exit 1; }
fi
kokkos=${Kokkos_ROOT:-}
if [ -z "$kokkos" ]; then
  kokkos=$PWD/build/compare-kokkos
  [ -d "$this/_deps/kokkos-build" ] || { echo "gpu-compare: $this used an installed Kokkos: set Kokkos_ROOT to it"; exit 1; }
  cmake --install "$this/_deps/kokkos-build" --prefix "$kokkos" > "$out/kokkos-install.log" 2>&1 ||
    { tail -n 30 "$out/kokkos-install.log"; exit 1; }
fi
deps=$(realpath -m "${SPARSE_MLA_DEPS_DIR:-.deps}")
# The cuda preset's settings, spelled out: a base tree may predate any of the presets.
cmake -S "$base" -B build/base -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARSE_MLA_ENABLE_CUDA=ON \
  -DSPARSE_MLA_CUDA_ARCH=sm_90 -DSPARSE_MLA_REQUIRE_GPU_KERNELS=ON -DSPARSE_MLA_BUILD_TESTS=OFF -DSPARSE_MLA_BUILD_PYTHON=OFF \
  -DSPARSE_MLA_CCACHE=OFF -DKokkos_ROOT="$kokkos" "-DCMAKE_PREFIX_PATH=$kokkos;$deps" -DSPARSE_MLA_DEPS_DIR="$deps" > "$out/build-base.log" 2>&1 &&
  cmake --build build/base -j "$(nproc)" --target sparse-mla >> "$out/build-base.log" 2>&1 ||
  { tail -n 30 "$out/build-base.log"; exit 1; }
for group in ${CASE_GROUPS:-convert upconvert group-step resolve swap-in pinned-gather miss-gather}; do
  for tree in base compare; do
    cli=build/base/bin/sparse-mla
    [ "$tree" = base ] || cli=$this/bin/sparse-mla
    timeout "${BENCH_TIMEOUT:-150}" "$cli" bench --backend cuda --json --filter "^$group/" "$@" \
      > "$out/$tree-$group.json" 2> "$out/$tree-$group.err" || echo "$tree $group: bench failed (see $out/$tree-$group.err)"
  done
done
python3 - "$out" ${CASE_GROUPS:-convert upconvert group-step resolve swap-in pinned-gather miss-gather} <<'PY'
import json, sys, pathlib
out, groups = pathlib.Path(sys.argv[1]), sys.argv[2:]
rows = []
print(f"{'case':<28} {'base us':>10} {'this us':>10} {'this/base':>10}  base ceiling GB/s  this ceiling GB/s")
for group in groups:
    runs = {}
    for tree in ("base", "compare"):
        try:
            runs[tree] = json.loads((out / f"{tree}-{group}.json").read_text())
        except (OSError, ValueError):
            runs[tree] = None
    if not runs["base"] or not runs["compare"]:
        print(f"{group}: missing results")
        continue
    base = {c["name"]: c for c in runs["base"]["cases"] if not c["is_ceiling"]}
    for case in runs["compare"]["cases"]:
        if case["is_ceiling"] or case["name"] not in base:
            continue
        b, t = base[case["name"]]["median_us"], case["median_us"]
        rows.append({"case": case["name"], "base_us": b, "this_us": t, "ratio": t / b,
                     "base_ceiling": runs["base"]["ceilings_gbps"]["device_copy"],
                     "this_ceiling": runs["compare"]["ceilings_gbps"]["device_copy"]})
        r = rows[-1]
        print(f"{r['case']:<28} {b:10.2f} {t:10.2f} {r['ratio']:10.3f}  {r['base_ceiling']:17.1f}  {r['this_ceiling']:17.1f}")
(out / "compare.json").write_text(json.dumps(rows, indent=1))
PY
