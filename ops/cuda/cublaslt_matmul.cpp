#include "ops/cuda/cublaslt_matmul.hpp"

#include <algorithm>
#include <array>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;  // cuBLASLt's advice for Hopper
constexpr int kCandidates = 8;

cudaDataType_t cuda_type(ElemType t) { return t == ElemType::f16 ? CUDA_R_16F : CUDA_R_32F; }
std::size_t elem_bytes(ElemType t) { return t == ElemType::f16 ? 2 : 4; }
std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::relu_bias: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case Epilogue::relu_aux_bias: return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case Epilogue::drelu: return CUBLASLT_EPILOGUE_DRELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool has_bias(Epilogue e) { return e == Epilogue::bias || e == Epilogue::relu_bias || e == Epilogue::relu_aux_bias; }
bool has_aux(Epilogue e) { return e == Epilogue::relu_aux_bias || e == Epilogue::drelu; }

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
  bool find(const MatmulShape& s, cublasLtMatmulAlgo_t& algo, int& rank) {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(s);
    if (it == entries_.end()) return false;
    algo = it->second.first;
    rank = it->second.second;
    return true;
  }
  void store(const MatmulShape& s, const cublasLtMatmulAlgo_t& algo, int rank) {
    std::lock_guard lock(mutex_);
    entries_[s] = {algo, rank};
  }

 private:
  std::mutex mutex_;
  std::map<MatmulShape, std::pair<cublasLtMatmulAlgo_t, int>> entries_;
};

}  // namespace

std::string MatmulShape::describe() const {
  static constexpr const char* kEpilogues[] = {"none", "bias", "relu_bias", "relu_aux_bias", "drelu"};
  return fmt::format("[{}x{}x{}] {}{} ab={} cd={} acc={} epilogue={}", m, n, k, trans_a ? "T" : "N", trans_b ? "T" : "N",
                     ab_type == ElemType::f16 ? "f16" : "f32", cd_type == ElemType::f16 ? "f16" : "f32",
                     accumulate == Accumulate::f16 ? "f16" : "f32", kEpilogues[static_cast<int>(epilogue)]);
}

LtHandle::LtHandle() : workspace_(kWorkspaceBytes) { SG_CUBLAS_CHECK(cublasLtCreate(&h_)); }
LtHandle::~LtHandle() {
  if (h_) cublasLtDestroy(h_);
}

std::int64_t relu_aux_ld(std::int64_t n_cols) { return round_up(n_cols, 128); }
std::size_t relu_aux_bytes(std::int64_t m_rows, std::int64_t n_cols) {
  return static_cast<std::size_t>(relu_aux_ld(n_cols) / 8 * m_rows);
}

LtMatmul::LtMatmul(const LtHandle& handle, MatmulShape shape, bool autotune, cudaStream_t stream)
    : handle_(handle), shape_(shape) {
  if (shape_.accumulate == Accumulate::f16 && shape_.cd_type != ElemType::f16)
    throw CudaError("cuBLASLt has no fp16 accumulation into fp32 outputs: " + shape_.describe());
  create_descriptors();
  choose_algorithm(autotune, stream);
}

LtMatmul::~LtMatmul() {
  for (auto layout : {a_layout_, b_layout_, c_layout_})
    if (layout) cublasLtMatrixLayoutDestroy(layout);
  if (op_desc_) cublasLtMatmulDescDestroy(op_desc_);
}

// The row-major C[m,n] = op(A) op(B) is the column-major C^T[n,m] = op(B)^T op(A)^T:
// cuBLASLt's first operand is our B (transposed iff trans_b), its second our A.
void LtMatmul::create_descriptors() {
  const auto& s = shape_;
  const bool f16 = s.accumulate == Accumulate::f16;
  SG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_desc_, f16 ? CUBLAS_COMPUTE_16F : CUBLAS_COMPUTE_32F,
                                           f16 ? CUDA_R_16F : CUDA_R_32F));
  const cublasOperation_t op_first = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(op_desc_, CUBLASLT_MATMUL_DESC_TRANSA, op_first);
  set_attr(op_desc_, CUBLASLT_MATMUL_DESC_TRANSB, op_second);
  set_attr(op_desc_, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_DEVICE);
  set_attr(op_desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(s.epilogue));
  if (has_bias(s.epilogue)) set_attr(op_desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(s.cd_type));
  if (has_aux(s.epilogue)) set_attr(op_desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, relu_aux_ld(s.n));

  const auto ab = cuda_type(s.ab_type);
  // first operand: our B, column-major [n,k] (no trans) or [k,n] (trans)
  const std::int64_t first_rows = s.trans_b ? s.k : s.n, first_cols = s.trans_b ? s.n : s.k;
  SG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout_, ab, first_rows, first_cols, first_rows));
  // second operand: our A, column-major [k,m] (no trans) or [m,k] (trans)
  const std::int64_t second_rows = s.trans_a ? s.m : s.k, second_cols = s.trans_a ? s.k : s.m;
  SG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_layout_, ab, second_rows, second_cols, second_rows));
  SG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_layout_, cuda_type(s.cd_type), s.n, s.m, s.n));
}

void LtMatmul::choose_algorithm(bool autotune, cudaStream_t stream) {
  if (AlgoCache::instance().find(shape_, algo_, chosen_rank_)) return;
  cublasLtMatmulPreference_t pref = nullptr;
  SG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = handle_.workspace_bytes();
  SG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> results{};
  int returned = 0;
  const auto status = cublasLtMatmulAlgoGetHeuristic(handle_.get(), op_desc_, a_layout_, b_layout_, c_layout_, c_layout_,
                                                     pref, kCandidates, results.data(), &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  SG_CUBLAS_CHECK(status);
  if (returned == 0) throw CudaError("cuBLASLt found no algorithm for " + shape_.describe());
  algo_ = results[0].algo;
  chosen_rank_ = 0;
  if (autotune && returned > 1) {
    // Time each candidate on scratch operands filled with random values (never zeros).
    const auto& s = shape_;
    DeviceBuffer a(std::size_t(s.m * s.k) * elem_bytes(s.ab_type)), b(std::size_t(s.k * s.n) * elem_bytes(s.ab_type));
    DeviceBuffer d(std::size_t(s.m * s.n) * elem_bytes(s.cd_type)), bias(std::size_t(s.n) * elem_bytes(s.cd_type));
    DeviceBuffer aux(relu_aux_bytes(s.m, s.n)), scalars(16);
    auto fill = [&](DeviceBuffer& buf, ElemType t, std::uint64_t seed) {
      const auto n = static_cast<std::int64_t>(buf.bytes() / elem_bytes(t));
      if (t == ElemType::f16) launch_fill_uniform(buf.as<__half>(), n, seed, -1.f, 1.f, stream);
      else launch_fill_uniform(buf.as<float>(), n, seed, -1.f, 1.f, stream);
    };
    fill(a, s.ab_type, 1);
    fill(b, s.ab_type, 2);
    fill(d, s.cd_type, 3);
    fill(bias, s.cd_type, 4);
    SG_CUDA_CHECK(cudaMemsetAsync(aux.data(), 0x55, aux.bytes(), stream));
    // alpha = 1, beta = 0 in the scale type
    const std::array<float, 2> f32{1.f, 0.f};
    const std::array<__half, 2> f16{__float2half(1.f), __float2half(0.f)};
    if (s.accumulate == Accumulate::f16) scalars.upload(f16.data(), sizeof f16);
    else scalars.upload(f32.data(), sizeof f32);
    const char* base = scalars.as<char>();
    const void* alpha = base;
    const void* beta = base + (s.accumulate == Accumulate::f16 ? 2 : 4);
    Event start, stop;
    float best_ms = 0;
    for (int i = 0; i < returned; ++i) {
      algo_ = results[static_cast<std::size_t>(i)].algo;
      std::vector<float> times;
      for (int rep = 0; rep < 6; ++rep) {
        start.record(stream);
        for (int it = 0; it < 10; ++it)
          run(a.data(), b.data(), d.data(), d.data(), alpha, beta, bias.data(), aux.data(), stream);
        stop.record(stream);
        stop.synchronize();
        if (rep > 0) times.push_back(Event::elapsed_ms(start, stop));  // the first repeat warms up
      }
      std::sort(times.begin(), times.end());
      const float ms = times[times.size() / 2];
      if (i == 0 || ms < best_ms) {
        best_ms = ms;
        chosen_rank_ = i;
      }
    }
    algo_ = results[static_cast<std::size_t>(chosen_rank_)].algo;
    AlgoCache::instance().store(shape_, algo_, chosen_rank_);
  }
}

void LtMatmul::run(const void* a, const void* b, const void* c, void* d, const void* alpha_dev, const void* beta_dev,
                   const void* bias, void* aux, cudaStream_t stream) const {
  if (has_bias(shape_.epilogue)) set_attr(op_desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (has_aux(shape_.epilogue)) set_attr(op_desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  // Our B is cuBLASLt's first operand, our A its second (see create_descriptors).
  SG_CUBLAS_CHECK(cublasLtMatmul(handle_.get(), op_desc_, alpha_dev, b, a_layout_, a, b_layout_, beta_dev, c, c_layout_,
                                 d, c_layout_, &algo_, handle_.workspace(), handle_.workspace_bytes(), stream));
}

}  // namespace sg::cuda
