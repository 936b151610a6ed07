#pragma once
// A data-parallel rank's device (issue 25): chosen before any stream or
// handle of the trainer exists.
#include "runtime/trainer.hpp"

namespace sg::cuda {

// Each rank runs on its own device (its local rank). Returns the rank's
// device, or -1 for a single-process run, which keeps the current one.
// Throws when the program's rank count and the group's disagree, or the
// local rank names no GPU.
int select_device(const DataParallelGroup& dp, const TrainingProgram& p);

}  // namespace sg::cuda
