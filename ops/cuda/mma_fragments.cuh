#pragma once
// Warp-level tensor-core pieces (PTX mma.sync, ldmatrix/stmatrix) for
// kernels that keep their operands in registers and shared memory. Fragment
// layouts of mma.m16n8k16 (fp16 in, fp32 accumulate), with g = lane / 4 and
// t = lane % 4; a register holds two fp16 values:
//   A (16 x 16, row-major): a0 = A[g][2t..2t+1]    a1 = A[g+8][2t..2t+1]
//                           a2 = A[g][2t+8..2t+9]  a3 = A[g+8][2t+8..2t+9]
//   B (16 x 8):             b0 = B[2t..2t+1][g]    b1 = B[2t+8..2t+9][g]
//   C (16 x 8, fp32):       c0,c1 = C[g][2t..2t+1] c2,c3 = C[g+8][2t..2t+1]
// Each register is one 8 x 8 fp16 matrix spread over the warp with lane
// (g, t) holding row g, columns 2t..2t+1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace sg::cuda {

// T: __half (fp16 inputs, the default) or __nv_bfloat16 (bf16; the same fragment layouts).
template <typename T = __half>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                            std::uint32_t b1) {
#define SG_MMA_16X8X16(TYPE)                                                                                  \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE                                        \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    SG_MMA_16X8X16("bf16");
  else
    SG_MMA_16X8X16("f16");
#undef SG_MMA_16X8X16
}

// Four 8 x 8 fp16 matrices from shared memory: lanes 8i..8i+7 give the row
// addresses (16 contiguous bytes each) of matrix i, which lands in m[i] spread
// as above; .trans spreads each matrix transposed.
__device__ __forceinline__ void load_matrices(std::uint32_t (&m)[4], std::uint32_t row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(m[0]), "=r"(m[1]), "=r"(m[2]), "=r"(m[3])
               : "r"(row_address));
}
__device__ __forceinline__ void load_matrices_transposed(std::uint32_t (&m)[4], std::uint32_t row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(m[0]), "=r"(m[1]), "=r"(m[2]), "=r"(m[3])
               : "r"(row_address));
}
// The inverse of load_matrices (sm_90).
__device__ __forceinline__ void store_matrices(std::uint32_t row_address, const std::uint32_t (&m)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(row_address), "r"(m[0]),
               "r"(m[1]), "r"(m[2]), "r"(m[3])
               : "memory");
}
// The inverse of load_matrices_transposed (sm_90).
__device__ __forceinline__ void store_matrices_transposed(std::uint32_t row_address, const std::uint32_t (&m)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(row_address), "r"(m[0]),
               "r"(m[1]), "r"(m[2]), "r"(m[3])
               : "memory");
}

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ std::uint32_t pack_half2(__half lo, __half hi) {
  const __half2 h = __halves2half2(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

// Two floats rounded to T (__half or __nv_bfloat16) as one register, lo in the low half.
template <typename T>
__device__ __forceinline__ std::uint32_t pack_floats(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

__device__ __forceinline__ float2 unpack_half2(std::uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

}  // namespace sg::cuda
