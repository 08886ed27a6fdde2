#!/usr/bin/env bash
# Runs the GPU kit that tools/gpu_kit/build.sh made, on a machine with a GPU (and no Bazel):
#
#   bash tools/gpu_kit/run.sh .gpu_kit/gpu_kit.tar.xz
#
# Unpacks to /tmp, finds cudart/cuBLAS in the CUDA toolkit and libnccl in PyTorch's nvidia-nccl
# wheel (else the toolkit, else ldconfig), prints nvidia-smi and every library it resolved, then
# runs, in order of value and each under a timeout: a CPU training smoke run from the archive, the
# kernel tests, the Adam tests, the backend tests, the model GPU test, train_cuda_test, the GPU
# benchmarks, the trainer in bf16 on the GPU, the same GPT-2 step in PyTorch. Every GPU test runs
# with PS_EXPECT_GPU=1, so "no GPU" fails rather than skips.
# Results go to $OUT when set, else to the folder printed at the start: summary.txt (what ran,
# passed/failed/skipped, the numbers), run.log (everything printed) and results.tar.gz (gtest XML
# and one log per step). Environment: KIT_BUDGET_S (default 400 seconds for the whole run: each
# step's timeout is cut to what is left of it, and steps after it are listed as not run), KIT_DIR
# (default /tmp/gpu_kit), KIT_ONLY (a regex: run only the steps whose name matches), PS_EXPECT_GPU
# (default 1; set 0 to let GPU tests skip, as in the no-GPU proof run).
set -uo pipefail

ARCHIVE="${1:?usage: run.sh ARCHIVE (the .tar.xz that tools/gpu_kit/build.sh wrote)}"
[[ -f "$ARCHIVE" ]] || { echo "run.sh: no archive at $ARCHIVE" >&2; exit 2; }
ARCHIVE="$(cd "$(dirname "$ARCHIVE")" && pwd)/$(basename "$ARCHIVE")"
RESULTS="${OUT:-/tmp/gpu_kit_results_$(date +%Y%m%d_%H%M%S)}"
KIT="${KIT_DIR:-/tmp/gpu_kit}"
BUDGET_S="${KIT_BUDGET_S:-400}"
ONLY="${KIT_ONLY:-.}"
export PS_EXPECT_GPU="${PS_EXPECT_GPU:-1}"
START=$(date +%s)
mkdir -p "$RESULTS"
WORK="$(mktemp -d /tmp/gpu_kit_work.XXXXXX)"
mkdir -p "$WORK/xml" "$WORK/logs"
exec > >(tee "$RESULTS/run.log") 2>&1
SUMMARY="$RESULTS/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "gpu kit run $(date -u +%FT%TZ) on $(uname -n); results in $RESULTS; PS_EXPECT_GPU=$PS_EXPECT_GPU"

rm -rf "$KIT" && mkdir -p "$KIT"
if ! tar -C "$KIT" -xJf "$ARCHIVE" 2>/dev/null; then
  # No xz binary: Python's lzma reads it.
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$ARCHIVE" "$KIT" || { note "run.sh: cannot unpack $ARCHIVE"; exit 2; }
fi
note "unpacked in $(($(date +%s) - START)) s: $(head -1 "$KIT/MANIFEST")"

# --- libraries -----------------------------------------------------------------------------------
first_dir_with() {  # first_dir_with FILE DIR... : the first DIR holding FILE
  local file=$1 d
  shift
  for d in "$@"; do
    [[ -e "$d/$file" ]] && { echo "$d"; return 0; }
  done
  return 1
}
cuda_dirs=()
for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13* /usr/local/cuda-*; do
  [[ -n "$c" && -d "$c" ]] || continue
  for sub in lib64 lib targets/x86_64-linux/lib; do [[ -d "$c/$sub" ]] && cuda_dirs+=("$c/$sub"); done
done
site_dirs=()
while IFS= read -r d; do [[ -d "$d" ]] && site_dirs+=("$d"); done < <(python3 -c \
  'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null)
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
if [[ -z "$nccl_dir" || ! -e "$nccl_dir/libnccl.so.2" ]]; then
  nccl_dir=""
  for s in "${site_dirs[@]}"; do
    f=$(find "$s/nvidia" -name 'libnccl.so.2' 2>/dev/null | head -1)
    [[ -n "$f" ]] && { nccl_dir=$(dirname "$f"); break; }
  done
fi
[[ -z "$nccl_dir" ]] && nccl_dir=$(first_dir_with libnccl.so.2 "${cuda_dirs[@]}")
[[ -z "$nccl_dir" ]] && nccl_dir=$(dirname "$(ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}')" 2>/dev/null)
cudart_dir=$(first_dir_with libcudart.so.13 "${cuda_dirs[@]}")
cublas_dir=$(first_dir_with libcublas.so.13 "${cuda_dirs[@]}")
lib_path="$KIT/lib"
for d in "$cudart_dir" "$cublas_dir" "$nccl_dir"; do
  [[ -n "$d" && ":$lib_path:" != *":$d:"* ]] && lib_path="$lib_path:$d"
done
# Only our binaries get the kit's libraries: python3 (PyTorch, the summary) keeps the system's.
KIT_LD="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
note "LD_LIBRARY_PATH for the kit's binaries: $KIT_LD"
note "system: $(ldd --version 2>&1 | head -1); the kit $(grep -m1 '^needs' "$KIT/MANIFEST" || echo 'needs: see MANIFEST')"
note "cudart: ${cudart_dir:-NOT FOUND}; cuBLAS: ${cublas_dir:-NOT FOUND}; NCCL: ${nccl_dir:-NOT FOUND}"

echo "--- nvidia-smi"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi 2>&1 | head -25
  note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4 | tr '\n' ';')"
else
  note "gpu: nvidia-smi not found"
fi

echo "--- libraries as the binaries resolve them (realpath = version)"
unresolved=0
declare -A shown=()
for b in "$KIT"/bin/*; do
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    if [[ "$path" == "not" ]]; then
      note "MISSING: $(basename "$b") needs $soname (not found)"
      unresolved=1
      continue
    fi
    [[ -n "${shown[$soname]:-}" ]] && continue
    shown[$soname]=1
    echo "  $soname => $(readlink -f "$path")"
  done < <(LD_LIBRARY_PATH="$KIT_LD" ldd "$b" 2>&1)
  if LD_LIBRARY_PATH="$KIT_LD" ldd "$b" 2>&1 | grep -q "version .* not found"; then
    note "TOO OLD: $(basename "$b"): $(LD_LIBRARY_PATH="$KIT_LD" ldd "$b" 2>&1 | grep -m2 'not found' | tr '\n' ' ')"
    unresolved=1
  fi
done
for soname in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  [[ -n "${shown[$soname]:-}" ]] || continue
  p=$(LD_LIBRARY_PATH="$KIT_LD" ldd "$KIT/bin/train" "$KIT"/bin/*_test 2>/dev/null | awk -v s="$soname" '$1 == s {print $3; exit}')
  note "  $soname => $(readlink -f "$p")"
done
[[ $unresolved -eq 0 ]] || note "some libraries are missing: the binaries that need them fail below"

# --- steps ---------------------------------------------------------------------------------------
export TEST_SRCDIR="$KIT/runfiles" TEST_WORKSPACE=patrickstar_cc RUNFILES_DIR="$KIT/runfiles"
failed_steps=0
declare -a ROWS=()

# step NAME TIMEOUT_S CMD...: runs CMD under `timeout`, output in logs/NAME.log; gtest binaries
# (ending in _test) also write xml/NAME.xml.
step() {
  local name=$1 limit=$2
  shift 2
  [[ "$name" =~ $ONLY ]] || return 0
  # Each step's timeout is cut to what is left of the budget, so the whole run ends in time.
  local left=$((BUDGET_S - ($(date +%s) - START)))
  if ((left < 10)); then
    ROWS+=("$name|not run|-|out of time (KIT_BUDGET_S=$BUDGET_S)")
    failed_steps=$((failed_steps + 1))
    return 0
  fi
  ((limit > left)) && limit=$left
  local log="$WORK/logs/$name.log" xml="$WORK/xml/$name.xml" t0 rc
  local cmd=("$@")
  [[ "$(basename "$1")" == *_test ]] && cmd+=("--gtest_output=xml:$xml")
  echo "--- $name (timeout ${limit}s): ${cmd[*]}"
  t0=$(date +%s)
  local ld="$KIT_LD"
  [[ "$1" == python3 ]] && ld="${LD_LIBRARY_PATH:-}"
  TEST_TMPDIR="$(mktemp -d "$WORK/tmp.XXXXXX")" LD_LIBRARY_PATH="$ld" \
    timeout -k 10 "$limit" "${cmd[@]}" >"$log" 2>&1
  rc=$?
  local secs=$(($(date +%s) - t0)) verdict
  tail -40 "$log"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    verdict="TIMEOUT after ${limit}s"
  elif [[ $rc -eq 0 ]]; then
    verdict="ok"
  else
    verdict="FAILED rc=$rc"
  fi
  [[ "$verdict" == ok ]] || failed_steps=$((failed_steps + 1))
  ROWS+=("$name|$verdict|${secs}s|$(counts "$xml" "$log")")
}

# counts XML LOG: "P passed, F failed, S skipped" from gtest XML, plus skip/failure messages.
counts() {
  python3 - "$1" "$2" <<'PY'
import os, re, sys, xml.etree.ElementTree as ET
xml, log = sys.argv[1], sys.argv[2]
if not os.path.exists(xml):
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    nums = [l for l in text.splitlines() if re.search(r"tokens/s|GB/s|TFLOP|MFU|peak|^time:|step\s+\d+|loss", l)]
    last = [l for l in text.splitlines() if l.strip()][-2:]
    print(" / ".join(nums[-12:]) if nums else "last output: " + " / ".join(last))
    sys.exit()
p = f = s = 0
notes = []
for case in ET.parse(xml).getroot().iter("testcase"):
    name = case.get("classname", "") + "." + case.get("name", "")
    fails = case.findall("failure")
    skipped = case.find("skipped")
    if fails:
        f += 1
        notes.append("FAILED " + name + ": " + " ".join(fails[0].get("message", "").split())[:300])
    elif skipped is not None or case.get("result") == "skipped":
        s += 1
        msg = (skipped.get("message", "") if skipped is not None else "").strip().replace("\n", " ")
        notes.append("SKIPPED " + name + ": " + msg[:300])
    else:
        p += 1
more = f"\n    ... {len(notes) - 12} more in the XML" if len(notes) > 12 else ""
print(f"{p} passed, {f} failed, {s} skipped" + "".join("\n    " + n for n in notes[:12]) + more)
PY
}

B="$KIT/bin"
# A CPU training run from the archive: proves the packed libraries load and train.
step train_cpu_smoke 120 "$B/train" --accelerator=cpu --steps=3
# The skip-or-fail rule itself (base/testing/gpu_gate.h) and what the CUDA probe reports.
[[ -x "$B/gpu_gate_test" ]] && step gpu_gate_test 30 "$B/gpu_gate_test"
for t in matmul_test linear_test elementwise_test layernorm_test attention_test \
  lm_head_cross_entropy_test rmsnorm_test llama_elementwise_test gqa_attention_test \
  vocab_blocks_test cuda_kernels_test; do
  [[ -x "$B/$t" ]] && step "$t" 120 "$B/$t"
done
for t in cuda_adam_test hybrid_adam_cuda_test; do [[ -x "$B/$t" ]] && step "$t" 120 "$B/$t"; done
# The backend suite first without the case that may deadlock on CUDA (pageable copies behind a
# held stream, cuda-first-run-suspects #3), then that case alone under a short timeout.
step cuda_backend_test 90 "$B/cuda_backend_test" --gtest_filter='-*EventsCaptureWorkAndOrderStreams*'
step cuda_backend_events 30 "$B/cuda_backend_test" --gtest_filter='*EventsCaptureWorkAndOrderStreams*'
for t in backend_factory_test nccl_communicator_test gpt_model_cuda_test; do
  [[ -x "$B/$t" ]] && step "$t" 120 "$B/$t"
done
step train_cuda_test 240 "$B/train_cuda_test"
# Any cuda-tagged test not named above (added since): after the known ones.
for t in "$B"/*_test; do
  name=$(basename "$t")
  printf '%s\n' "${ROWS[@]}" | grep -q "^$name|" && continue
  step "$name" 120 "$t"
done
for bench in "$B"/*_benchmark; do
  [[ -x "$bench" ]] && step "$(basename "$bench")" 90 "$bench"
done
# The trainer on the GPU, bf16 (each prints tokens/s per step and the split of step time into
# compute, waiting for chunk copies and optimizer): GPT-2 124M at the PyTorch script's batch with
# all model data resident, then under a cap below its model data (~2 GiB), then 1B and a Llama
# preset resident, one sequence of 1024 tokens per step.
echo '{"bf16": {"enabled": true}}' >"$WORK/bf16.json"
gpu_train() {  # gpu_train NAME TIMEOUT FLAGS...
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" "$B/train" --config="$WORK/bf16.json" --accelerator=cuda --steps=6 "$@"
}
gpu_train train_gpu_gpt2_resident 90 --model=gpt2 --accelerator_memory=48GiB --seq_len=1024 \
  --micro_batch_size=8
gpu_train train_gpu_gpt2_capped 90 --model=gpt2 --accelerator_memory=1GiB --seq_len=1024 \
  --micro_batch_size=1
gpu_train train_gpu_1b_resident 120 --model=1B --accelerator_memory=48GiB --seq_len=1024 \
  --micro_batch_size=1
gpu_train train_gpu_llama_3_2_1b_resident 120 --model=llama-3.2-1b --accelerator_memory=48GiB \
  --seq_len=1024 --micro_batch_size=1
if [[ -f "$KIT/torch_gpt2_step.py" ]]; then
  step torch_gpt2_step 120 python3 "$KIT/torch_gpt2_step.py" --batch 8 --seq 1024
fi

# --- MFU: each GPU training run's model FLOP rate (its summary's "model compute") over the cuBLAS
# bf16 GEMM peak the PyTorch step probed in this run (absent when either is missing).
peak_tflops=$(sed -n 's/^cuBLAS bf16 GEMM peak.*: \([0-9.]*\) TFLOP\/s.*/\1/p' \
  "$WORK/logs/torch_gpt2_step.log" 2>/dev/null | tail -1)
MFU_LINES=()
for log in "$WORK"/logs/train_gpu_*.log; do
  [[ -f "$log" && -n "$peak_tflops" ]] || continue
  rate=$(sed -n 's/^model compute \([0-9.e+]*\) \([GT]\)FLOP\/s.*/\1 \2/p' "$log" | tail -1)
  [[ -n "$rate" ]] || continue
  MFU_LINES+=("$(python3 -c 'import sys; v, unit, peak = float(sys.argv[1]), sys.argv[2], float(sys.argv[3]); t = v / 1000 if unit == "G" else v; print(f"{sys.argv[4]}: {t:.2f} model TFLOP/s = MFU {t / peak:.3f} of the {peak:.1f} TFLOP/s bf16 GEMM peak")' \
    ${rate} "$peak_tflops" "$(basename "$log" .log)")")
done

# --- summary -------------------------------------------------------------------------------------
{
  echo
  echo "step | verdict | time | gtest cases / numbers"
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo
  for m in "${MFU_LINES[@]}"; do echo "$m"; done
  echo "$failed_steps step(s) not ok; whole run $(($(date +%s) - START)) s"
} | tee -a "$SUMMARY"
tar -C "$WORK" -czf "$RESULTS/results.tar.gz" xml logs
echo "run.sh: summary $SUMMARY; XML and logs in $RESULTS/results.tar.gz"
[[ $failed_steps -eq 0 ]]
