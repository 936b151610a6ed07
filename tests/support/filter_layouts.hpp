#pragma once
// A convolution filter [o,c,kh,kw] reordered as [o,kh,kw,c] (Conv2dAttrs::
// filter_channels_last), for the tests that feed both layouts to one pass.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sg::test {

template <typename T>
std::vector<T> filter_to_krsc(const std::vector<T>& w, std::int64_t o, std::int64_t c, std::int64_t taps) {
  std::vector<T> out(w.size());
  for (std::int64_t f = 0; f < o; ++f)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t t = 0; t < taps; ++t)
        out[static_cast<std::size_t>((f * taps + t) * c + ch)] = w[static_cast<std::size_t>((f * c + ch) * taps + t)];
  return out;
}

}  // namespace sg::test
