// NCHW <-> NHWC (see channels_last.hpp): each image's [rows, cols] matrix
// (to channels-last: [c, hw]; back: [hw, c]) transposed into [cols, rows].
// A block moves one 32 x 32 tile through shared memory: its warps read the
// tile's rows (consecutive threads, consecutive columns: coalesced) and write
// the transposed tile's rows (consecutive threads, consecutive input rows:
// coalesced too), where a direct copy would coalesce only one side. The tile
// is one element wider than 32 so that reading its columns touches 32
// different banks (for 2-byte elements too: a row is 16.5 words, and 32 rows
// start in 32 different words modulo 32). Tiles at the matrix's right and
// bottom edges are partial. Elements move as T, never through float: the
// bits are copied exactly (NaN payloads included).
#include <algorithm>
#include <cstdint>

#include "ops/cuda/channels_last.hpp"
#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a block of 32 x 8 threads: each thread moves 4 elements of the tile
constexpr std::int64_t kMaxGridYZ = 65535;

// x [n, rows, cols] -> y [n, cols, rows]. Tile (blockIdx.y + k * gridDim.y,
// blockIdx.x) of images blockIdx.z + m * gridDim.z: the grid's y and z are
// capped at 65535, and the block loops over what lies past them.
template <typename T>
__global__ void __launch_bounds__(kTile* kTileRows)
    channels_permute_kernel(const T* x, std::int64_t n, std::int64_t rows, std::int64_t cols, T* y) {
  __shared__ T tile[kTile][kTile + 1];
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const std::int64_t c0 = std::int64_t(blockIdx.x) * kTile;
  for (std::int64_t image = blockIdx.z; image < n; image += gridDim.z) {
    const T* src = x + image * rows * cols;
    T* dst = y + image * rows * cols;
    for (std::int64_t r0 = std::int64_t(blockIdx.y) * kTile; r0 < rows; r0 += std::int64_t(gridDim.y) * kTile) {
      for (int i = ty; i < kTile; i += kTileRows)
        if (r0 + i < rows && c0 + tx < cols) tile[i][tx] = src[(r0 + i) * cols + c0 + tx];
      __syncthreads();
      // Row c0 + i of y, its columns r0 + tx: the tile's column i.
      for (int i = ty; i < kTile; i += kTileRows)
        if (c0 + i < cols && r0 + tx < rows) dst[(c0 + i) * rows + r0 + tx] = tile[tx][i];
      __syncthreads();  // the tile read before the next one overwrites it
    }
  }
}

}  // namespace

template <typename T>
void launch_channels_permute(const T* x, std::int64_t n, std::int64_t c, std::int64_t hw, bool to_channels_last, T* y,
                             cudaStream_t stream) {
  if (n < 0 || c < 0 || hw < 0) throw CudaError("channels_permute: negative size");
  if (n == 0 || c == 0 || hw == 0) return;
  if (x == y) throw CudaError("channels_permute: y must not be x (not an in-place transpose)");
  if (c == 1 || hw == 1) {
    // A 1 x k matrix is its own transpose in memory: a plain copy.
    SG_CUDA_CHECK(
        cudaMemcpyAsync(y, x, static_cast<std::size_t>(n * c * hw) * sizeof(T), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const std::int64_t rows = to_channels_last ? c : hw, cols = to_channels_last ? hw : c;
  const std::int64_t col_tiles = (cols + kTile - 1) / kTile, row_tiles = (rows + kTile - 1) / kTile;
  if (col_tiles > INT32_MAX) throw CudaError("channels_permute: too many tiles");
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(std::min(row_tiles, kMaxGridYZ)),
                  static_cast<unsigned>(std::min(n, kMaxGridYZ)));
  channels_permute_kernel<T><<<grid, dim3(kTile, kTileRows), 0, stream>>>(x, n, rows, cols, y);
  SG_LAUNCH_CHECK("channels_permute_kernel");
}

#define SG_INSTANTIATE_CHANNELS_PERMUTE(T) \
  template void launch_channels_permute<T>(const T*, std::int64_t, std::int64_t, std::int64_t, bool, T*, cudaStream_t);
SG_INSTANTIATE_CHANNELS_PERMUTE(float)
SG_INSTANTIATE_CHANNELS_PERMUTE(__half)
SG_INSTANTIATE_CHANNELS_PERMUTE(__nv_bfloat16)
#undef SG_INSTANTIATE_CHANNELS_PERMUTE

}  // namespace sg::cuda
