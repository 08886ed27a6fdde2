#!/usr/bin/env bash
# Installs exactly the Debian packages this repository's build and tests need. Idempotent: packages
# already present are left alone, and a second run changes nothing.
#
# CUDA (runtime, cuBLAS, NCCL) is not installed here: it comes from the CUDA toolkit at
# ${CUDA_PATH:-/usr/local/cuda} and is only needed for `--config=cuda`.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap      # Bazel 4.2.3 (WORKSPACE era); the build is fully offline
  libabsl-dev          # @com_google_absl
  libgoogle-glog-dev   # @com_github_google_glog (brings libgflags-dev)
  libgtest-dev         # @com_google_googletest (gtest)
  libgmock-dev         # @com_google_googletest (gmock)
  libbenchmark-dev     # @com_github_google_benchmark
  libhwy-dev           # @com_github_google_highway: run-time SIMD dispatch
  libopenblas-dev      # @openblas: CPU GEMM
  libdnnl-dev          # @onednn: bf16 GEMMs (AVX512-BF16 / AMX where the CPU has them)
  nlohmann-json3-dev   # @com_github_nlohmann_json: config and file headers
  libopenmpi-dev       # @openmpi: multi-rank runs on CPU, NCCL bootstrap
  openmpi-bin          # mpirun
  libsentencepiece-dev # @com_github_google_sentencepiece: SentencePiece tokenizer.model
  libutf8proc-dev      # @utf8proc: NFC normalization for tokenizer.json
  liburing-dev         # @liburing: io_uring for the disk tier
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "bootstrap: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "bootstrap: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "bootstrap: done"
