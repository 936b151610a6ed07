// Capture and replay: a graph does exactly what the stream launches do, and
// scalars in device memory change a replay without re-capture.
#include <doctest/doctest.h>

#include "ops/cuda/kernels.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/device_array.hpp"

using namespace sg;
using sg::test::DeviceArray;

TEST_CASE("a captured graph of kernels equals the same launches on a stream, bit for bit") {
  auto rng = sg::test::fresh_rng();
  const std::int64_t rows = 37, cols = 129, n = rows * cols;
  const auto x = sg::test::uniform(static_cast<std::size_t>(n), rng), bias = sg::test::uniform(static_cast<std::size_t>(cols), rng);
  cuda::Stream stream;
  auto run = [&](DeviceArray<__half>& out, bool capture) {
    DeviceArray<__half> dx(x), db(bias), tmp(static_cast<std::size_t>(n));
    auto record = [&] {
      cuda::launch_bias_add(dx.get(), db.get(), rows, cols, tmp.get(), stream.get());
      cuda::launch_relu(tmp.get(), n, out.get(), stream.get());
    };
    if (capture) {
      cuda::begin_capture(stream.get());
      record();
      cuda::GraphExec exec(cuda::end_capture(stream.get()));
      exec.launch(stream.get());
    } else {
      record();
    }
    stream.synchronize();
  };
  DeviceArray<__half> graph_out(static_cast<std::size_t>(n)), stream_out(static_cast<std::size_t>(n));
  run(graph_out, true);
  run(stream_out, false);
  const auto a = graph_out.download();
  CHECK(a == stream_out.download());
  CHECK(std::isfinite(a[0]));
}

TEST_CASE("changing UpdateScalars in device memory changes the next replay, no re-capture") {
  const std::int64_t n = 1000;
  std::vector<float> w0(static_cast<std::size_t>(n), 1.0f), g(static_cast<std::size_t>(n), 1.0f);
  DeviceArray<float> w(w0), dg(g);
  cuda::DeviceBuffer scalars(sizeof(cuda::UpdateScalars));
  auto set_lr = [&](float lr) {
    const auto s = cuda::make_update_scalars(lr, 0.f, 0.f);
    scalars.upload(&s, sizeof s);
  };
  set_lr(0.1f);
  cuda::Stream stream;
  cuda::begin_capture(stream.get());
  cuda::launch_sgd_update(w.get(), static_cast<const float*>(dg.get()), static_cast<float*>(nullptr), n,
                          scalars.as<cuda::UpdateScalars>(), stream.get());
  cuda::GraphExec exec(cuda::end_capture(stream.get()));
  exec.launch(stream.get());
  stream.synchronize();
  CHECK(w.download()[7] == doctest::Approx(0.9f));
  set_lr(0.5f);
  exec.launch(stream.get());
  stream.synchronize();
  CHECK(w.download()[7] == doctest::Approx(0.4f));
}
