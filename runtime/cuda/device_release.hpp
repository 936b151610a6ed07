#pragma once
// Ending the CUDA context early. Destroying the primary context (freeing the
// device memory, unloading the modules) takes tens of milliseconds that a
// process otherwise spends after main(), in the CUDA runtime's exit handler,
// when nothing else can run. A command that has finished with the device can
// instead destroy it on a worker thread while it writes its outputs.

namespace sg::cuda {

// Destroys this process's primary context on the calling thread's current
// device (cudaDeviceReset). Only for a process that makes no further CUDA
// calls: a later call would create a new context. Every device object must be
// gone already. Never throws; false when the reset reported an error.
bool release_device() noexcept;

}  // namespace sg::cuda
