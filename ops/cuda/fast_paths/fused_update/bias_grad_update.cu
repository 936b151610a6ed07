// The bias gradient's column sums straight into the update rule
// (bias_grad_update.hpp). Adam's launch is the one issue 21 measured: the same
// chains, geometry and arithmetic (bits).
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/fused_update/bias_grad_update.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/update_rules/all_rules.cuh"
#include "ops/cuda/update_rules/each_slot.cuh"

namespace sg::cuda {
namespace {

// Column sums in 8 (up to 255 rows) or 32 chains, added in chain order, then
// the update of bias[col] by thread row 0.
template <int Chains, class Rule, typename W, typename G>
__global__ void bias_grad_update_kernel(const G* dy, std::int64_t rows, std::int64_t cols, W* bias, StateSlots state,
                                        const UpdateScalars* scalars, const std::int32_t* step, HyperOf<Rule> hyper) {
  constexpr int S = Rule::kStates;
  wait_for_previous_kernel();  // (a dependent launch: dy comes from the kernel before)
  allow_next_kernel_to_start();  // as bias_grad_sgd's column sums do in the same place of the step
  __shared__ float partial[Chains][33];
  const std::int64_t col = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.f;
  if (col < cols)
    for (std::int64_t r = threadIdx.y; r < rows; r += Chains) acc += to_float(dy[r * cols + col]);
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float total = 0.f;
  for (int y = 0; y < Chains; ++y) total += partial[y][threadIdx.x];
  const Rule rule(hyper, scalars->lr, step, nullptr);
  float st[S];
  each_slot<Rule>(hyper, [&](auto slot) { st[slot.value] = state.slot[slot.value][col]; });
  bias[col] = from_float<W>(rule(to_float(bias[col]), total, [&](int s) -> float& { return st[s]; }));
  each_slot<Rule>(hyper, [&](auto slot) { state.slot[slot.value][col] = st[slot.value]; });
}

}  // namespace

template <class Rule, typename W, typename G>
void launch_bias_grad_update(const G* dy, std::int64_t rows, std::int64_t cols, W* bias, StateSlots state,
                             const UpdateScalars* scalars, const std::int32_t* step, HyperOf<Rule> hyper,
                             cudaStream_t stream, bool dependent) {
  const unsigned blocks = static_cast<unsigned>((cols + 31) / 32);
  if (rows >= 256)
    launch_dependent(bias_grad_update_kernel<32, Rule, W, G>, {dim3(blocks), dim3(32, 32)}, stream, dependent, dy,
                     rows, cols, bias, state, scalars, step, hyper);
  else
    launch_dependent(bias_grad_update_kernel<8, Rule, W, G>, {dim3(blocks), dim3(32, 8)}, stream, dependent, dy, rows,
                     cols, bias, state, scalars, step, hyper);
}

#define SG_BIAS_GRAD_UPDATE(Rule, W, G)                                                                             \
  template void launch_bias_grad_update<Rule, W, G>(const G*, std::int64_t, std::int64_t, W*, StateSlots,           \
                                                    const UpdateScalars*, const std::int32_t*, HyperOf<Rule>,       \
                                                    cudaStream_t, bool);
#define SG_BIAS_GRAD_UPDATE_TYPES(Rule)               \
  SG_BIAS_GRAD_UPDATE(Rule, float, float)             \
  SG_BIAS_GRAD_UPDATE(Rule, __half, __half)           \
  SG_BIAS_GRAD_UPDATE(Rule, float, __half)            \
  SG_BIAS_GRAD_UPDATE(Rule, __nv_bfloat16, __nv_bfloat16) \
  SG_BIAS_GRAD_UPDATE(Rule, float, __nv_bfloat16)
SG_FOR_EACH_UPDATE_RULE(SG_BIAS_GRAD_UPDATE_TYPES)
#undef SG_BIAS_GRAD_UPDATE_TYPES
#undef SG_BIAS_GRAD_UPDATE

}  // namespace sg::cuda
