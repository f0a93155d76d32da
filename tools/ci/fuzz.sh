#!/usr/bin/env bash
# Builds the libFuzzer targets (preset "fuzz": clang, ASan + UBSan) and runs
# each for a bounded time over a seed corpus: the golden files, the
# malformed corpus of tests/data/malformed and the small seeds of
# tools/fuzz/seeds. A crash, a sanitizer report, a
# leak or a timeout fails the script and leaves the input under
# build/fuzz/artifacts/.
#   FUZZ_SECONDS=<n>   seconds per target (default 90)
#   GOLDEN_DIR=<dir>   golden files (default tests/data/golden)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${FUZZ_SECONDS:-90}
golden=${GOLDEN_DIR:-tests/data/golden}

bash tools/ci/deps.sh
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz

work=build/fuzz/run
rm -rf "$work"
mkdir -p "$work/seeds" build/fuzz/artifacts
cp tests/data/malformed/*.safetensors tools/fuzz/seeds/*.safetensors "$work/seeds/"
if [ -d "$golden" ]; then
  cp "$golden"/*.safetensors "$work/seeds/"
else
  echo "fuzz: no golden files at $golden; seeding with the malformed corpus only"
fi

status=0
for target in build/fuzz/bin/fuzz_*; do
  name=$(basename "$target")
  echo; echo "==== $name: ${seconds}s ===="
  mkdir -p "$work/$name"  # the corpus the fuzzer grows; seeds stay read-only
  # max_len 128 KiB keeps the small golden files whole (c1, c3, c5, u4) and
  # truncates the large ones, which is a case worth fuzzing too.
  set +e
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$target" "$work/$name" "$work/seeds" \
    -max_total_time="$seconds" -max_len=131072 -timeout=10 -rss_limit_mb=2048 \
    -dict=tools/fuzz/safetensors.dict -artifact_prefix=build/fuzz/artifacts/"$name"- \
    -print_final_stats=1 >"$work/$name.log" 2>&1
  rc=$?
  set -e
  grep -E "^(INFO: seed corpus|Done [0-9]+ runs|stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb))" "$work/$name.log" || true
  if [ "$rc" != 0 ] || grep -qE "^==[0-9]+==ERROR|^SUMMARY: |runtime error:" "$work/$name.log"; then
    tail -40 "$work/$name.log"
    echo "fuzz: $name found a problem (exit $rc); log: $work/$name.log, input: build/fuzz/artifacts/"
    status=1
  else
    echo "fuzz: $name ran ${seconds}s without a finding"
  fi
done
exit $status
