#pragma once
// Locations of test inputs: real MNIST ($SG_MNIST_DIR or the configured
// ../shared/data/mnist) and the golden files.
#include <cstdlib>
#include <filesystem>

namespace sg::test {

inline std::filesystem::path mnist_dir() {
  if (const char* env = std::getenv("SG_MNIST_DIR")) return env;
  return SG_TEST_MNIST_DIR;
}

inline std::filesystem::path golden_dir() { return SG_TEST_GOLDEN_DIR; }
inline std::filesystem::path source_dir() { return SG_SOURCE_DIR; }

}  // namespace sg::test
