// backend.activation_layout: auto with backend.autotune: both forms of the
// step built and timed at start-up, the faster one kept (timed_layout_choice.hpp).
#include "runtime/cuda/timed_layout_choice.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "ops/cuda/cuda_resources.hpp"
#include "runtime/cuda/activation_layout_choice.hpp"

namespace sg::cuda {

std::string layout_timing_skipped(const TrainerSpec& spec) {
  if (spec.backend.activation_layout != ActivationLayout::automatic) return "the layout is set";
  if (!spec.backend.autotune) return "backend.autotune is off";
  if (!spec.program.channels_last) return "no convolution layers";
  // Every rank must run the same graphs (its buckets' collectives pair up), and timings differ by rank.
  if (spec.data_parallel.world_size > 0) return "data parallel";
  return cudnn_missing();
}

namespace {

TrainerSpec with_layout(const TrainerSpec& spec, ActivationLayout layout) {
  TrainerSpec s = spec;
  s.backend.activation_layout = layout;
  return s;
}

// The median of five timings of `steps` steps run as the trainer runs them
// (graph replay, or stream launches without CUDA graphs), in us a step.
double time_steps(CudaTrainer& t, bool replay, std::int64_t steps) {
  const auto stream = static_cast<cudaStream_t>(t.stream_handle());
  std::vector<double> us;
  for (int r = 0; r < 5; ++r) {
    Event a, b;
    a.record(stream);
    if (replay) t.replay_steps(steps);
    else t.launch_steps(steps);
    b.record(stream);
    b.synchronize();
    us.push_back(1e3 * Event::elapsed_ms(a, b) / double(steps));
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

double timed_step_us(CudaTrainer& t, bool replay) {
  const std::vector<io::TensorBlob> start = t.save_state();
  t.train(3);  // the epoch's permutation uploaded, the first launches' lazy set-up done
  t.synchronize();
  // Repeats of about 5 ms (at least 4 steps, at most 200): a step's time, not the event's.
  const double rough = time_steps(t, replay, 4);
  const auto steps = std::clamp<std::int64_t>(std::int64_t(5000.0 / std::max(rough, 1.0)), 4, 200);
  const double us = time_steps(t, replay, steps);
  t.load_state(start);  // the parameters, optimizer state, step and loss watch as built: training starts here
  return us;
}

LayoutTiming time_layouts(CudaTrainer& nchw, CudaTrainer& channels_last, const TrainerSpec& spec) {
  LayoutTiming out;
  out.nchw_us = timed_step_us(nchw, spec.cuda_graph);
  out.channels_last_us = timed_step_us(channels_last, spec.cuda_graph);
  // The host rule's pick unless the other form is more than kMargin faster: a near tie does not flip by noise.
  const bool rule_channels_last = auto_layout_nchw_reason(spec.program, spec.backend).empty();
  out.channels_last = rule_channels_last ? out.channels_last_us <= out.nchw_us * (1 + kMargin)
                                         : out.channels_last_us * (1 + kMargin) < out.nchw_us;
  out.choice = fmt::format("{} (timed at start-up, backend.autotune: {:.1f} us a step channels-last, {:.1f} NCHW)",
                           out.channels_last ? "channels-last" : "NCHW", out.channels_last_us, out.nchw_us);
  return out;
}

CudaTrainer::Impl* CudaTrainer::faster_layout(const TrainerSpec& spec, const Dataset& data) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  CudaTrainer nchw(with_layout(spec, ActivationLayout::nchw), data);
  const auto nchw_built = Clock::now();
  CudaTrainer channels_last(with_layout(spec, ActivationLayout::channels_last), data);
  const auto both_built = Clock::now();
  const LayoutTiming timing = time_layouts(nchw, channels_last, spec);
  // What auto's timing added to start-up: the other form's construction and both timings.
  const auto other_built = timing.channels_last ? nchw_built - start : both_built - nchw_built;
  const double added = std::chrono::duration<double>(other_built + (Clock::now() - both_built)).count();
  CudaTrainer& kept = timing.channels_last ? channels_last : nchw;
  kept.note_layout_timing(timing.choice, added);
  return kept.impl_.release();  // the other trainer is released on return; the caller owns this
}

}  // namespace sg::cuda
