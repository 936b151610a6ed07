// Where the tests find real MNIST (tests/support/test_data.hpp): the lookup
// rule over temp folders, and the real MNIST it finds read by the IDX reader.
// Kept to test_data.hpp and the IDX reader so that the fresh-clone test
// (tests/scripts/test_fresh_clone.sh) builds it in seconds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "runtime/data/idx_reader.hpp"
#include "tests/support/test_data.hpp"

namespace fs = std::filesystem;

namespace {

// A new empty folder under the system temp dir.
fs::path fresh_dir() {
  const auto dir = fs::temp_directory_path() / ("stepgraph-mnist-location-" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  return dir;
}

void touch(const fs::path& file) { std::ofstream(file, std::ios::binary) << 'x'; }

// Sets an environment variable for one scope; restores the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("the MNIST lookup takes the first folder holding all four gzip'd IDX files") {
  const auto root = fresh_dir();
  const auto missing = root / "missing", empty = root / "empty", three = root / "three", raw = root / "raw",
             first = root / "first", second = root / "second";
  for (const auto& dir : {empty, three, raw, first, second}) fs::create_directories(dir);
  for (const char* name : sg::test::kMnistFiles) {
    touch(first / name);
    touch(second / name);
    touch(three / name);
    touch(raw / fs::path(name).stem());  // the IDX file without .gz: tests open the .gz names
  }
  fs::remove(three / "t10k-labels-idx1-ubyte.gz");  // as a fetch that stopped after three files leaves it

  CHECK(sg::test::find_mnist_dir({missing, empty, three, raw, first, second}) == first);
  CHECK(sg::test::find_mnist_dir({second, first}) == second);
  CHECK_FALSE(sg::test::find_mnist_dir({missing, empty, three, raw}).has_value());
  CHECK_FALSE(sg::test::find_mnist_dir({}).has_value());
  fs::remove_all(root);
}

TEST_CASE("the MNIST folder list: ':'-separated, empty entries dropped, $SG_MNIST_DIR alone when set") {
  CHECK(sg::test::split_folder_list("/a/b:/c") == std::vector<fs::path>{"/a/b", "/c"});
  CHECK(sg::test::split_folder_list("::/a:") == std::vector<fs::path>{"/a"});
  CHECK(sg::test::split_folder_list("").empty());

  {
    ScopedEnv unset("SG_MNIST_DIR", nullptr);
    // data/mnist of this checkout (where scripts/fetch_mnist.sh puts it) first, then CI's ../shared copy.
    const auto source = sg::test::source_dir();
    CHECK(sg::test::mnist_candidates() ==
          std::vector<fs::path>{source / "data/mnist", source / "../shared/data/mnist"});
  }
  {
    ScopedEnv empty("SG_MNIST_DIR", "");
    CHECK(sg::test::mnist_candidates().size() == 2);
  }
  ScopedEnv set("SG_MNIST_DIR", "/somewhere/mnist");
  CHECK(sg::test::mnist_candidates() == std::vector<fs::path>{"/somewhere/mnist"});
}

TEST_CASE("real MNIST is found and reads as 60000 + 10000 labelled 28x28 images") {
  const auto dir = sg::test::mnist_dir_or_skip();
  MESSAGE("MNIST from " << dir.string());
  const auto train_labels = sg::data::read_idx_labels(dir / "train-labels-idx1-ubyte.gz");
  CHECK(train_labels.labels.size() == 60000);
  const auto test = sg::data::load_split(dir, "t10k");
  CHECK(test.images.count == 10000);
  CHECK(test.images.rows == 28);
  CHECK(test.images.cols == 28);
  CHECK(test.classes == 10);
  CHECK(*std::max_element(test.images.pixels.begin(), test.images.pixels.end()) == 255);
}
