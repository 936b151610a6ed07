#pragma once
// Starting the CUDA context early. Creating the primary context (driver
// initialisation, the device's memory map) and loading cuBLASLt take a large
// part of a short run's start-up; they do not depend on the data, so the app
// starts them on worker threads while it reads the dataset, and the trainer
// built afterwards finds the context and cuBLASLt ready.

namespace sg::cuda {

struct WarmupTimes {
  bool device = false;        // a device came up
  double driver_s = 0;        // cudaGetDeviceCount: driver initialisation
  double context_s = 0;       // cudaFree(nullptr): the primary context
  double cublaslt_load_s = 0; // dlopen of cuBLASLt (its static initialisers), beside the context
  double cublaslt_s = 0;      // handle + one heuristic query, after the load, beside the context
  double total_s = 0;         // the whole warm-up, wall time
};

// Initialises the driver, then creates the primary context of device 0 (a
// new thread's current device) while a second thread
// loads cuBLASLt (ops/cuda/cublaslt_library.hpp) and has a throw-away handle
// answer one heuristic query, timing each. The load waits for the driver
// because glibc's loader lock, held through cuBLASLt's static initialisers,
// would otherwise hold up the driver's own dlopen. Never throws: `device` is
// false when there is no usable device, leaving the error (a missing cuBLASLt
// too) for the trainer to report.
WarmupTimes warm_up_device() noexcept;

}  // namespace sg::cuda
