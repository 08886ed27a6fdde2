#!/usr/bin/env bash
# Builds the GPU kit on this machine (no GPU needed): the trainer, tools/plan, every `cuda`-tagged
# test and the GPU benchmarks under `-c opt --config=cuda`, the shared libraries they load that a
# bare CUDA machine lacks, and the tests' runfiles, packed into one .tar.xz under .gpu_kit/.
#
#   tools/gpu_kit/build.sh              # writes .gpu_kit/gpu_kit.tar.xz and prints how to run it
#
# Left out of the archive, and found on the GPU machine by tools/gpu_kit/run.sh: glibc, libstdc++,
# libgcc, and the CUDA driver, runtime, cuBLAS and NCCL libraries (the toolkit and PyTorch's
# nvidia-nccl wheel have them). Everything else `ldd` resolves is copied (absl, glog, gflags,
# OpenBLAS, oneDNN, Highway, Open MPI, ...). Environment: KIT_OUT (default .gpu_kit),
# KIT_MAX_MIB (default 48: the build fails above it), BAZEL (default bazel).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BAZEL="${BAZEL:-bazel}"
OUT_DIR="${KIT_OUT:-$ROOT/.gpu_kit}"
MAX_MIB="${KIT_MAX_MIB:-48}"
# --dynamic_mode=off: our own code linked statically into every binary (cc_test links its
# libraries as shared objects by default, which would have to travel as ~100 .so files).
FLAGS=(-c opt --config=cuda --dynamic_mode=off)
WORKSPACE_NAME=patrickstar_cc

# The GPU benchmarks the kit runs (each must fail cleanly, nonzero, without a GPU).
BENCHMARKS=(//benchmarks:cuda_copy_benchmark)
TOOLS=(//trainer:train //tools:plan)

start=$(date +%s)
mapfile -t TESTS < <("$BAZEL" query 'attr(tags, cuda, tests(//...))' 2>/dev/null | sort)
if [[ ${#TESTS[@]} -eq 0 ]]; then
  echo "build.sh: bazel query found no cuda-tagged tests" >&2
  exit 1
fi
existing_benchmarks=()
for b in "${BENCHMARKS[@]}"; do
  if "$BAZEL" query "$b" >/dev/null 2>&1; then existing_benchmarks+=("$b"); fi
done
TARGETS=("${TOOLS[@]}" "${TESTS[@]}" "${existing_benchmarks[@]}")
echo "build.sh: building ${#TARGETS[@]} targets with ${FLAGS[*]}"
"$BAZEL" build "${FLAGS[@]}" "${TARGETS[@]}"
built=$(date +%s)

STAGE="$OUT_DIR/stage"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/runfiles/$WORKSPACE_NAME"
# Each target's binary: //pkg:name -> <bazel-bin of this configuration>/pkg/name.
BIN_DIR=$("$BAZEL" info "${FLAGS[@]}" bazel-bin 2>/dev/null)
FILES=()
for t in "${TARGETS[@]}"; do
  pkg=${t#//}
  pkg=${pkg%%:*}
  FILES+=("$BIN_DIR/$pkg/${t##*:}")
done

# Binaries: bin/<package path with / as __>__<name> would be unwieldy; names are unique, so
# bin/<name>. A duplicate name is an error rather than a silent overwrite.
declare -A SEEN=()
for f in "${FILES[@]}"; do
  if [[ ! -x "$f" || ! -f "$f" ]]; then
    echo "build.sh: no binary at $f after the build" >&2
    exit 1
  fi
  name=$(basename "$f")
  if [[ -n "${SEEN[$name]:-}" ]]; then
    echo "build.sh: two targets build a binary named $name (${SEEN[$name]}, $f)" >&2
    exit 1
  fi
  SEEN[$name]=$f
  cp "$f" "$STAGE/bin/$name"
  chmod u+w "$STAGE/bin/$name"
done

# The tests' runfiles in our workspace (data files, and binaries such as trainer/train that a test
# runs): one shared tree, as TEST_SRCDIR/TEST_WORKSPACE name it. Binaries already under bin/ are
# linked there, not copied twice.
for f in "${FILES[@]}"; do
  rf="$f.runfiles/$WORKSPACE_NAME"
  [[ -d "$rf" ]] || continue
  while IFS= read -r -d '' entry; do
    rel="${entry#"$rf"/}"
    real=$(readlink -f "$entry")
    [[ "$real" == "$(readlink -f "$f")" ]] && continue   # the test itself
    dest="$STAGE/runfiles/$WORKSPACE_NAME/$rel"
    [[ -e "$dest" ]] && continue
    mkdir -p "$(dirname "$dest")"
    name=$(basename "$real")
    if [[ -n "${SEEN[$name]:-}" && "$(readlink -f "${SEEN[$name]}")" == "$real" ]]; then
      up=$(realpath --relative-to="$(dirname "$dest")" "$STAGE/bin/$name")
      ln -s "$up" "$dest"
    else
      cp "$real" "$dest"
    fi
  done < <(find -L "$rf" \( -type f -o -type l \) ! -path "*/_solib_*" -print0)
done

# Shared libraries: the ldd closure minus what the GPU machine has.
is_system_lib() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | \
      librt.so.* | libutil.so.* | libresolv.so.* | libstdc++.so.* | libgcc_s.so.*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so* | \
      libnvidia-*.so*) return 0 ;;
  esac
  return 1
}
declare -A LIBS=()
missing=()
for b in "$STAGE"/bin/*; do
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    is_system_lib "$soname" && continue
    if [[ "$path" == "not" ]]; then
      missing+=("$(basename "$b"): $soname")
      continue
    fi
    LIBS[$soname]=$path
  done < <(ldd "$b")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  printf 'build.sh: unresolved library here: %s\n' "${missing[@]}" >&2
  exit 1
fi
for soname in "${!LIBS[@]}"; do
  cp -L "${LIBS[$soname]}" "$STAGE/lib/$soname"
  chmod u+w "$STAGE/lib/$soname"
done
strip --strip-unneeded "$STAGE"/lib/* 2>/dev/null || true

for f in run.sh torch_gpt2_step.py; do
  if [[ -f "tools/gpu_kit/$f" ]]; then cp "tools/gpu_kit/$f" "$STAGE/"; fi
done
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- || echo ' (plus uncommitted changes)')"
  echo "built $(date -u +%FT%TZ) on $(uname -n) with ${FLAGS[*]}"
  echo "cuda toolkit: $(/usr/local/cuda/bin/nvcc --version | tail -1)"
  echo "tests: ${TESTS[*]}"
  echo "benchmarks: ${existing_benchmarks[*]}"
  # The newest glibc/libstdc++ symbol versions anything packed asks for (run.sh prints them).
  echo "needs $(for f in "$STAGE"/bin/* "$STAGE"/lib/*; do objdump -T "$f" 2>/dev/null; done |
    grep -o 'GLIBC_2\.[0-9]*\|GLIBCXX_3\.4\.[0-9]*' | sort -uV | awk -F_ '{m[$1] = $0} END {print m["GLIBC"], m["GLIBCXX"]}')"
  echo "libraries:"
  for soname in $(printf '%s\n' "${!LIBS[@]}" | sort); do echo "  $soname <- ${LIBS[$soname]}"; done
} >"$STAGE/MANIFEST"

ARCHIVE="$OUT_DIR/gpu_kit.tar.xz"
rm -f "$ARCHIVE"
# Sorted by name so the many test binaries (mostly the same libraries and CUDA fatbins) sit close
# together: xz's 64 MiB dictionary (-9) then stores the shared parts once.
XZ_OPT="-9 -T0" tar -C "$STAGE" --sort=name --owner=0 --group=0 -cJf "$ARCHIVE" .
bytes=$(stat -c %s "$ARCHIVE")
done_at=$(date +%s)
unpacked=$(du -sb "$STAGE" | cut -f1)
echo "build.sh: ${#TARGETS[@]} targets built in $((built - start)) s, packed in $((done_at - built)) s"
echo "build.sh: $ARCHIVE: $((bytes / 1048576)) MiB ($bytes bytes; $((unpacked / 1048576)) MiB unpacked, ${#LIBS[@]} libraries)"
if ((bytes > MAX_MIB * 1048576)); then
  echo "build.sh: the archive is over the ${MAX_MIB} MiB limit (KIT_MAX_MIB)" >&2
  exit 1
fi
rel_archive="${ARCHIVE#"$ROOT"/}"
echo "build.sh: on the GPU machine, from the repository root (carry: [\"${rel_archive%/*}\"]):"
echo "  bash tools/gpu_kit/run.sh $rel_archive"
