#!/usr/bin/env bash
# Proves the kit on a machine without a GPU, in a mount namespace where /usr/lib/x86_64-linux-gnu
# holds only what a bare Linux with the CUDA toolkit has: glibc, libstdc++, libgcc and the
# libraries of the base tools run.sh uses (bash, coreutils, tar, xz, python3, ...), none of this
# project's Debian dependencies (absl, glog, gflags, OpenBLAS, oneDNN, Highway, Open MPI,
# sentencepiece, utf8proc, gfortran, gomp). /usr/local/cuda stays visible (the GPU machine has
# the toolkit). Runs the kit twice:
#
#   1. PS_EXPECT_GPU=0: every GPU test must report SKIPPED naming "no CUDA device" (no test
#      fails), and `train --accelerator=cpu` must train from the archive;
#   2. PS_EXPECT_GPU=1: every GPU test binary must fail.
#
#   sudo tools/gpu_kit/prove_no_gpu.sh [.gpu_kit/gpu_kit.tar.xz]    # needs root (unshare -m)
#
# Exit 0 when both hold. The two summaries are written under .gpu_kit/proof/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ARCHIVE="$(readlink -f "${1:-$ROOT/.gpu_kit/gpu_kit.tar.xz}")"
PROOF="$ROOT/.gpu_kit/proof"
[[ -f "$ARCHIVE" ]] || { echo "prove_no_gpu.sh: no archive at $ARCHIVE (run tools/gpu_kit/build.sh)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "prove_no_gpu.sh: needs root for unshare -m" >&2; exit 2; }
rm -rf "$PROOF" && mkdir -p "$PROOF"

MIN=$(mktemp -d /tmp/minlib.XXXXXX)
LIBDIR=/usr/lib/x86_64-linux-gnu
# The base system: glibc, the C++ runtime, and the closure of the tools run.sh calls.
tools=(bash sh tar xz gzip python3 timeout mktemp date tee awk sed grep find sort head tail cut
  du stat readlink dirname basename ldconfig env cat rm mkdir ls tr uname id chmod cp ln)
for f in "$LIBDIR"/ld-linux-x86-64.so.2 "$LIBDIR"/libc.so.6 "$LIBDIR"/libm.so.6 \
  "$LIBDIR"/libpthread.so.0 "$LIBDIR"/libdl.so.2 "$LIBDIR"/librt.so.1 "$LIBDIR"/libutil.so.1 \
  "$LIBDIR"/libresolv.so.2 "$LIBDIR"/libstdc++.so.6 "$LIBDIR"/libgcc_s.so.1; do
  cp -L "$f" "$MIN/"
done
deps=()
for t in "${tools[@]}"; do
  p=$(command -v "$t" || true)
  [[ -n "$p" ]] && deps+=("$p")
done
# python3 may be a wrapper (pyenv): take the interpreter and its extension modules.
deps+=("$(python3 -c 'import sys; print(sys.executable)')")
deps+=("$(python3 -c 'import sysconfig; print(sysconfig.get_path("platstdlib"))')"/lib-dynload/*.so)
for p in "${deps[@]}"; do
  { ldd "$p" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    cp -Ln "$lib" "$MIN/" 2>/dev/null || true
  done
done
forbidden=$(ls "$MIN" | grep -Ei 'absl|glog|gflags|openblas|blas|lapack|dnnl|hwy|mpi|sentencepiece|utf8proc|gfortran|gomp|nccl|cuda|cublas|protobuf' || true)
if [[ -n "$forbidden" ]]; then
  echo "prove_no_gpu.sh: the base system would include project dependencies: $forbidden" >&2
  exit 1
fi
echo "prove_no_gpu.sh: base $LIBDIR for the namespace: $(ls "$MIN" | wc -l) libraries ($(ls "$MIN" | tr '\n' ' '))"

run_hidden() {  # run_hidden EXPECT OUTDIR: run.sh in the namespace
  unshare -m bash -c '
    set -e
    mount --make-rprivate /
    mount --bind "$1" /usr/lib/x86_64-linux-gnu
    echo "namespace: $(ls /usr/lib/x86_64-linux-gnu | wc -l) entries in /usr/lib/x86_64-linux-gnu"
    PS_EXPECT_GPU="$2" OUT="$3" KIT_DIR=/tmp/gpu_kit_proof bash "$4" "$5"
  ' _ "$MIN" "$1" "$2" "$ROOT/tools/gpu_kit/run.sh" "$ARCHIVE" || true
}

echo "=== run 1: PS_EXPECT_GPU=0 (GPU tests must skip naming \"no CUDA device\")"
run_hidden 0 "$PROOF/expect0"
echo "=== run 2: PS_EXPECT_GPU=1 (GPU tests must fail)"
run_hidden 1 "$PROOF/expect1"
rm -rf "$MIN"

python3 - "$PROOF/expect0/results.tar.gz" "$PROOF/expect1/results.tar.gz" "$PROOF/expect0/summary.txt" <<'PY'
import re, sys, tarfile, xml.etree.ElementTree as ET
def cases(path):
    out = {}
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if m.name.endswith(".xml"):
                root = ET.parse(tf.extractfile(m)).getroot()
                step = m.name.split("/")[-1][:-4]
                for c in root.iter("testcase"):
                    sk = c.find("skipped")
                    state = "failed" if c.findall("failure") else ("skipped" if sk is not None or c.get("result") == "skipped" else "passed")
                    out[(step, c.get("classname") + "." + c.get("name"))] = (state, (sk.get("message", "") if sk is not None else ""))
    return out
run0, run1 = cases(sys.argv[1]), cases(sys.argv[2])
problems = []
# Tests not yet on base/testing/gpu_gate.h (their files belong to other work): reported, not fatal.
UNGATED = set()  # every GPU test goes through base/testing/gpu_gate.h
warnings = []
skipped0 = {k for k, (s, _) in run0.items() if s == "skipped"}
failed0 = [k for k, (s, _) in run0.items() if s == "failed"]
problems += [f"run 1: {k} failed" for k in failed0]
for k in skipped0:
    if "no CUDA device" not in run0[k][1]:
        (warnings if k[0] in UNGATED else problems).append(f"run 1: {k} skipped without naming \"no CUDA device\": {run0[k][1][:200]}")
for k in skipped0:
    state, msg = run1.get(k, ("missing", ""))
    if state == "failed":
        continue
    if state == "skipped" and re.search(r"needs [2-9][0-9]* CUDA GPUs", msg):
        continue  # PS_EXPECT_GPU=1 covers one GPU; a 2-GPU test still skips, by design
    (warnings if k[0] in UNGATED else problems).append(
        f"run 2: {k} did not fail under PS_EXPECT_GPU=1 ({state}: {msg[:160]})")
summary = open(sys.argv[3]).read()
if not re.search(r"^train_cpu_smoke\|ok\|", summary, re.M):
    problems.append("run 1: train --accelerator=cpu did not succeed from the archive")
n_pass0 = sum(1 for s, _ in run0.values() if s == "passed")
n_fail1 = sum(1 for s, _ in run1.values() if s == "failed")
print(f"prove_no_gpu.sh: run 1 (PS_EXPECT_GPU=0): {len(run0)} cases in {len({k[0] for k in run0})} test binaries: "
      f"{len(skipped0)} skipped, {n_pass0} passed (no-GPU checks), {len(failed0)} failed")
named = sum(1 for k in skipped0 if "no CUDA device" in run0[k][1])
turned = sum(1 for k in skipped0 if run1.get(k, ("",))[0] == "failed")
multi = sum(1 for k in skipped0 if run1.get(k, ("",))[0] == "skipped" and re.search(r"needs [2-9][0-9]* CUDA GPUs", run1[k][1]))
print(f"prove_no_gpu.sh: run 1 skips naming \"no CUDA device\": {named} of {len(skipped0)}")
print(f"prove_no_gpu.sh: run 2 (PS_EXPECT_GPU=1): {n_fail1} cases failed; of the {len(skipped0)} run-1 skips, "
      f"{turned} failed, {multi} still skipped as multi-GPU tests, {len(skipped0) - turned - multi} other")
for w in warnings:
    print("WARNING (not gated yet): " + w)
for p in problems:
    print("PROBLEM: " + p)
sys.exit(1 if problems else 0)
PY
