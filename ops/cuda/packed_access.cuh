#pragma once
// N contiguous elements of T moved through accesses of `Bytes` (2, 4, 8 or
// 16: one 16-byte access carries 8 halves or 4 floats), so a warp reads or
// writes a row in a few wide transactions instead of one per element. The
// caller guarantees the alignment: p aligned to Bytes and N * sizeof(T) a
// multiple of Bytes (Bytes == sizeof(T): element by element). The words go
// through memcpy into T's registers: no aliasing of T through an integer
// type. Used by channel_sum.cu, pooling.cu and quad_access.cuh.
#include <cstdint>
#include <cstring>

namespace sg::cuda {

template <int Bytes>
struct PackWord;
template <>
struct PackWord<2> {
  using type = unsigned short;
};
template <>
struct PackWord<4> {
  using type = unsigned;
};
template <>
struct PackWord<8> {
  using type = uint2;
};
template <>
struct PackWord<16> {
  using type = uint4;
};

template <int Bytes, int N, typename T>
__device__ __forceinline__ void load_packed(const T* p, T (&out)[N]) {
  constexpr int per = Bytes / int(sizeof(T));
  static_assert(Bytes % sizeof(T) == 0 && per >= 1 && N % per == 0, "whole accesses of whole elements");
  using Word = typename PackWord<Bytes>::type;
#pragma unroll
  for (int k = 0; k < N / per; ++k) {
    const Word word = *reinterpret_cast<const Word*>(p + k * per);
    memcpy(&out[k * per], &word, Bytes);
  }
}

template <int Bytes, int N, typename T>
__device__ __forceinline__ void store_packed(T* p, const T (&in)[N]) {
  constexpr int per = Bytes / int(sizeof(T));
  static_assert(Bytes % sizeof(T) == 0 && per >= 1 && N % per == 0, "whole accesses of whole elements");
  using Word = typename PackWord<Bytes>::type;
#pragma unroll
  for (int k = 0; k < N / per; ++k) {
    Word word;
    memcpy(&word, &in[k * per], Bytes);
    *reinterpret_cast<Word*>(p + k * per) = word;
  }
}

// The widest access (at most 16 bytes) that whole runs of `elements`
// elements of `size` bytes split into: the largest power of two dividing
// elements * size.
constexpr int widest_pack_bytes(int elements, int size) {
  const int bytes = elements * size;
  int b = 16;
  while (b > 1 && bytes % b != 0) b /= 2;
  return b;
}

// Whether p is aligned to `bytes`.
inline bool aligned_to(const void* p, int bytes) { return reinterpret_cast<std::uintptr_t>(p) % unsigned(bytes) == 0; }

}  // namespace sg::cuda
