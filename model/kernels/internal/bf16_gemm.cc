#include "model/kernels/internal/bf16_gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "memory/convert.h"
#include "model/kernels/internal/blas.h"
#include "model/kernels/internal/kernel_util.h"
#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl_debug.h"

namespace ps::kernels_internal {

absl::string_view Bf16GemmBackendName(Bf16GemmBackend backend) {
  switch (backend) {
    case Bf16GemmBackend::kAuto:
      return "auto";
    case Bf16GemmBackend::kOneDnn:
      return "onednn";
    case Bf16GemmBackend::kFallback:
      return "fallback";
  }
  return "unknown";
}

// Flag parsing (found by argument-dependent lookup).
bool AbslParseFlag(absl::string_view text, Bf16GemmBackend* backend, std::string* error) {
  for (Bf16GemmBackend b :
       {Bf16GemmBackend::kAuto, Bf16GemmBackend::kOneDnn, Bf16GemmBackend::kFallback}) {
    if (text == Bf16GemmBackendName(b)) {
      *backend = b;
      return true;
    }
  }
  *error = absl::StrCat("'", text, "' is not a bf16 GEMM backend: use auto, onednn or fallback");
  return false;
}

std::string AbslUnparseFlag(Bf16GemmBackend backend) {
  return std::string(Bf16GemmBackendName(backend));
}

}  // namespace ps::kernels_internal

ABSL_FLAG(ps::kernels_internal::Bf16GemmBackend, bf16_gemm,
          ps::kernels_internal::Bf16GemmBackend::kAuto,
          "bf16 GEMMs of the CPU kernels: auto (oneDNN where the CPU has AVX512-BF16 or AMX, else "
          "f32 sgemm on the widened operands), onednn, or fallback (model/kernels/internal/"
          "bf16_gemm.h).");

namespace ps::kernels_internal {
namespace {

// -1: no override; else a Bf16GemmBackend.
std::atomic<int> g_backend_override{-1};

absl::Status DnnlError(absl::string_view what, dnnl_status_t status) {
  return absl::InternalError(absl::StrCat("oneDNN: ", what, " failed: ", dnnl_status2str(status)));
}

#define PS_DNNL_RETURN_IF_ERROR(what, call)       \
  do {                                            \
    const dnnl_status_t ps_dnnl_status_ = (call); \
    if (ps_dnnl_status_ != dnnl_success) {        \
      return DnnlError((what), ps_dnnl_status_);  \
    }                                             \
  } while (false)

// One GEMM block shape: everything a matmul primitive is specialized on.
struct BlockKey {
  bool trans_a, trans_b, accumulate;
  int64_t m, n, k, lda, ldb, ldc;
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& key) {
    return H::combine(std::move(h), key.trans_a, key.trans_b, key.accumulate, key.m, key.n, key.k,
                      key.lda, key.ldb, key.ldc);
  }
  friend bool operator==(const BlockKey& a, const BlockKey& b) {
    return std::tie(a.trans_a, a.trans_b, a.accumulate, a.m, a.n, a.k, a.lda, a.ldb, a.ldc) ==
           std::tie(b.trans_a, b.trans_b, b.accumulate, b.m, b.n, b.k, b.lda, b.ldb, b.ldc);
  }
};

// A created primitive and the memory descriptors of its arguments.
struct Primitive {
  dnnl_primitive_t primitive = nullptr;
  dnnl_memory_desc_t src, weights, dst, scratchpad;
  size_t scratchpad_bytes = 0;
  std::string impl;
  ~Primitive() {
    if (primitive != nullptr) dnnl_primitive_destroy(primitive);
  }
};

// A stream and a scratchpad buffer per thread that executes primitives.
struct ThreadResources {
  dnnl_stream_t stream = nullptr;
  std::vector<uint8_t> scratchpad;
  ~ThreadResources() {
    if (stream != nullptr) dnnl_stream_destroy(stream);
  }
};

// The process's oneDNN engine, its availability and the primitive cache.
class OneDnn {
 public:
  static OneDnn& Get() {
    static OneDnn* const instance = new OneDnn();  // never destroyed: used until exit
    return *instance;
  }

  bool available() const { return available_; }
  const std::string& description() const { return description_; }

  // The cached primitive for `key`, created on first use.
  absl::StatusOr<std::shared_ptr<const Primitive>> Find(const BlockKey& key) {
    {
      MutexLock lock(&mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) return it->second;
    }
    ASSIGN_OR_RETURN(std::shared_ptr<const Primitive> p, Create(key));
    MutexLock lock(&mu_);
    return cache_.try_emplace(key, std::move(p)).first->second;
  }

  // Runs `p` on one block, serially on the calling thread.
  absl::Status Execute(const Primitive& p, const uint16_t* a, const uint16_t* b, float* c) {
    thread_local ThreadResources resources;
    if (resources.stream == nullptr) {
      PS_DNNL_RETURN_IF_ERROR("dnnl_stream_create", dnnl_stream_create(&resources.stream, engine_,
                                                                       dnnl_stream_default_flags));
    }
    if (resources.scratchpad.size() < p.scratchpad_bytes) {
      resources.scratchpad.resize(p.scratchpad_bytes);
    }
    // oneDNN (OpenMP build) runs a primitive on omp_get_max_threads() threads of the calling
    // thread: one, so the block runs here and no OpenMP team is ever started.
    omp_set_num_threads(1);
    struct Arg {
      int kind;
      const dnnl_memory_desc_t* md;
      void* data;
    };
    const Arg args[] = {{DNNL_ARG_SRC, &p.src, const_cast<uint16_t*>(a)},
                        {DNNL_ARG_WEIGHTS, &p.weights, const_cast<uint16_t*>(b)},
                        {DNNL_ARG_DST, &p.dst, c},
                        {DNNL_ARG_SCRATCHPAD, &p.scratchpad, resources.scratchpad.data()}};
    dnnl_exec_arg_t exec_args[4];
    dnnl_memory_t memories[4] = {};
    absl::Status status;
    int created = 0;
    for (; created < 4; ++created) {
      const dnnl_status_t s =
          dnnl_memory_create(&memories[created], args[created].md, engine_, args[created].data);
      if (s != dnnl_success) {
        status = DnnlError("dnnl_memory_create", s);
        break;
      }
      exec_args[created] = {args[created].kind, memories[created]};
    }
    if (status.ok()) {
      dnnl_status_t s = dnnl_primitive_execute(p.primitive, resources.stream, 4, exec_args);
      if (s == dnnl_success) s = dnnl_stream_wait(resources.stream);
      if (s != dnnl_success) status = DnnlError("matmul execution", s);
    }
    for (int i = 0; i < created; ++i) dnnl_memory_destroy(memories[i]);
    return status;
  }

 private:
  OneDnn() {
    if (const dnnl_status_t s = dnnl_engine_create(&engine_, dnnl_cpu, 0); s != dnnl_success) {
      description_ = absl::StrCat("oneDNN: no CPU engine (", dnnl_status2str(s), ")");
      return;
    }
    const dnnl_version_t* v = dnnl_version();
    const std::string version = absl::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch);
    const int isa = static_cast<int>(dnnl_get_effective_cpu_isa());
    const int bf16 = static_cast<int>(dnnl_cpu_isa_avx512_core_bf16);
    if ((isa & bf16) != bf16) {
      description_ = absl::StrCat(version, ": this CPU has no AVX512-BF16 or AMX (oneDNN ISA 0x",
                                  absl::Hex(isa), ")");
      return;
    }
    // The ISA is there; check that the primitive oneDNN builds for a bf16 GEMM is a native one
    // (a reference or conversion-based implementation would be slower than the fallback).
    absl::StatusOr<std::shared_ptr<const Primitive>> probe =
        Create(BlockKey{false, false, false, 64, 64, 64, 64, 64, 64});
    if (!probe.ok()) {
      description_ = absl::StrCat(version, ": ", probe.status().message());
      return;
    }
    const std::string& impl = (*probe)->impl;
    if (impl.find("bf16") == std::string::npos && impl.find("amx") == std::string::npos) {
      description_ = absl::StrCat(version, ": no native bf16 matmul (oneDNN chose ", impl, ")");
      return;
    }
    available_ = true;
    description_ = absl::StrCat(version, ": ", impl);
  }

  absl::StatusOr<std::shared_ptr<const Primitive>> Create(const BlockKey& key) {
    // oneDNN plans a primitive for omp_get_max_threads() threads of the creating thread and runs
    // an OpenMP team of that size: plan for the one thread each block runs on.
    omp_set_num_threads(1);
    auto p = std::make_shared<Primitive>();
    const dnnl_dims_t src_dims = {key.m, key.k}, wei_dims = {key.k, key.n},
                      dst_dims = {key.m, key.n};
    // Row-major strides of the stored matrices; a transposed operand swaps them.
    const dnnl_dims_t src_strides = {key.trans_a ? 1 : key.lda, key.trans_a ? key.lda : 1};
    const dnnl_dims_t wei_strides = {key.trans_b ? 1 : key.ldb, key.trans_b ? key.ldb : 1};
    const dnnl_dims_t dst_strides = {key.ldc, 1};
    PS_DNNL_RETURN_IF_ERROR(
        "src memory descriptor",
        dnnl_memory_desc_init_by_strides(&p->src, 2, src_dims, dnnl_bf16, src_strides));
    PS_DNNL_RETURN_IF_ERROR(
        "weights memory descriptor",
        dnnl_memory_desc_init_by_strides(&p->weights, 2, wei_dims, dnnl_bf16, wei_strides));
    PS_DNNL_RETURN_IF_ERROR(
        "dst memory descriptor",
        dnnl_memory_desc_init_by_strides(&p->dst, 2, dst_dims, dnnl_f32, dst_strides));
    dnnl_matmul_desc_t desc;
    PS_DNNL_RETURN_IF_ERROR("dnnl_matmul_desc_init",
                            dnnl_matmul_desc_init(&desc, &p->src, &p->weights, nullptr, &p->dst));
    dnnl_primitive_attr_t attr = nullptr;
    PS_DNNL_RETURN_IF_ERROR("dnnl_primitive_attr_create", dnnl_primitive_attr_create(&attr));
    std::unique_ptr<dnnl_primitive_attr, decltype(&dnnl_primitive_attr_destroy)> attr_owner(
        attr, &dnnl_primitive_attr_destroy);
    PS_DNNL_RETURN_IF_ERROR("scratchpad mode", dnnl_primitive_attr_set_scratchpad_mode(
                                                   attr, dnnl_scratchpad_mode_user));
    if (key.accumulate) {
      dnnl_post_ops_t post_ops = nullptr;
      PS_DNNL_RETURN_IF_ERROR("dnnl_post_ops_create", dnnl_post_ops_create(&post_ops));
      std::unique_ptr<dnnl_post_ops, decltype(&dnnl_post_ops_destroy)> post_ops_owner(
          post_ops, &dnnl_post_ops_destroy);
      PS_DNNL_RETURN_IF_ERROR("sum post-op", dnnl_post_ops_append_sum(post_ops, 1.0f));
      PS_DNNL_RETURN_IF_ERROR("post-ops", dnnl_primitive_attr_set_post_ops(attr, post_ops));
    }
    dnnl_primitive_desc_t pd = nullptr;
    PS_DNNL_RETURN_IF_ERROR(absl::StrCat("bf16 matmul ", key.m, "x", key.n, "x", key.k),
                            dnnl_primitive_desc_create(&pd, &desc, attr, engine_, nullptr));
    std::unique_ptr<dnnl_primitive_desc, decltype(&dnnl_primitive_desc_destroy)> pd_owner(
        pd, &dnnl_primitive_desc_destroy);
    const char* impl = nullptr;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
        impl != nullptr) {
      p->impl = impl;
    }
    p->scratchpad = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    p->scratchpad_bytes = dnnl_memory_desc_get_size(&p->scratchpad);
    PS_DNNL_RETURN_IF_ERROR("dnnl_primitive_create", dnnl_primitive_create(&p->primitive, pd));
    return std::shared_ptr<const Primitive>(std::move(p));
  }

  dnnl_engine_t engine_ = nullptr;  // never destroyed (the singleton lives until exit)
  bool available_ = false;
  std::string description_;
  Mutex mu_;
  absl::flat_hash_map<BlockKey, std::shared_ptr<const Primitive>> cache_ ABSL_GUARDED_BY(mu_);
};

// Block sizes of the task grid: fixed by the shape. About 8 blocks (enough for a few threads to
// balance) of at least 128 columns / rows, multiples of 16.
constexpr int64_t kTargetBlocks = 8;
constexpr int64_t kMinBlock = 128;

int64_t RoundUp(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

int64_t BlockSize(int64_t extent, int64_t blocks) {
  return std::max(kMinBlock, RoundUp((extent + blocks - 1) / blocks, 16));
}

absl::Status GemmOneDnn(const Bf16GemmArgs& g, ThreadPool* pool) {
  OneDnn& dnn = OneDnn::Get();
  // Columns first (each block then packs only its own columns of B); rows too if the columns
  // alone give too few blocks.
  const int64_t bn = BlockSize(g.n, kTargetBlocks);
  const int64_t n_blocks = NumTasks(g.n, bn);
  const int64_t bm = n_blocks >= kTargetBlocks ? g.m : BlockSize(g.m, kTargetBlocks / n_blocks);
  const int64_t m_blocks = NumTasks(g.m, bm);
  // At most four block shapes (interior and edge in each dimension); create them all first so a
  // failure writes nothing.
  std::shared_ptr<const Primitive> prims[2][2];
  for (int em = 0; em < 2; ++em) {
    for (int en = 0; en < 2; ++en) {
      const int64_t rows = em == 0 ? std::min(bm, g.m) : g.m - (m_blocks - 1) * bm;
      const int64_t cols = en == 0 ? std::min(bn, g.n) : g.n - (n_blocks - 1) * bn;
      ASSIGN_OR_RETURN(prims[em][en], dnn.Find(BlockKey{g.trans_a, g.trans_b, g.accumulate, rows,
                                                        cols, g.k, g.lda, g.ldb, g.ldc}));
    }
  }
  std::vector<absl::Status> statuses(static_cast<size_t>(m_blocks * n_blocks));
  ParallelFor(pool, m_blocks * n_blocks, [&](int64_t task) {
    const int64_t mb = task / n_blocks, nb = task % n_blocks;
    const int64_t m0 = mb * bm, n0 = nb * bn;
    const Primitive& p = *prims[mb == m_blocks - 1 ? 1 : 0][nb == n_blocks - 1 ? 1 : 0];
    const uint16_t* a = g.trans_a ? g.a + m0 : g.a + m0 * g.lda;
    const uint16_t* b = g.trans_b ? g.b + n0 * g.ldb : g.b + n0;
    statuses[static_cast<size_t>(task)] = dnn.Execute(p, a, b, g.c + m0 * g.ldc + n0);
  });
  for (const absl::Status& s : statuses) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// The fallback's scratch: one buffer per slot per thread, grown as needed (a fresh allocation per
// GEMM faulted in zeroed pages on every call: on a Zen 3 the fallback then reached 0.81x of sgemm
// on 1024^3 products, and bf16 training steps ran 0.92x as fast as f32).
struct ScratchBuffer {
  std::unique_ptr<float[]> data;
  int64_t elems = 0;
  float* Get(int64_t n) {
    if (n > elems) {
      data.reset();  // release before growing: never both at once
      data.reset(new float[static_cast<size_t>(n)]);
      elems = n;
    }
    return data.get();
  }
};

// rows x cols bf16 (leading dimension ld) widened into a packed f32 matrix `out`, in fixed row
// ranges on `pool` (exact: every bf16 value is an f32 value).
void Widen(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, float* out,
           ThreadPool* pool) {
  ParallelForRanges(pool, rows, RowsPerTask(cols, 64 * 1024), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) ConvertBF16ToF32(src + r * ld, out + r * cols, cols);
  });
}

absl::Status GemmFallback(const Bf16GemmArgs& g, ThreadPool* pool) {
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  float* a = FallbackScratch(0, a_rows * a_cols);
  float* b = FallbackScratch(1, b_rows * b_cols);
  Widen(g.a, a_rows, a_cols, g.lda, a, pool);
  Widen(g.b, b_rows, b_cols, g.ldb, b, pool);
  Gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a, a_cols, b, b_cols, g.accumulate ? 1.0f : 0.0f,
       g.c, g.ldc, pool);
  return absl::OkStatus();
}

}  // namespace

void RoundToBf16(const float* src, uint16_t* dst, int64_t n, ThreadPool* pool) {
  constexpr int64_t kGrain = 64 * 1024;
  ParallelForRanges(pool, n, kGrain, [&](int64_t begin, int64_t end) {
    ConvertF32ToBF16(src + begin, dst + begin, end - begin);
  });
}

void RoundToBf16Transposed(const float* src, int64_t rows, int64_t cols, uint16_t* dst,
                           ThreadPool* pool) {
  // Tiles of 64 x 64: a tile's source rows and destination rows stay in L1.
  constexpr int64_t kTile = 64;
  const int64_t row_tiles = NumTasks(rows, kTile), col_tiles = NumTasks(cols, kTile);
  ParallelFor(pool, row_tiles * col_tiles, [&](int64_t task) {
    const int64_t r0 = (task / col_tiles) * kTile, c0 = (task % col_tiles) * kTile;
    const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
    uint16_t rounded[kTile];
    for (int64_t r = r0; r < r1; ++r) {
      ConvertF32ToBF16(src + r * cols + c0, rounded, c1 - c0);
      for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = rounded[c - c0];
    }
  });
}

void RoundToBf16Values(const float* src, float* dst, int64_t n, ThreadPool* pool) {
  constexpr int64_t kGrain = 64 * 1024;
  ParallelForRanges(pool, n, kGrain, [&](int64_t begin, int64_t end) {
    // Through a bf16 buffer in L1: the rounding of RoundToBf16 (memory/convert.h), bit for bit.
    constexpr int64_t kPiece = 2048;
    uint16_t rounded[kPiece];
    for (int64_t i = begin; i < end; i += kPiece) {
      const int64_t len = std::min(kPiece, end - i);
      ConvertF32ToBF16(src + i, rounded, len);
      ConvertBF16ToF32(rounded, dst + i, len);
    }
  });
}

void WidenBf16(const uint16_t* src, float* dst, int64_t n, ThreadPool* pool) {
  constexpr int64_t kGrain = 64 * 1024;
  ParallelForRanges(pool, n, kGrain, [&](int64_t begin, int64_t end) {
    ConvertBF16ToF32(src + begin, dst + begin, end - begin);
  });
}

float* FallbackScratch(int slot, int64_t elems) {
  thread_local ScratchBuffer buffers[kFallbackScratchSlots];
  return buffers[slot].Get(std::max<int64_t>(elems, 1));
}

void FallbackTileLogits(const float* hr, const float* wf, int64_t R, int64_t Vt, int64_t C,
                        float* z, ThreadPool* pool) {
  Gemm(false, true, R, Vt, C, 1.0f, hr, C, wf, C, 0.0f, z, Vt, pool);
}

void FallbackTileGrads(const float* hr, const float* wf, const float* dz, float* dzr, int64_t R,
                       int64_t Vt, int64_t C, float* dh, float* dw, ThreadPool* pool) {
  RoundToBf16Values(dz, dzr, R * Vt, pool);
  Gemm(false, false, R, C, Vt, 1.0f, dzr, Vt, wf, C, 1.0f, dh, C, pool);
  Gemm(true, false, Vt, C, R, 1.0f, dzr, Vt, hr, C, 1.0f, dw, C, pool);
}

bool OneDnnBf16Available() { return OneDnn::Get().available(); }
const std::string& OneDnnBf16Description() { return OneDnn::Get().description(); }

void SetBf16GemmBackendForTest(Bf16GemmBackend backend) {
  g_backend_override.store(backend == Bf16GemmBackend::kAuto ? -1 : static_cast<int>(backend));
}

absl::Status ResolveBf16GemmBackend(Bf16GemmBackend* resolved) {
  const int override = g_backend_override.load();
  const Bf16GemmBackend requested =
      override >= 0 ? static_cast<Bf16GemmBackend>(override) : absl::GetFlag(FLAGS_bf16_gemm);
  switch (requested) {
    case Bf16GemmBackend::kAuto:
      *resolved = OneDnnBf16Available() ? Bf16GemmBackend::kOneDnn : Bf16GemmBackend::kFallback;
      return absl::OkStatus();
    case Bf16GemmBackend::kOneDnn:
      if (!OneDnnBf16Available()) {
        return absl::FailedPreconditionError(
            absl::StrCat("--bf16_gemm=onednn, but oneDNN has no native bf16 GEMM on this CPU (",
                         OneDnnBf16Description(), "); use --bf16_gemm=auto or fallback"));
      }
      *resolved = Bf16GemmBackend::kOneDnn;
      return absl::OkStatus();
    case Bf16GemmBackend::kFallback:
      *resolved = Bf16GemmBackend::kFallback;
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown bf16 GEMM backend");
}

absl::Status GemmBf16(const Bf16GemmArgs& args, ThreadPool* pool) {
  Bf16GemmBackend backend;
  RETURN_IF_ERROR(ResolveBf16GemmBackend(&backend));
  if (backend == Bf16GemmBackend::kOneDnn) return GemmOneDnn(args, pool);
  return GemmFallback(args, pool);
}

}  // namespace ps::kernels_internal
