#!/usr/bin/env bash
# The main job (README, first command): build the host preset and check the
# build with the sparse-mla CLI.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/ci/deps.sh
cmake --preset host >/dev/null
cmake --build --preset host
cli=build/host/bin/sparse-mla
"$cli" info
