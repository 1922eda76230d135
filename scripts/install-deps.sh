#!/bin/bash
# Installs the Debian packages moejit builds and tests with, when missing.
# As root it runs apt-get; otherwise it prints the exact command to run.
#   scripts/install-deps.sh         build and test (gcc; `make asan` needs nothing more)
#   scripts/install-deps.sh fuzz    also clang and libFuzzer (`make fuzz`)
# The CUDA toolkit (nvcc, NVRTC, cuda.h) is not a Debian package here: it
# must be installed already (/usr/local/cuda or $CUDA_HOME).
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
pkgs=(cmake make gcc pkg-config ninja-build libyaml-dev libxxhash-dev libcriterion-dev)
for group in "$@"; do
  case $group in
    fuzz) pkgs+=(clang libclang-rt-dev) ;; # libclang-rt-dev: libclang_rt.fuzzer, ASan, UBSan
    *) echo "install-deps: unknown group '$group' (known: fuzz)" >&2; exit 2 ;;
  esac
done
for pkg in "${pkgs[@]}"; do
  have_pkg "$pkg" || need+=("$pkg")
done

if ((${#need[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "install-deps: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "install-deps: missing Debian packages: ${need[*]}" >&2
    echo "install-deps: run: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
fi

# CMake >= 3.24
ver=$(cmake --version | awk 'NR==1{print $3}')
if [[ "$(printf '%s\n3.24\n' "$ver" | sort -V | head -1)" != "3.24" ]]; then
  echo "install-deps: CMake $ver is too old; moejit needs 3.24 or newer" >&2
  exit 1
fi

cuda=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
if [[ ! -f "$cuda/include/nvrtc.h" ]]; then
  echo "install-deps: the CUDA toolkit was not found at $cuda (need nvrtc.h, libnvrtc);" >&2
  echo "install-deps: install it from NVIDIA and set CUDA_HOME to its folder" >&2
  exit 1
fi
