#!/usr/bin/env bash
# The whole test suite, as CI runs it (README, second command):
#   host preset with -Werror, then AddressSanitizer + UndefinedBehaviorSanitizer
#   over every test, ThreadSanitizer over the host-stream tests, then the
#   libFuzzer targets for a bounded time (FUZZ_SECONDS, default 60 per target).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/ci/deps.sh
jobs=$(nproc)

step() { echo; echo "==== $* ===="; }

step "host: build and test (-Wall -Wextra -Werror)"
cmake --workflow --preset host

step "python: the sparse_mla module's pytest suite on the host backend (also run above, as the CTest test 'python')"
ctest --test-dir build/host -R '^python$' -V 2>&1 | grep -E "^[0-9]+: .* (passed|failed)" ||
  echo "python: the module was not built (no Python headers or pybind11 found)"

step "host-asan: every test under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake --workflow --preset host-asan

step "host-tsan: host-stream tests under ThreadSanitizer"
cmake --workflow --preset host-tsan

step "ci-hip: the HIP native layer (Debian's libamdhip64 5.2, no AMD GPU: its tests skip with the runtime's reason)"
cmake --workflow --preset ci-hip

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  step "ci-cuda: the CUDA native layer against the CUDA toolkit (no GPU: its tests skip with the runtime's reason)"
  cmake --workflow --preset ci-cuda
else
  step "ci-cuda: skipped: no CUDA toolkit on this machine (nvcc not on PATH, no /usr/local/cuda)"
fi

step "gpu kernels: the hip (gfx90a) and cuda (sm_90) presets, Kokkos built with them from ../shared/deps, every kernel compiled with -Werror, tests skip without a GPU, resource report"
bash tools/ci/gpu-kernels.sh

step "fuzz: libFuzzer over the safetensors reader and the golden dispatch (${FUZZ_SECONDS:-60}s per target)"
FUZZ_SECONDS=${FUZZ_SECONDS:-60} bash tools/ci/fuzz.sh

echo; echo "==== all test stages passed (jobs: $jobs) ===="
