#include "tests/support/late_linear_input.hpp"

#include <doctest/doctest.h>

#include "tests/runtime/test_support.hpp"
#include "tests/support/device_array.hpp"
#include "tests/support/late_producer.hpp"

namespace sg::test {

void check_waits_for_late_x(std::int64_t m, std::int64_t n, std::int64_t k, std::mt19937_64& rng,
                            const LinearLaunch& launch) {
  const auto x = representable<__half>(uniform(std::size_t(m * k), rng));
  const auto w = representable<__half>(uniform(std::size_t(n * k), rng));
  const auto b = representable<__half>(uniform(std::size_t(n), rng));
  DeviceArray<__half> dx(x), dw(w), db(b), expected(std::size_t(m * n));
  launch(dx.get(), dw.get(), db.get(), expected.get(), nullptr);
  for (const bool as_graph : {false, true}) {
    INFO((as_graph ? "graph" : "stream"));
    DeviceArray<__half> late_x(x.size()), y(std::size_t(m * n));  // poisoned until the late copy lands
    run_behind_late_copy(
        late_x.get(), dx.get(), x.size() * sizeof(__half),
        [&](cudaStream_t stream) { launch(late_x.get(), dw.get(), db.get(), y.get(), stream); }, as_graph);
    CHECK(y.download() == expected.download());
  }
}

}  // namespace sg::test
