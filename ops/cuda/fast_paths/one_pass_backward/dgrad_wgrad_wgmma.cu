// One pass over W for a hidden layer's dgrad and its SGD update at batch 256
// (Hopper: TMA copies, wgmma). Each block owns 64 columns of W[N, K] and
// walks its rows 64 at a time; every W tile is read from DRAM once, used for
//   dX[:, cols] += dY[:, rows] W[rows, cols]          (warpgroup 1)
//   W[rows, cols] = sgd(W, dY[:, rows]^T X[:, cols])  (warpgroup 2, 128 rows at a time)
// and written back once. Two cuBLASLt passes read W twice (docs/performance.md
// section 24). The block's dX columns are complete at the end: no workspace,
// and the previous layer's bias gradient (their column sums) comes free.
// Every block reads all of dY (4 MB at N = 8192) from L2, four times the W
// bytes it streams: blocks of adjacent strips run as clusters of two that
// each copy half of every dY tile into both blocks' shared memory (TMA
// multicast), so L2 serves dY once per pair (docs/performance.md section 27).
// dX goes through the activation's backward (activation.cuh) at the end: it
// reads the X tile (relu, tanh, sigmoid: X is the activation's output) or, for
// gelu, gelu_tanh and silu, a tile of the pre-activation Z that the loader
// copies into the first slot the pipeline frees for good (no smem to spare).
#include <fmt/format.h>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad_kernels.hpp"
#include "ops/cuda/mma_fragments.cuh"
#include "ops/cuda/sgd_step.cuh"
#include "ops/cuda/tensor_map.hpp"
#include "ops/cuda/tma.cuh"
#include "ops/cuda/wgmma.cuh"

namespace sg::cuda::one_pass {
namespace {

constexpr int kBatch = 256;
constexpr int kCols = 64;                         // columns of W per block (one 128-byte swizzle row)
constexpr int kRows = 64;                         // rows of W per pipeline slot
constexpr int kSlots = 4;                         // slots in flight; the update takes them in pairs
constexpr int kWTileBytes = kRows * kCols * 2;    // 8 KB
constexpr int kDyTileBytes = kBatch * kRows * 2;  // 32 KB: dY[:, rows]
constexpr int kSlotBytes = kWTileBytes + kDyTileBytes;
constexpr int kXTileBytes = kBatch * kCols * 2;        // 32 KB: X[:, cols], for the whole launch
constexpr int kOutTileBytes = 2 * kRows * kCols * 2;   // 16 KB: updated W rows of a slot pair
constexpr int kBarrierBytes = 1024;
constexpr int kSmemBytes = kSlots * kSlotBytes + kXTileBytes + kOutTileBytes + kBarrierBytes + 1024;  // + alignment
constexpr int kThreads = 384;  // warpgroup 0 loads, 1 runs the dgrad, 2 the update

// Named barriers (0 is __syncthreads).
constexpr int kDgradGroupSync = 1, kUpdateGroupSync = 2, kBothGroupsSync = 3;

struct TileMaps {
  CUtensorMap w;      // W [N, K], boxes of kRows rows (loads)
  CUtensorMap w_out;  // W [N, K], boxes of 2 * kRows rows (stores)
  CUtensorMap dy;     // dY [256, N], boxes of the 256 / DyShare::blocks rows one block copies
  CUtensorMap x;      // X [256, K]
  CUtensorMap dx;     // dX [256, K]
  CUtensorMap z;      // the pre-activation Z [256, K] (activations whose backward reads it; else X again)
};

struct SharedLayout {
  unsigned char* slots;  // kSlots x (W tile, dY tile)
  unsigned char* x;
  unsigned char* out;
  std::uint64_t* full;   // [kSlots]: a slot's bytes have landed
  std::uint64_t* empty;  // [kSlots]: both consumers are done with a slot
  std::uint64_t* x_ready;
  std::uint64_t* z_ready;  // the Z tile has landed (gelu, gelu_tanh, silu)

  __device__ explicit SharedLayout(unsigned char* raw) {
    // 128-byte swizzled tiles must start on 1024-byte boundaries.
    slots = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(raw) + 1023) & ~std::uintptr_t(1023));
    x = slots + kSlots * kSlotBytes;
    out = x + kXTileBytes;
    full = reinterpret_cast<std::uint64_t*>(out + kOutTileBytes);
    empty = full + kSlots;
    x_ready = empty + kSlots;
    z_ready = x_ready + 1;
  }
  __device__ unsigned char* w_tile(int slot) const { return slots + slot * kSlotBytes; }
  __device__ unsigned char* dy_tile(int slot) const { return w_tile(slot) + kWTileBytes; }
  // Where Z lands: the dY part of the slot that row block `row_blocks` would
  // take, free for good once the consumers of its last use (row block
  // row_blocks - kSlots) release it: a few row blocks before the end, so the
  // copy hides behind them. (row_blocks is even: this is slot 0 or 2.)
  __device__ unsigned char* z_tile(int row_blocks) const { return dy_tile(row_blocks % kSlots); }
};

// The blocks that share each dY tile: 1, or the 2 blocks of a cluster, each
// copying batch rows [128 * rank, 128 * rank + 128) into both. A slot is free
// again once the consumers of both blocks have released it.
struct DyShare {
  int blocks;
  unsigned rank;
};

__device__ void release_slot(const SharedLayout& sm, const DyShare& share, int slot) {
  tma::arrive(&sm.empty[slot]);
  if (share.blocks > 1) tma::arrive_in_block(&sm.empty[slot], share.rank ^ 1u);
}

// Warpgroup 0, one thread: X once, then each slot's W and dY tiles as soon as
// every consumer of the slot's previous use has released it.
template <Activation A>
__device__ void load_tiles(const TileMaps& maps, const SharedLayout& sm, const DyShare& share, int col0,
                           int row_blocks) {
  tma::arrive_expect_bytes(sm.x_ready, kXTileBytes);
  tma::load_tile(&maps.x, sm.x_ready, sm.x, col0, 0);
  const int dy_rows = kBatch / share.blocks, dy_part_bytes = kDyTileBytes / share.blocks;
  for (int r = 0; r < row_blocks; ++r) {
    const int slot = r % kSlots, use = r / kSlots;
    if (use > 0) tma::wait(&sm.empty[slot], (use - 1) & 1);
    tma::arrive_expect_bytes(&sm.full[slot], kSlotBytes);  // the other block's half of dY counts here too
    tma::load_tile(&maps.w, &sm.full[slot], sm.w_tile(slot), col0, r * kRows);
    if (share.blocks == 1)
      tma::load_tile(&maps.dy, &sm.full[slot], sm.dy_tile(slot), r * kRows, 0);
    else
      tma::load_tile_to_blocks(&maps.dy, &sm.full[slot], sm.dy_tile(slot) + int(share.rank) * dy_part_bytes,
                               r * kRows, int(share.rank) * dy_rows, 0b11);
  }
  if constexpr (kBackwardReadsInput<A>) {  // Z, into the slot row block `row_blocks` would take
    const int slot = row_blocks % kSlots, use = row_blocks / kSlots;
    if (use > 0) tma::wait(&sm.empty[slot], (use - 1) & 1);
    tma::arrive_expect_bytes(sm.z_ready, kXTileBytes);
    tma::load_tile(&maps.z, sm.z_ready, sm.z_tile(row_blocks), col0, 0);
  }
}

// Warpgroup 1: dX^T[cols][b] += W^T[cols][rows] dY^T[rows][b] for every row
// block (one m64n256k16 per 16 rows), then dX = act'(that) (for ReLU: that *
// (X > 0)) and the previous layer's bias update from its column sums.
template <Activation A>
__device__ void dgrad(const TileMaps& maps, const SharedLayout& sm, const DyShare& share, int col0, int row_blocks,
                      __half* bias, const UpdateScalars* bias_scalars) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  for (int r = 0; r < row_blocks; ++r) {
    const int slot = r % kSlots;
    tma::wait(&sm.full[slot], (r / kSlots) & 1);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kRows / 16; ++k)
      wgmma::m64n256k16_mn_k(acc, wgmma::smem_descriptor(sm.w_tile(slot) + k * 2048),
                             wgmma::smem_descriptor(sm.dy_tile(slot) + k * 32), true);
    wgmma::commit();
    wgmma::wait<1>();  // the previous block's products are in: release its slot
    if (r > 0) {
      tma::sync_threads(kDgradGroupSync, 128);
      if (t == 0) release_slot(sm, share, (r - 1) % kSlots);
    }
  }
  wgmma::wait<0>();
  tma::wait(sm.x_ready, 0);
  tma::sync_threads(kBothGroupsSync, 256);  // the update is done with every slot
  // Thread: rows j = 16*warp + lane/4 (+8) of dX^T, batch columns 8g + 2*(lane%4) (+1).
  // [256][64], as the store expects it (not in the slot Z lands in: 0 or 2)
  unsigned char* dx_tile = sm.dy_tile(kBackwardReadsInput<A> ? 1 : 0);
  if constexpr (kBackwardReadsInput<A>) tma::wait(sm.z_ready, 0);
  const unsigned char* saved = kBackwardReadsInput<A> ? sm.z_tile(row_blocks) : sm.x;  // what the backward reads
  float column_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int g = 0; g < 32; ++g)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = 16 * warp + lane / 4 + 8 * h, b = 8 * g + 2 * (lane % 4) + e;
        const int offset = tma::swizzled_offset(b, j);
        const float x = __half2float(*reinterpret_cast<const __half*>(saved + offset));
        __half v;
        if constexpr (A == Activation::relu)  // (the select this kernel always made: the ReLU instance is unchanged)
          v = __float2half_rn(x > 0.f ? acc[4 * g + 2 * h + e] : 0.f);
        else
          v = __float2half_rn(ActivationMath<A>::backward(acc[4 * g + 2 * h + e], x));
        *reinterpret_cast<__half*>(dx_tile + offset) = v;
        column_sum[h] += __half2float(v);  // the bias gradient sums the rounded dX, as a separate kernel would
      }
  tma::fence_shared_for_copies();
  tma::sync_threads(kDgradGroupSync, 128);
  if (t == 0) tma::store_tile(&maps.dx, dx_tile, col0, 0);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    column_sum[h] += __shfl_xor_sync(0xffffffffu, column_sum[h], 1);
    column_sum[h] += __shfl_xor_sync(0xffffffffu, column_sum[h], 2);
    const int j = col0 + 16 * warp + lane / 4 + 8 * h;
    if (bias && lane % 4 == 0) bias[j] = __float2half_rn(sgd_step(__half2float(bias[j]), column_sum[h], nullptr, *bias_scalars));
  }
  if (t == 0) tma::wait_stores_done();
}

// Warpgroup 2: for each pair of slots (128 rows), W^T[cols][rows] =
// X^T[cols][b] dY[b][rows] (sixteen m64n128k16; dY's two 64-row halves sit in
// adjacent slots), then W = sgd(W, that) through ldmatrix/stmatrix.trans and
// one TMA store.
__device__ void update(const TileMaps& maps, const SharedLayout& sm, const DyShare& share, int col0, int row_blocks,
                       const UpdateScalars* scalars) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const UpdateScalars sgd = *scalars;
  float acc[64];
  tma::wait(sm.x_ready, 0);
  for (int r = 0; r < row_blocks; r += 2) {
    const int slot = r % kSlots;  // even: slot + 1 is the pair's second half
    tma::wait(&sm.full[slot], (r / kSlots) & 1);
    tma::wait(&sm.full[slot + 1], ((r + 1) / kSlots) & 1);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kBatch / 16; ++k)
      wgmma::m64n128k16_mn_mn(acc, wgmma::smem_descriptor(sm.x + k * 2048),
                              wgmma::smem_descriptor(sm.dy_tile(slot) + k * 2048, kSlotBytes), k > 0);
    wgmma::commit();
    wgmma::wait<0>();
    if (t == 0) tma::wait_stores_read();  // the previous pair's store has left the out tile
    tma::sync_threads(kUpdateGroupSync, 128);
    // Matrix m of this warp: rows 8*(m/2).. of the pair, columns 16*warp + 8*(m%2)..; its
    // transpose lands in the accumulator's layout (W^T: row j, column i).
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int m = 4 * q + lane / 8, row = 8 * (m >> 1) + (lane & 7), col = 16 * warp + 8 * (m & 1);
      std::uint32_t regs[4];
      load_matrices_transposed(regs,
                               shared_address(sm.w_tile(slot + row / kRows) + tma::swizzled_offset(row % kRows, col)));
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int mv = 4 * q + v, g = mv >> 1, h = mv & 1;
        const float2 w = unpack_half2(regs[v]);
        regs[v] = pack_half2(__float2half_rn(sgd_step(w.x, acc[4 * g + 2 * h], nullptr, sgd)),
                             __float2half_rn(sgd_step(w.y, acc[4 * g + 2 * h + 1], nullptr, sgd)));
      }
      store_matrices_transposed(shared_address(sm.out + tma::swizzled_offset(row, col)), regs);
    }
    tma::fence_shared_for_copies();
    tma::sync_threads(kUpdateGroupSync, 128);
    if (t == 0) {  // the old W rows are in registers and out: the slots go back before the store
      release_slot(sm, share, slot);
      release_slot(sm, share, slot + 1);
      tma::store_tile(&maps.w_out, sm.out, col0, r * kRows);
    }
  }
  tma::sync_threads(kBothGroupsSync, 256);
  if (t == 0) tma::wait_stores_done();
}

template <Activation A>
__global__ void __launch_bounds__(kThreads, 1)
    dgrad_wgrad_wgmma_kernel(const __grid_constant__ TileMaps maps, int n, int dy_sharing_blocks,
                             const UpdateScalars* scalars, __half* bias, const UpdateScalars* bias_scalars) {
  extern __shared__ unsigned char shared_raw[];
  const SharedLayout sm(shared_raw);
  const DyShare share{dy_sharing_blocks, dy_sharing_blocks > 1 ? tma::cluster_rank() : 0u};
  const int col0 = blockIdx.x * kCols, row_blocks = n / kRows;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      tma::barrier_init(&sm.full[s], 1);
      tma::barrier_init(&sm.empty[s], 2 * share.blocks);  // dgrad and update of each sharing block
    }
    tma::barrier_init(sm.x_ready, 1);
    if constexpr (kBackwardReadsInput<A>) tma::barrier_init(sm.z_ready, 1);
    tma::barrier_init_fence();
  }
  if (share.blocks > 1) {  // the other block's barriers are ready before our copies or arrivals reach them
    cluster_arrive();
    cluster_wait();
  } else {
    __syncthreads();
  }
  switch (threadIdx.x / 128) {
    case 0:
      if (threadIdx.x == 0) load_tiles<A>(maps, sm, share, col0, row_blocks);
      __syncwarp();
      break;
    case 1: dgrad<A>(maps, sm, share, col0, row_blocks, bias, bias_scalars); break;
    default: update(maps, sm, share, col0, row_blocks, scalars); break;
  }
  if (share.blocks > 1) {  // the other block may still arrive on our barriers: stay until it is done
    cluster_arrive();
    cluster_wait();
  }
}

}  // namespace

std::string wgmma_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k) {
  if (batch != kBatch) return fmt::format("batch {} (the wgmma kernel takes {})", batch, kBatch);
  if (n <= 0 || k <= 0 || n % (2 * kRows) != 0 || k % kCols != 0)
    return fmt::format("weight [{},{}]: rows a multiple of {}, columns of {}", n, k, 2 * kRows, kCols);
  if (n > (std::int64_t(1) << 30) || k > (std::int64_t(1) << 30)) return "weight too large";
  if (!device_available()) return "no CUDA device";
  const int major = current_device_attribute(cudaDevAttrComputeCapabilityMajor);
  const int minor = current_device_attribute(cudaDevAttrComputeCapabilityMinor);
  if (major != 9 || minor != 0) return fmt::format("compute capability {}.{} (wgmma/TMA need 9.0)", major, minor);
  return {};
}

int wgmma_blocks_sharing_dy(std::int64_t k, bool multicast) {
  // multicast off: one block per dY copy (the same-run baseline).
  return multicast && (k / kCols) % 2 == 0 ? 2 : 1;
}

void launch_wgmma(const __half* dy, const __half* x, std::int64_t n, std::int64_t k, __half* w, __half* dx,
                  const UpdateScalars* scalars, cudaStream_t stream, bool multicast, __half* bias,
                  const UpdateScalars* bias_scalars, Activation activation, const __half* saved) {
  if (const std::string why = wgmma_unsupported(kBatch, n, k); !why.empty())
    throw CudaError("one-pass dgrad+SGD (wgmma): unsupported: " + why);
  if (backward_reads_input(activation) && !saved)
    throw CudaError("one-pass dgrad+SGD (wgmma): the activation's backward needs the pre-activation");
  with_activation(activation, [&](auto a) {
    constexpr Activation kA = decltype(a)::value;
    static const bool smem_set = [] {
      SG_CUDA_CHECK(cudaFuncSetAttribute(dgrad_wgrad_wgmma_kernel<kA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kSmemBytes));
      return true;
    }();
    (void)smem_set;
    const int blocks = int(k / kCols), sharing = wgmma_blocks_sharing_dy(k, multicast);
    const CUtensorMap x_map = fp16_tile_map(x, kBatch, k, kBatch);
    const TileMaps maps{fp16_tile_map(w, n, k, kRows),
                        fp16_tile_map(w, n, k, 2 * kRows),
                        fp16_tile_map(dy, kBatch, n, kBatch / sharing),
                        x_map,
                        fp16_tile_map(dx, kBatch, k, kBatch),
                        kBackwardReadsInput<kA> ? fp16_tile_map(saved, kBatch, k, kBatch) : x_map};
    // Not a dependent launch: the kernel reads dY from its first copy on.
    launch_in_clusters(dgrad_wgrad_wgmma_kernel<kA>,
                       LaunchGeometry{dim3(unsigned(blocks)), dim3(kThreads), kSmemBytes, unsigned(sharing)}, stream,
                       false, maps, int(n), sharing, scalars, bias, bias_scalars);
  });
}

}  // namespace sg::cuda::one_pass
