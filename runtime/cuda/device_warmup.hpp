#pragma once
// Starting the CUDA context early. Creating the primary context (driver
// initialisation, the device's memory map, loading cuBLASLt) takes a large
// part of a short run's start-up; it does not depend on the data, so the app
// starts it on a worker thread while it reads the dataset, and the trainer
// built afterwards finds the context ready.

namespace sg::cuda {

struct WarmupTimes {
  bool device = false;   // a device came up
  double driver_s = 0;   // cudaGetDeviceCount: driver initialisation
  double context_s = 0;  // cudaFree(nullptr): the primary context
  double cublaslt_s = 0; // handle + one heuristic query
};

// Creates the primary context of the current device (device 0 unless the
// thread chose another), then a throw-away cuBLASLt handle that answers one
// heuristic query, timing each. Never throws: `device` is false when there is
// no usable device, leaving the error for the trainer to report.
WarmupTimes warm_up_device() noexcept;

}  // namespace sg::cuda
