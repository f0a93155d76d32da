#!/usr/bin/env bash
# The whole test suite, as CI runs it (README, second command):
#   host preset with -Werror, then AddressSanitizer + UndefinedBehaviorSanitizer
#   over every test, ThreadSanitizer over the host-stream tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/ci/deps.sh
jobs=$(nproc)

step() { echo; echo "==== $* ===="; }

step "host: build and test (-Wall -Wextra -Werror)"
cmake --workflow --preset host

step "host-asan: every test under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake --workflow --preset host-asan

step "host-tsan: host-stream tests under ThreadSanitizer"
cmake --workflow --preset host-tsan

echo; echo "==== all test stages passed (jobs: $jobs) ===="
