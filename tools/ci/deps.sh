#!/usr/bin/env bash
# Installs what sparse-mla needs from Debian 12's packages (as root), only
# what is missing. Kokkos is Debian's libtrilinos-kokkos-dev (3.4, Serial);
# GPU builds bring their own Kokkos (docs/GPU.md). python3-torch (1.13, CPU)
# is what the Python suite's torch tests run with in CI.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config ccache
  libtrilinos-kokkos-dev libcli11-dev libgtest-dev nlohmann-json3-dev libbenchmark-dev
  libamdhip64-dev hipcc rocm-device-libs clang libclang-rt-14-dev
  python3-dev pybind11-dev python3-numpy python3-pytest python3-matplotlib python3-torch)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "deps: ok"
