#pragma once
// Locations of test inputs: real MNIST and the golden files.
//
// MNIST: $SG_MNIST_DIR when set (then the only place looked at), else the
// first of the folders tests/CMakeLists.txt configures (SG_TEST_MNIST_DIRS,
// ':'-separated: <checkout>/data/mnist, where scripts/setup_and_train.sh and
// scripts/run_tests.sh fetch it, then <checkout>/../shared/data/mnist, CI's
// copy) that holds the four gzip'd IDX files. The shell tests apply the same
// rule to the same list (tests/support/mnist_dir.sh).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sg::test {

// The files scripts/fetch_mnist.sh puts in place (and tests open by these names).
inline constexpr const char* kMnistFiles[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};

inline bool holds_mnist(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const char* name : kMnistFiles)
    if (!std::filesystem::is_regular_file(dir / name, ec)) return false;
  return true;
}

// The non-empty entries of a ':'-separated folder list, in order.
inline std::vector<std::filesystem::path> split_folder_list(std::string_view list) {
  std::vector<std::filesystem::path> out;
  while (!list.empty()) {
    const auto colon = list.find(':');
    const auto entry = list.substr(0, colon);
    if (!entry.empty()) out.emplace_back(entry);
    list = colon == std::string_view::npos ? std::string_view{} : list.substr(colon + 1);
  }
  return out;
}

// Where to look, in order: $SG_MNIST_DIR alone when set, else the configured list.
inline std::vector<std::filesystem::path> mnist_candidates() {
  if (const char* env = std::getenv("SG_MNIST_DIR"); env && *env) return {env};
  return split_folder_list(SG_TEST_MNIST_DIRS);
}

inline std::optional<std::filesystem::path> find_mnist_dir(const std::vector<std::filesystem::path>& candidates) {
  for (const auto& dir : candidates)
    if (holds_mnist(dir)) return dir;
  return std::nullopt;
}

// The folder with real MNIST. Without one, a test cannot run: it prints one
// SKIPPED line and exits 77, which ctest reports as skipped (each discovered
// doctest case runs in its own process, so exactly that case; a GPU test
// executable is skipped as a whole).
inline std::filesystem::path mnist_dir_or_skip() {
  const auto candidates = mnist_candidates();
  if (const auto dir = find_mnist_dir(candidates)) return *dir;
  std::string looked;
  for (const auto& dir : candidates) looked += (looked.empty() ? "" : ", ") + dir.string();
  std::printf("SKIPPED: no MNIST (looked in %s; get it with scripts/fetch_mnist.sh)\n",
              looked.empty() ? "no folder: SG_TEST_MNIST_DIRS is empty" : looked.c_str());
  std::fflush(stdout);
  std::exit(77);
}

inline std::filesystem::path golden_dir() { return SG_TEST_GOLDEN_DIR; }
inline std::filesystem::path source_dir() { return SG_SOURCE_DIR; }

}  // namespace sg::test
