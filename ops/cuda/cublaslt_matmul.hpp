#pragma once
// cuBLASLt matmuls with row-major semantics and epilogues, as used by the
// scheduler. C[m,n] = alpha * op(A) op(B) + beta * C (row-major, like the IR and
// ops/cpu's ref::matmul); D may alias C (fused SGD: C = D = W, alpha = -lr,
// beta = 1). alpha/beta are read from DEVICE memory so a learning-rate change
// needs no graph re-capture. Internally the row-major product is issued as the
// column-major product C^T = op(B)^T op(A)^T.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "ops/cuda/cublaslt_configs.hpp"
#include "ops/cuda/cuda_resources.hpp"

namespace sg::cuda {

enum class ElemType : std::uint8_t { f16, f32, bf16 };
const char* elem_type_name(ElemType t);
enum class Accumulate : std::uint8_t { f16, f32 };  // cuBLAS compute type 16F or 32F

enum class Epilogue : std::uint8_t {
  none,
  bias,           // D = AB + bias[n]
  relu_bias,      // D = relu(AB + bias), no aux
  relu_aux_bias,  // D = relu(AB + bias), writes the ReLU bit-mask to aux
  drelu,          // D = AB * relu'(aux)  (aux from a relu_aux_bias of the same [m,n] shape)
  // cuBLASLt's GELU is the tanh approximation (ref::gelu_tanh, the gelu_tanh op).
  gelu_bias,      // D = gelu_tanh(AB + bias), no aux
  gelu_aux_bias,  // D = gelu_tanh(AB + bias), writes the pre-activation AB + bias to aux
  dgelu,          // D = AB * gelu_tanh'(aux)  (aux: a gelu_aux_bias's pre-activation, [m,n] like D)
};

struct MatmulShape {
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  ElemType ab_type = ElemType::f16;  // A and B
  ElemType cd_type = ElemType::f16;  // C and D (f32 for fused SGD into fp32 master weights)
  Accumulate accumulate = Accumulate::f32;
  Epilogue epilogue = Epilogue::none;
  // beta != 0 when it runs (the fused SGD update reads W as C): autotuning
  // times the candidates with the C read, which costs as much as the D write.
  bool reads_c = false;

  auto key() const { return std::tuple(m, n, k, trans_a, trans_b, ab_type, cd_type, accumulate, epilogue, reads_c); }
  bool operator<(const MatmulShape& o) const { return key() < o.key(); }
  std::string describe() const;
};

// Scale type follows the compute type: alpha/beta point to __half for
// Accumulate::f16 and to float for Accumulate::f32. f16 accumulate requires
// cd_type == f16 (cuBLASLt has no 16F compute with 32F output); bf16 operands
// accumulate in f32 only.
class LtHandle {
 public:
  LtHandle();
  ~LtHandle();
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return h_; }
  // One workspace for every matmul of this handle: launches on one stream
  // never overlap, so they can share it.
  void* workspace() const { return workspace_.data(); }
  std::size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  cublasLtHandle_t h_ = nullptr;
  DeviceBuffer workspace_;
};

// Bytes of the ReLU bit-mask for an [m,n] row-major output, and its leading
// dimension in elements (cuBLASLt wants it a multiple of 128).
std::int64_t relu_aux_ld(std::int64_t n_cols);
std::size_t relu_aux_bytes(std::int64_t m_rows, std::int64_t n_cols);
// The GELU epilogues' aux is the pre-activation itself, row-major [m,n] of
// cd_type with leading dimension n, which cuBLASLt wants a multiple of 8.
bool gelu_aux_fits(std::int64_t n_cols);

// Autotuning searches shapes of at least this many multiply-adds (4096 x
// 4096 x 256, above ~15 us a run). Below it the ranking measured in
// isolation did not carry into the training step: at widths 256-1024 the
// tuned picks moved steps by -3 to +8 us from run to run, against the
// heuristic's steady pick (docs/performance.md section 23).
inline constexpr double kAutotuneMinMacs = 4096.0 * 4096.0 * 256.0;

// A long reduction into few output tiles (a CNN's first linear layer after
// its flatten: 128 x 128 outputs over K = 3136) leaves most multiprocessors
// idle unless the reduction is split: autotune times such shapes at any size,
// the heuristic's algorithms split 2-16 ways among the candidates. Not an
// update that reads C (the fused SGD form, whose K is the batch): split
// partials with beta != 0 are not checked against the CPU reference here.
bool long_reduction(const MatmulShape& shape);

class LtMatmul {
 public:
  // Chooses the algorithm by heuristic; when `autotune` is set, times the
  // heuristic's candidates and the other configurations of their algorithm ids
  // (cublaslt_configs.hpp) once on scratch buffers and keeps the fastest
  // (cached per shape in the process-wide AlgoCache). Shapes below
  // `autotune_min_macs` multiply-adds keep the heuristic's pick, unless they
  // are a long reduction and `split_k` is set (its split-K configurations
  // timed against it).
  LtMatmul(const LtHandle& handle, MatmulShape shape, bool autotune, cudaStream_t stream,
           double autotune_min_macs = kAutotuneMinMacs, bool split_k = true);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // bias: epilogues bias/relu_bias/relu_aux_bias/gelu_bias/gelu_aux_bias (length n, type cd_type).
  // aux: relu_aux_bias (written) and drelu (read), relu_aux_bytes(m, n) bytes;
  // gelu_aux_bias (written) and dgelu (read), the [m,n] pre-activation of cd_type.
  void run(const void* a, const void* b, const void* c, void* d, const void* alpha_dev,
           const void* beta_dev, const void* bias, void* aux, cudaStream_t stream) const;

  const MatmulShape& shape() const { return shape_; }
  // e.g. "cuBLASLt algorithm 21, tile 20, stages 8, split-K 4 (fastest of 12 timed)"
  std::string label() const;

 private:
  void create_descriptors();
  std::vector<cublasLtMatmulAlgo_t> heuristic_candidates() const;
  void choose_algorithm(bool autotune, bool split_k, cudaStream_t stream);

  const LtHandle& handle_;
  MatmulShape shape_;
  double autotune_min_macs_;
  LtDescriptors desc_;
  cublasLtMatmulAlgo_t algo_{};
  std::string chosen_how_;  // how algo_ was chosen, for label()
};

}  // namespace sg::cuda
