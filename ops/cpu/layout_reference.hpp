#pragma once
// Channels-first [N,C,H,W] <-> channels-last [N,H,W,C] copies: the CPU
// reference of the layout ops (graph/ops/channels_last.cpp), and how the
// channels-last forms of conv2d and the poolings reuse the NCHW references
// (their definition: the NCHW op on the same values in the other order).
#include <cstdint>
#include <vector>

namespace sg::ref {

// y [n, hw, c] = x [n, c, hw] transposed per image.
template <typename T>
void to_channels_last(const T* x, std::int64_t n, std::int64_t c, std::int64_t hw, T* y) {
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t p = 0; p < hw; ++p) y[(i * hw + p) * c + ch] = x[(i * c + ch) * hw + p];
}

// y [n, c, hw] = x [n, hw, c] transposed per image.
template <typename T>
void to_channels_first(const T* x, std::int64_t n, std::int64_t c, std::int64_t hw, T* y) {
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t p = 0; p < hw; ++p) y[(i * c + ch) * hw + p] = x[(i * hw + p) * c + ch];
}

// A channels-last tensor's values in NCHW order (a copy), or the pointer
// itself when the tensor is NCHW already.
template <typename T>
class ChannelsFirstView {
 public:
  ChannelsFirstView(const T* x, bool channels_last, std::int64_t n, std::int64_t c, std::int64_t hw) : data_(x) {
    if (!channels_last) return;
    copy_.resize(static_cast<std::size_t>(n * c * hw));
    to_channels_first(x, n, c, hw, copy_.data());
    data_ = copy_.data();
  }
  const T* data() const { return data_; }

 private:
  const T* data_;
  std::vector<T> copy_;
};

// An NCHW scratch a reference writes, stored channels-last into `out` when
// finish() is called (or `out` itself when the tensor is NCHW).
template <typename T>
class ChannelsFirstOutput {
 public:
  ChannelsFirstOutput(T* out, bool channels_last, std::int64_t n, std::int64_t c, std::int64_t hw)
      : out_(out), channels_last_(channels_last), n_(n), c_(c), hw_(hw) {
    if (channels_last) scratch_.assign(static_cast<std::size_t>(n * c * hw), T(0));
  }
  T* data() { return channels_last_ ? scratch_.data() : out_; }
  void finish() {
    if (channels_last_) to_channels_last(scratch_.data(), n_, c_, hw_, out_);
  }

 private:
  T* out_;
  bool channels_last_;
  std::int64_t n_, c_, hw_;
  std::vector<T> scratch_;
};

}  // namespace sg::ref
