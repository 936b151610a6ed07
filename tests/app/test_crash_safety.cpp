// Crash safety: a training run that writes a checkpoint every step is killed
// with SIGKILL at random moments; the checkpoint it leaves always loads (the
// write goes to a temp file, is fsynced and renamed over the old one).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "apps/config/train_config.hpp"
#include "apps/training_run.hpp"
#include "runtime/io/checkpoint.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
namespace fs = std::filesystem;

TEST_CASE("SIGKILL at random moments while checkpointing: the last checkpoint always loads") {
  const auto root = fs::temp_directory_path() / ("stepgraph-kill-" + std::to_string(std::random_device{}()));
  std::mt19937 rng(2424);  // fixed: the same kill moments every run
  const auto ckpt = root / "ck.sgck";
  std::int64_t last_step = 0;
  for (int round = 0; round < 5; ++round) {
    const auto config = app::load_config(
        sg::test::source_dir() / "configs/ci_small.yaml",
        {"data.dir=" + sg::test::mnist_dir_or_skip().string(), "run.out_dir=" + (root / "out").string(),
         "run.checkpoint=" + ckpt.string(), "run.checkpoint_every=1", "run.steps=100000", "run.log_every=1000",
         "run.eval_every=0", round > 0 ? "run.resume=" + ckpt.string() : "run.resume="});
    std::fflush(nullptr);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        app::run_training(config);
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    // Wait for the run to be checkpointing (a newer file than last round's), then kill it at a random moment.
    const auto before = fs::exists(ckpt) ? fs::last_write_time(ckpt) : fs::file_time_type::min();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((!fs::exists(ckpt) || fs::last_write_time(ckpt) == before) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 300000)(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    INFO("round " << round);
    CHECK(WIFSIGNALED(status));
    REQUIRE(fs::exists(ckpt));
    io::Checkpoint c;
    REQUIRE_NOTHROW(c = io::load_checkpoint(ckpt));
    CHECK(c.step > last_step);  // each round resumed and got further
    last_step = c.step;
  }
  fs::remove_all(root);
}
