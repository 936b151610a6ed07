#include "ops/cuda/cublaslt_matmul.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/gpu_timing.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;  // cuBLASLt's advice for Hopper
constexpr int kCandidates = 8;

cudaDataType_t cuda_type(ElemType t) {
  switch (t) {
    case ElemType::f16: return CUDA_R_16F;
    case ElemType::bf16: return CUDA_R_16BF;
    case ElemType::f32: return CUDA_R_32F;
  }
  return CUDA_R_32F;
}
std::size_t elem_bytes(ElemType t) { return t == ElemType::f32 ? 4 : 2; }
std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::relu_bias: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case Epilogue::relu_aux_bias: return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case Epilogue::drelu: return CUBLASLT_EPILOGUE_DRELU;
    case Epilogue::gelu_bias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool has_bias(Epilogue e) {
  return e == Epilogue::bias || e == Epilogue::relu_bias || e == Epilogue::relu_aux_bias || e == Epilogue::gelu_bias ||
         e == Epilogue::gelu_aux_bias;
}
bool has_relu_aux(Epilogue e) { return e == Epilogue::relu_aux_bias || e == Epilogue::drelu; }
bool has_gelu_aux(Epilogue e) { return e == Epilogue::gelu_aux_bias || e == Epilogue::dgelu; }
bool has_aux(Epilogue e) { return has_relu_aux(e) || has_gelu_aux(e); }

template <typename T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  SG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value));
}

// Algorithms chosen by timing, per shape, for the whole process.
class AlgoCache {
 public:
  static AlgoCache& instance() {
    static AlgoCache cache;
    return cache;
  }
  bool find(const MatmulShape& s, cublasLtMatmulAlgo_t& algo) {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(s);
    if (it == entries_.end()) return false;
    algo = it->second;
    return true;
  }
  void store(const MatmulShape& s, const cublasLtMatmulAlgo_t& algo) {
    std::lock_guard lock(mutex_);
    entries_[s] = algo;
  }

 private:
  std::mutex mutex_;
  std::map<MatmulShape, cublasLtMatmulAlgo_t> entries_;
};

// Operands for timing candidates, filled with random values (never zeros: the
// tensor cores draw less power on zeros and clock higher than in training).
struct TimingScratch {
  DeviceBuffer a, b, d, bias, aux, scalars;
  const void* alpha = nullptr;
  const void* beta = nullptr;

  TimingScratch(const MatmulShape& s, cudaStream_t stream)
      : a(std::size_t(s.m * s.k) * elem_bytes(s.ab_type)),
        b(std::size_t(s.k * s.n) * elem_bytes(s.ab_type)),
        d(std::size_t(s.m * s.n) * elem_bytes(s.cd_type)),
        bias(std::size_t(s.n) * elem_bytes(s.cd_type)),
        aux(has_gelu_aux(s.epilogue) ? std::size_t(s.m * s.n) * elem_bytes(s.cd_type) : relu_aux_bytes(s.m, s.n)),
        scalars(16) {
    fill(a, s.ab_type, 1, stream);
    fill(b, s.ab_type, 2, stream);
    fill(d, s.cd_type, 3, stream);
    fill(bias, s.cd_type, 4, stream);
    SG_CUDA_CHECK(cudaMemsetAsync(aux.data(), 0x55, aux.bytes(), stream));
    // The fused SGD's scalars where the matmul reads C (a small step, so
    // repeated runs keep W bounded), else alpha = 1, beta = 0.
    const float alpha_value = s.reads_c ? -1e-4f : 1.f, beta_value = s.reads_c ? 1.f : 0.f;
    const std::array<float, 2> f32{alpha_value, beta_value};
    const std::array<__half, 2> f16{__float2half(alpha_value), __float2half(beta_value)};
    const bool half_scale = s.accumulate == Accumulate::f16;
    if (half_scale) scalars.upload(f16.data(), sizeof f16);
    else scalars.upload(f32.data(), sizeof f32);
    alpha = scalars.data();
    beta = scalars.as<char>() + (half_scale ? 2 : 4);
  }

  static void fill(DeviceBuffer& buf, ElemType t, std::uint64_t seed, cudaStream_t stream) {
    const auto n = static_cast<std::int64_t>(buf.bytes() / elem_bytes(t));
    if (t == ElemType::f16) launch_fill_uniform(buf.as<__half>(), n, seed, -1.f, 1.f, stream);
    else if (t == ElemType::bf16) launch_fill_uniform(buf.as<__nv_bfloat16>(), n, seed, -1.f, 1.f, stream);
    else launch_fill_uniform(buf.as<float>(), n, seed, -1.f, 1.f, stream);
  }
};

// Times cuBLASLt algorithms for one descriptor on a TimingScratch.
class CandidateTimer {
 public:
  CandidateTimer(const LtHandle& handle, const LtDescriptors& desc, const MatmulShape& shape, cudaStream_t stream)
      : handle_(handle), desc_(desc), scratch_(shape, stream), stream_(stream) {
    // The bias and aux pointers are descriptor attributes: point them at the
    // scratch (LtMatmul::run sets the real ones before every launch).
    if (has_bias(shape.epilogue)) set_attr(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, scratch_.bias.data());
    if (has_aux(shape.epilogue)) set_attr(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, scratch_.aux.data());
  }

  // Mean microseconds per run over `runs` back-to-back runs, GPU time alone
  // (queued behind a busy-wait: gpu_timing.hpp says why); infinity where
  // cuBLASLt refuses to launch the algorithm.
  float mean_us(const cublasLtMatmulAlgo_t& algo, int runs) const {
    enqueue_busy_wait(stream_, 20.0 + 10.0 * runs);  // cuBLASLt enqueues a run in a few us
    start_.record(stream_);
    for (int i = 0; i < runs; ++i) {
      const auto status = cublasLtMatmul(handle_.get(), desc_.op, scratch_.alpha, scratch_.b.data(), desc_.a,
                                         scratch_.a.data(), desc_.b, scratch_.beta, scratch_.d.data(), desc_.c,
                                         scratch_.d.data(), desc_.c, &algo, handle_.workspace(),
                                         handle_.workspace_bytes(), stream_);
      if (status != CUBLAS_STATUS_SUCCESS) return std::numeric_limits<float>::infinity();
    }
    stop_.record(stream_);
    stop_.synchronize();
    return 1000.f * Event::elapsed_ms(start_, stop_) / static_cast<float>(runs);
  }

  // The median of 5 x 10 runs.
  float median_us(const cublasLtMatmulAlgo_t& algo) const {
    std::array<float, 5> times{};
    for (float& t : times) t = mean_us(algo, 10);
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

 private:
  const LtHandle& handle_;
  const LtDescriptors& desc_;
  TimingScratch scratch_;
  cudaStream_t stream_;
  Event start_, stop_;
};

// Two rounds: every candidate once (3 runs after a warm-up run), then the 8
// fastest and the heuristic's first pick (candidates[0]) again, their
// medians of 5 x 10 runs compared. Candidates cuBLASLt refuses are skipped.
cublasLtMatmulAlgo_t fastest(const std::vector<cublasLtMatmulAlgo_t>& candidates, const CandidateTimer& timer,
                             const MatmulShape& shape) {
  constexpr std::size_t kFinalists = 8;
  std::vector<std::pair<float, std::size_t>> first_round;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (!std::isfinite(timer.mean_us(candidates[i], 1))) continue;  // a warm-up run; skips what cuBLASLt refuses
    first_round.emplace_back(timer.mean_us(candidates[i], 3), i);
  }
  if (first_round.empty()) throw CudaError("cuBLASLt launched none of its candidates for " + shape.describe());
  std::sort(first_round.begin(), first_round.end());
  std::vector<std::size_t> finalists{0};
  for (std::size_t r = 0; r < first_round.size() && finalists.size() <= kFinalists; ++r)
    if (first_round[r].second != 0) finalists.push_back(first_round[r].second);

  std::size_t best = 0;
  float best_us = std::numeric_limits<float>::infinity();
  for (std::size_t i : finalists) {
    const float us = timer.median_us(candidates[i]);
    if (us < best_us) {
      best_us = us;
      best = i;
    }
  }
  return candidates[best];
}

}  // namespace

const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::f16: return "f16";
    case ElemType::bf16: return "bf16";
    case ElemType::f32: return "f32";
  }
  return "?";
}

std::string MatmulShape::describe() const {
  static constexpr const char* kEpilogues[] = {"none",      "bias",          "relu_bias", "relu_aux_bias",
                                               "drelu",     "gelu_bias",     "gelu_aux_bias", "dgelu"};
  return fmt::format("[{}x{}x{}] {}{} ab={} cd={} acc={} epilogue={}{}", m, n, k, trans_a ? "T" : "N",
                     trans_b ? "T" : "N", elem_type_name(ab_type), elem_type_name(cd_type),
                     accumulate == Accumulate::f16 ? "f16" : "f32",
                     kEpilogues[static_cast<int>(epilogue)], reads_c ? " reads C" : "");
}

bool long_reduction(const MatmulShape& s) {
  return s.k >= 4 * std::max(s.m, s.n) && s.m * s.n <= 512 * 512 && !s.reads_c;
}

LtHandle::LtHandle() : workspace_(kWorkspaceBytes) { SG_CUBLAS_CHECK(cublasLtCreate(&h_)); }
LtHandle::~LtHandle() {
  if (h_) cublasLtDestroy(h_);
}

std::int64_t relu_aux_ld(std::int64_t n_cols) { return round_up(n_cols, 128); }
std::size_t relu_aux_bytes(std::int64_t m_rows, std::int64_t n_cols) {
  return static_cast<std::size_t>(relu_aux_ld(n_cols) / 8 * m_rows);
}
bool gelu_aux_fits(std::int64_t n_cols) { return n_cols % 8 == 0; }

LtMatmul::LtMatmul(const LtHandle& handle, MatmulShape shape, bool autotune, cudaStream_t stream,
                   double autotune_min_macs, bool split_k)
    : handle_(handle), shape_(shape), autotune_min_macs_(autotune_min_macs) {
  if (shape_.accumulate == Accumulate::f16 && shape_.cd_type != ElemType::f16)
    throw CudaError("cuBLASLt has no fp16 accumulation into fp32 outputs: " + shape_.describe());
  if (shape_.accumulate == Accumulate::f16 && shape_.ab_type == ElemType::bf16)
    throw CudaError("cuBLASLt accumulates bf16 operands in fp32 only: " + shape_.describe());
  create_descriptors();
  choose_algorithm(autotune, split_k, stream);
}

LtMatmul::~LtMatmul() {
  for (auto layout : {desc_.a, desc_.b, desc_.c})
    if (layout) cublasLtMatrixLayoutDestroy(layout);
  if (desc_.op) cublasLtMatmulDescDestroy(desc_.op);
}

// The row-major C[m,n] = op(A) op(B) is the column-major C^T[n,m] = op(B)^T op(A)^T:
// cuBLASLt's first operand is our B (transposed iff trans_b), its second our A.
void LtMatmul::create_descriptors() {
  const auto& s = shape_;
  const bool f16 = s.accumulate == Accumulate::f16;
  SG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_.op, f16 ? CUBLAS_COMPUTE_16F : CUBLAS_COMPUTE_32F,
                                           f16 ? CUDA_R_16F : CUDA_R_32F));
  const cublasOperation_t op_first = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(desc_.op, CUBLASLT_MATMUL_DESC_TRANSA, op_first);
  set_attr(desc_.op, CUBLASLT_MATMUL_DESC_TRANSB, op_second);
  set_attr(desc_.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_DEVICE);
  set_attr(desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(s.epilogue));
  if (has_bias(s.epilogue)) set_attr(desc_.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(s.cd_type));
  if (has_relu_aux(s.epilogue)) set_attr(desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, relu_aux_ld(s.n));
  if (has_gelu_aux(s.epilogue)) {
    if (!gelu_aux_fits(s.n)) throw CudaError("cuBLASLt GELU aux needs n a multiple of 8: " + s.describe());
    set_attr(desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, s.n);  // the pre-activation [m,n], row-major
  }

  const auto ab = cuda_type(s.ab_type);
  // first operand: our B, column-major [n,k] (no trans) or [k,n] (trans)
  const std::int64_t first_rows = s.trans_b ? s.k : s.n, first_cols = s.trans_b ? s.n : s.k;
  SG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc_.a, ab, first_rows, first_cols, first_rows));
  // second operand: our A, column-major [k,m] (no trans) or [m,k] (trans)
  const std::int64_t second_rows = s.trans_a ? s.m : s.k, second_cols = s.trans_a ? s.k : s.m;
  SG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc_.b, ab, second_rows, second_cols, second_rows));
  SG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc_.c, cuda_type(s.cd_type), s.n, s.m, s.n));
}

std::vector<cublasLtMatmulAlgo_t> LtMatmul::heuristic_candidates() const {
  cublasLtMatmulPreference_t pref = nullptr;
  SG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = handle_.workspace_bytes();
  SG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> results{};
  int returned = 0;
  const auto status = cublasLtMatmulAlgoGetHeuristic(handle_.get(), desc_.op, desc_.a, desc_.b, desc_.c, desc_.c,
                                                     pref, kCandidates, results.data(), &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  SG_CUBLAS_CHECK(status);
  if (returned == 0) throw CudaError("cuBLASLt found no algorithm for " + shape_.describe());
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < returned; ++i) algos.push_back(results[static_cast<std::size_t>(i)].algo);
  return algos;
}

void LtMatmul::choose_algorithm(bool autotune, bool split_k, cudaStream_t stream) {
  chosen_how_ = "timed earlier in this process";
  if (AlgoCache::instance().find(shape_, algo_)) return;
  const auto heuristic = heuristic_candidates();
  algo_ = heuristic.front();
  chosen_how_ = autotune ? "the heuristic's first pick: too small to time" : "the heuristic's first pick";
  if (!autotune) return;
  const bool large = double(shape_.m) * double(shape_.n) * double(shape_.k) >= autotune_min_macs_;
  const bool split = split_k && long_reduction(shape_);
  if (!large && !split) return;
  std::vector<cublasLtMatmulAlgo_t> candidates =
      large ? candidate_configs(handle_.get(), desc_, heuristic, handle_.workspace_bytes()) : heuristic;
  if (split)
    for (const auto& algo : split_k_configs(handle_.get(), desc_, heuristic, handle_.workspace_bytes()))
      candidates.push_back(algo);
  const CandidateTimer timer(handle_, desc_, shape_, stream);
  algo_ = fastest(candidates, timer, shape_);
  chosen_how_ = fmt::format("fastest of {} timed{}", candidates.size(), split ? ", split-K among them" : "");
  AlgoCache::instance().store(shape_, algo_);
}

std::string LtMatmul::label() const { return fmt::format("cuBLASLt {} ({})", describe_config(algo_), chosen_how_); }

void LtMatmul::run(const void* a, const void* b, const void* c, void* d, const void* alpha_dev, const void* beta_dev,
                   const void* bias, void* aux, cudaStream_t stream) const {
  if (has_bias(shape_.epilogue)) set_attr(desc_.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (has_aux(shape_.epilogue)) set_attr(desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  // Our B is cuBLASLt's first operand, our A its second (see create_descriptors).
  SG_CUBLAS_CHECK(cublasLtMatmul(handle_.get(), desc_.op, alpha_dev, b, desc_.a, a, desc_.b, beta_dev, c, desc_.c,
                                 d, desc_.c, &algo_, handle_.workspace(), handle_.workspace_bytes(), stream));
}

}  // namespace sg::cuda
