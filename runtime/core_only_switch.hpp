#pragma once
// Test-only, process-wide: the GPU test binaries' `--core-only` argument
// (tests/support/gpu_test_main.cpp) sets it, and every CudaProgram of the
// process then runs with BackendOptions::core_only, so the whole GPU suite
// checks the core lowerings alone (issue 35). The app never sets it; it is a
// typed switch, not an environment variable.
namespace sg {

void force_core_only_for_tests(bool on);
bool core_only_forced_for_tests();

}  // namespace sg
