#!/usr/bin/env bash
# The main job (README, first command): build the host preset and check the
# build with the sparse-mla CLI: what it runs on, the bundled golden files, a
# DeepSeek-V3.2-shaped synthetic schedule (61 layers, an indexer every 4,
# top-k 256), its dump read back as golden files, then a quick benchmark.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/ci/deps.sh
cmake --preset host >/dev/null
cmake --build --preset host
cli=build/host/bin/sparse-mla
step() { echo; echo "==== sparse-mla $* ===="; }

step info
"$cli" info
step "validate --golden tests/data/golden/*.safetensors --synthetic"
"$cli" validate --golden tests/data/golden/*.safetensors \
  --synthetic --layers 61 --index-every 4 --requests 16 --topk 256 --block-size 64 --steps 12
dump=build/host/synthetic-dump
rm -rf "$dump"
step "validate --synthetic --dump $dump, then --golden on the dump"
"$cli" validate --synthetic --layers 8 --index-every 4 --requests 4 --topk 256 --steps 2 --dump "$dump"
"$cli" validate --golden "$dump"/*.safetensors
step bench --quick
"$cli" bench --quick
