#pragma once
// backend.activation_layout: auto with backend.autotune on: the CUDA trainer
// builds both forms of the step (NCHW and channels-last), times each by its
// own replays, and keeps the faster (CudaTrainer's constructor). The host
// rule (activation_layout_choice.hpp) is a proxy with measured misses
// (LeNet-5 kept NCHW at 179 us a step against 147 channels-last); a timing
// has none. The timing steps are undone: parameters, optimizer state, the
// step and the loss watch are restored, so training starts as built. Like
// autotune's engine picks, the choice may differ between runs where the two
// forms are close; a layout set in the config pins it. Both forms hold their
// buffers while they are timed: start-up needs the device memory of two
// trainers, the run that of one.
#include <string>

#include "runtime/cuda/cuda_trainer.hpp"

namespace sg::cuda {

// "" when the trainer for `spec` times both layouts, else why not (a set
// layout, autotune off, no convolutions, data parallel: every rank must run
// the same graphs).
std::string layout_timing_skipped(const TrainerSpec& spec);

// A trainer's step in us (graph replay, or stream launches with `replay`
// false), its state restored afterwards.
double timed_step_us(CudaTrainer& t, bool replay);

// The host rule's pick stands unless the other form is faster by more than this.
inline constexpr double kMargin = 0.03;

struct LayoutTiming {
  double nchw_us = 0, channels_last_us = 0;
  bool channels_last = false;
  std::string choice;  // the trainer's layout line: "channels-last (timed at start-up, ...)"
};
LayoutTiming time_layouts(CudaTrainer& nchw, CudaTrainer& channels_last, const TrainerSpec& spec);

}  // namespace sg::cuda
