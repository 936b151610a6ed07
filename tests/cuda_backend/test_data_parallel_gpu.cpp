// Data-parallel training on one GPU (issue 25): the sharded batch fetch
// kernels against the CPU reference, and a single-rank run through the whole
// NCCL path (rendezvous-free world of one: ncclCommInitRank, the gradient
// buckets' ncclAllReduce captured in the CUDA graph) against the CPU backend
// running the same program, against the single-process CUDA step, rerun
// bit-identically and resumed bit-exactly; the all-reduces on their own
// stream (forked and joined inside the capture) and a peer watchdog polling
// NCCL's asynchronous error during the replays change no bit; when the
// watchdog's peer link closes mid-replay it aborts the real communicator and
// ends the process with its line (a re-executed child). Two ranks need two GPUs
// (docs/data_parallel.md says what that leaves unverified).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/table_fetch.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/cuda/nccl_communicator.hpp"
#include "runtime/distributed/peer_watchdog.hpp"
#include "tests/runtime/report_cnn.hpp"
#include "tests/runtime/small_residual_cnn.hpp"
#include "tests/support/core_only_skips.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/device_array.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;
using sg::test::all_parameters;
using sg::test::losses;
using sg::test::random_dataset;

namespace {

struct Shard {
  std::int64_t n, batch, rank, ranks, cols;
  std::int32_t step;
  std::vector<std::int32_t> perm;
};

Shard random_shard(std::mt19937_64& rng) {
  Shard s;
  s.ranks = 1 + std::int64_t(rng() % 4);
  s.rank = std::int64_t(rng() % std::uint64_t(s.ranks));
  s.batch = 1 + std::int64_t(rng() % 40);
  s.n = s.batch * s.ranks * (1 + std::int64_t(rng() % 5)) + std::int64_t(rng() % 7);
  s.cols = 1 + std::int64_t(rng() % 200);
  s.step = std::int32_t(rng() % 23);
  s.perm.resize(std::size_t(s.n));
  std::iota(s.perm.begin(), s.perm.end(), 0);
  std::shuffle(s.perm.begin(), s.perm.end(), rng);
  return s;
}

// The CPU reference's rows of the shard's batch.
std::vector<std::int32_t> reference_rows(const Shard& s) {
  std::vector<std::int32_t> idx(std::size_t(s.batch));
  ref::batch_indices(s.perm.data(), s.n, s.step, s.batch, idx.data(), s.rank, s.ranks);
  return idx;
}

MlpTraining odd_training(std::int64_t ranks) {
  MlpTraining t;
  t.mlp.layers = {37, 129, 65, 11};
  t.mlp.batch = 33;
  t.mlp.weight_dtype = DType::f32;  // fp32 master weights: the f32 gradients are what is reduced
  t.optimizer = {0.05, 0.9, 1e-3};
  t.eval_batch = 100;
  t.init_seed = 3;
  t.data_rank = 0;
  t.data_ranks = ranks;
  return t;
}

TrainerSpec spec_for(const MlpTraining& t, const Dataset& data, ProgramTarget target) {
  TrainerSpec s;
  s.program = build_mlp_program(t, data.train.images.count, data.test.images.count, target);
  s.shuffle_seed = 5;
  return s;
}

// A world of one rank: this process makes the id itself (no rendezvous needed).
DataParallelGroup single_rank(bool nonblocking = false) {
  DataParallelGroup g;
  g.rank = 0;
  g.world_size = 1;
  g.local_rank = 0;
  g.nccl_id = cuda::new_nccl_unique_id();
  g.timeout_s = 60;
  g.nonblocking_nccl = nonblocking;
  return g;
}

// Each floating state entry's relative error against another trainer's (entries pair by name), to say
// where a difference sits.
// Per floating entry of the two trainers' states: its name and the relative error by norm of a's against b's.
std::vector<std::pair<std::string, double>> entry_relative_errors(Trainer& a, Trainer& b) {
  const auto mine = a.save_state(), theirs = b.save_state();
  REQUIRE(mine.size() == theirs.size());
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (is_floating(mine[i].dtype)) {
      CHECK(mine[i].name == theirs[i].name);
      out.emplace_back(mine[i].name,
                       sg::test::relative_error(floats_from_blob(mine[i]), floats_from_blob(theirs[i])));
    }
  return out;
}

std::string entry_errors(Trainer& a, Trainer& b) {
  std::string out;
  for (const auto& [name, error] : entry_relative_errors(a, b)) out += fmt::format(" {} {:.3g}", name, error);
  return out;
}

std::size_t nccl_launches(const cuda::CudaTrainer& t) {
  std::size_t n = 0;
  for (const auto& l : t.training_program().schedule().launches) n += l.lowering->name() == "nccl_all_reduce";
  return n;
}

}  // namespace

TEST_CASE("sharded batch fetch kernels: a rank's slice of the global batch, poisoned outputs fully written") {
  auto rng = sg::test::fresh_rng();
  for (int trial = 0; trial < 12; ++trial) {
    const Shard s = random_shard(rng);
    INFO("n " << s.n << " batch " << s.batch << " rank " << s.rank << "/" << s.ranks << " cols " << s.cols << " step "
              << s.step << ", seed " << sg::test::last_seed());
    std::vector<std::uint8_t> images(std::size_t(s.n * s.cols)), labels(std::size_t(s.n));
    for (auto& v : images) v = std::uint8_t(rng() % 256);
    for (auto& v : labels) v = std::uint8_t(rng() % 10);
    cuda::DeviceBuffer d_perm(s.perm.size() * 4), d_step(4), d_images(images.size()), d_labels(labels.size());
    d_perm.upload(s.perm.data(), d_perm.bytes());
    d_step.upload(&s.step, 4);
    d_images.upload(images.data(), images.size());
    d_labels.upload(labels.data(), labels.size());
    const auto rows = reference_rows(s);
    const float scale = 1.0f / 255.0f, shift = -0.5f;
    std::vector<float> want_x(std::size_t(s.batch * s.cols)), want_y(std::size_t(s.batch));
    for (std::int64_t i = 0; i < s.batch; ++i) {
      for (std::int64_t c = 0; c < s.cols; ++c)
        want_x[std::size_t(i * s.cols + c)] = float(__half(float(images[std::size_t(rows[std::size_t(i)] * s.cols + c)]) * scale + shift));
      want_y[std::size_t(i)] = float(labels[std::size_t(rows[std::size_t(i)])]);
    }
    // The u8 images + labels kernel.
    test::DeviceArray<__half> x(want_x.size());
    test::DeviceArray<std::int32_t> y(want_y.size());
    cuda::launch_batch_fetch(d_perm.as<std::int32_t>(), s.n, d_step.as<std::int32_t>(), s.batch,
                             d_images.as<std::uint8_t>(), s.cols, scale, shift, x.get(), d_labels.as<std::uint8_t>(),
                             y.get(), nullptr, s.rank, s.ranks);
    CHECK(sg::test::relative_error(x.download(), want_x) < 1e-3);
    CHECK(y.download() == want_y);
    // The general table kernel.
    test::DeviceArray<float> t(want_x.size());
    cuda::launch_table_fetch(d_perm.as<std::int32_t>(), s.n, d_step.as<std::int32_t>(), s.batch,
                             d_images.as<std::uint8_t>(), s.cols, scale, shift, t.get(), nullptr, s.rank, s.ranks);
    std::vector<float> want_f(want_x.size());
    for (std::int64_t i = 0; i < s.batch; ++i)
      for (std::int64_t c = 0; c < s.cols; ++c)
        want_f[std::size_t(i * s.cols + c)] = float(images[std::size_t(rows[std::size_t(i)] * s.cols + c)]) * scale + shift;
    CHECK(sg::test::relative_error(t.download(), want_f) < 1e-6);
  }
}

TEST_CASE("a single-rank NCCL run (all-reduce captured in the graph) follows the CPU backend and the plain CUDA step") {
  INFO("NCCL " << cuda::nccl_version_string());
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset data = random_dataset(400, 37, 11, rng);  // 12 batches per epoch: reshuffles happen
  // fp32: the widened gradients are reduced; compute (precision.all_reduce): the f16 ones, cast after the mean.
  // Over one rank both reduce to a copy of what the plain step's update reads.
  for (const bool compute : {false, true}) {
    const std::string reduced = compute ? "compute" : "fp32";
    INFO("all_reduce: " << reduced);
    MlpTraining t = odd_training(1);
    t.optimizer.reduce_in_compute_dtype = compute;
    TrainerSpec dp = spec_for(t, data, ProgramTarget::cuda);
    dp.data_parallel = single_rank();
    cuda::CudaTrainer gpu(dp, data);
    CHECK(nccl_launches(gpu) == 3);  // one bucket per layer
    for (const auto& l : gpu.training_program().schedule().launches)
      if (l.lowering->name() == "nccl_all_reduce")
        for (ValueId v : l.reads)
          CHECK(gpu.training_program().graph().value(v).dtype == (compute ? DType::f16 : DType::f32));
    auto cpu = make_cpu_trainer(spec_for(t, data, ProgramTarget::cpu), data);  // all_reduce_mean over one rank: a copy
    cuda::CudaTrainer plain(spec_for(odd_training(0), data, ProgramTarget::cuda), data);
    CHECK(nccl_launches(plain) == 0);
    // The all-reduces run on the communication stream, forked and joined inside the capture, and the weight
    // gradients they read on the gradient stream, as the plain step's do; the plain step has no all-reduce.
    CHECK(gpu.training_program().stream_plan().forks());
    CHECK(gpu.training_program().stream_plan().splits_gradients());
    CHECK_FALSE(plain.training_program().stream_plan().forks());
    gpu.poison_activations();
    const auto first_gpu = losses(gpu, 1), first_cpu = losses(*cpu, 1);
    CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)) < 2e-3);
    MESSAGE(reduced << " all-reduce, entries vs the cpu after 1 step:" << entry_errors(gpu, *cpu));
    const auto gpu_losses = losses(gpu, 59), cpu_losses = losses(*cpu, 59), plain_losses = losses(plain, 60);
    MESSAGE(reduced << " all-reduce, loss step 60: nccl " << gpu_losses.back() << " cpu " << cpu_losses.back()
                    << " plain cuda " << plain_losses.back() << "; parameters vs the plain step "
                    << sg::test::relative_error(all_parameters(gpu), all_parameters(plain)) << ", vs the cpu "
                    << sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)));
    CHECK(sg::test::relative_error(gpu_losses, cpu_losses) < 1e-2);
    std::vector<float> all_gpu = first_gpu;
    all_gpu.insert(all_gpu.end(), gpu_losses.begin(), gpu_losses.end());
    CHECK(sg::test::relative_error(all_gpu, plain_losses) < 1e-2);
    CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(plain)) < 5e-2);
    CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)) < 5e-2);
    MESSAGE(reduced << " all-reduce, entries vs the plain step after 60 steps:" << entry_errors(gpu, plain));
  }
}

TEST_CASE("a single-rank NCCL run of a residual CNN (model.sequential) follows the CPU backend and the plain CUDA step") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    INFO(optimizer_name(kind));
    const Dataset data = random_dataset(300, 36, 6, rng);
    const auto spec = [&](std::int64_t ranks, ProgramTarget target) {
      SequentialTraining t = test::small_residual_cnn(25, kind);
      t.data_ranks = ranks;
      TrainerSpec s;
      s.program = build_sequential_program(t, data.train.images.count, data.test.images.count, target);
      s.shuffle_seed = 5;
      return s;
    };
    TrainerSpec dp = spec(1, ProgramTarget::cuda);
    dp.data_parallel = single_rank();
    cuda::CudaTrainer gpu(dp, data);
    CHECK(nccl_launches(gpu) == 3);  // two convolutions and the linear layer
    CHECK(gpu.training_program().stream_plan().forks());
    auto cpu = make_cpu_trainer(spec(1, ProgramTarget::cpu), data);
    cuda::CudaTrainer plain(spec(0, ProgramTarget::cuda), data);
    CHECK(nccl_launches(plain) == 0);
    gpu.poison_activations();
    gpu.train(1);
    cpu->train(1);
    plain.train(1);
    // Against the plain CUDA step: the same fp16 math, only fused updates apart.
    {
      INFO("against the plain CUDA step");
      test::check_states_close(gpu, plain, 1e-3);
    }
    // Against the f32 CPU: fp16 rounding, and max-pool windows whose maximum
    // ties after rounding send a few gradients elsewhere. About 1% by norm
    // after one step here for most data, but up to 7% for some (seeds
    // 1408288679, 3641668979, 928142837, 3325847779: vel_w1, vel_w2, the
    // Adam moments), and then the plain CUDA step is as far from the CPU as
    // the rank (replayed on an H200, 2026-11-29). So the rank must be as close
    // to the CPU as the plain step is, entry by entry (the 1e-3 above is the
    // room between them), and no entry farther than 10%.
    {
      INFO("against the CPU backend, as close as the plain CUDA step");
      const auto rank_errors = entry_relative_errors(gpu, *cpu), plain_errors = entry_relative_errors(plain, *cpu);
      REQUIRE(rank_errors.size() == plain_errors.size());
      for (std::size_t i = 0; i < rank_errors.size(); ++i) {
        CAPTURE(rank_errors[i].first);
        CAPTURE(plain_errors[i].second);
        CHECK(rank_errors[i].second <= plain_errors[i].second + 1e-3);
        CHECK(rank_errors[i].second < 0.1);
      }
    }
    const auto gpu_losses = losses(gpu, 35), cpu_losses = losses(*cpu, 35), plain_losses = losses(plain, 35);
    MESSAGE(optimizer_name(kind) << " loss step 36: nccl " << gpu_losses.back() << " cpu " << cpu_losses.back()
                                 << " plain cuda " << plain_losses.back());
    CHECK(sg::test::relative_error(gpu_losses, cpu_losses) < 2e-2);
    CHECK(sg::test::relative_error(gpu_losses, plain_losses) < 1e-2);
  }
}

// Issue 38: the fused CNN step stays in a data-parallel rank. Kernel 2 stores
// the summed gradients, the update stage all-reduces them, applies the
// optimizer and advances the step; the image is rebuilt from the updated
// weights at the next step's start. With one rank the all-reduce is exact,
// so every step must match the single-process fused step bit for bit: it
// applies the same update formula (sgd_step.cuh, update_rules/) inside kernel 2.
TEST_CASE("a data-parallel rank keeps the fused CNN step: gradients out, reduced and applied by the update stage") {
  SG_SKIP_IF_CORE_ONLY("the fused CNN step");
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    INFO(optimizer_name(kind));
    const Dataset data = random_dataset(64 * 5, 784, 10, rng);
    SequentialTraining t = test::report_cnn();
    t.optimizer.kind = kind;
    if (kind == OptimizerKind::adamw) t.optimizer.lr = 1e-3;
    TrainerSpec single_spec;
    single_spec.program = build_sequential_program(t, data.train.images.count, data.test.images.count, ProgramTarget::cuda);
    single_spec.shuffle_seed = 5;
    t.data_ranks = 1;
    TrainerSpec dp_spec = single_spec;
    dp_spec.program = build_sequential_program(t, data.train.images.count, data.test.images.count, ProgramTarget::cuda);
    dp_spec.data_parallel = single_rank();
    cuda::CudaTrainer single(single_spec, data), dp(dp_spec, data);
    INFO(dp.description());
    REQUIRE(single.description().find("cnn_step[") != std::string::npos);
    REQUIRE(dp.description().find("cnn_step[") != std::string::npos);
    CHECK(dp.description().find("gradients out") != std::string::npos);
    CHECK(nccl_launches(dp) == 4);
    for (int step = 1; step <= 12; ++step) {  // an epoch is 5 steps: reshuffles happen
      single.train(1);
      dp.train(1);
      CAPTURE(step);
      REQUIRE(std::isfinite(dp.last_loss()));
      CHECK(dp.last_loss() == single.last_loss());
    }
    // Weights, optimizer state, step counter (advanced by the update stage in
    // one, by kernel 2 in the other) and shuffle: the same bits (H200, NCCL 2.28).
    test::check_same_state(dp, single);
  }
}

TEST_CASE("single-rank NCCL runs: reruns are bit-identical, resume at the same rank count is bit-exact") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 37, 11, rng);
  const MlpTraining t = odd_training(1);
  TrainerSpec dp = spec_for(t, data, ProgramTarget::cuda);
  dp.data_parallel = single_rank();
  cuda::CudaTrainer a(dp, data);
  // b runs with a peer watchdog reading NCCL's asynchronous error from its
  // own thread every millisecond while the step is captured and replayed: no
  // false alarm, and the same bits as a (no peers: world size 1).
  std::atomic<int> reports{0};
  distributed::WatchdogOptions watch;
  watch.check_every = std::chrono::milliseconds(1);
  watch.report = [&](const std::string& line) {
    ++reports;
    MESSAGE(line);
  };
  dp.data_parallel = single_rank();
  dp.data_parallel.watchdog = std::make_shared<distributed::PeerWatchdog>(distributed::PeerLinks{}, watch);
  cuda::CudaTrainer b(dp, data);
  dp.data_parallel.watchdog = nullptr;
  // One trainer's graphs at a time: NCCL warns that graphs of several
  // communicators launched from one thread may deadlock.
  a.train(50);
  a.synchronize();
  b.train(50);
  b.synchronize();
  sg::test::check_same_state(a, b);
  CHECK(reports.load() == 0);
  // 50 + save + load + 50 == 100 straight.
  dp.data_parallel = single_rank();
  cuda::CudaTrainer resumed(dp, data);
  resumed.load_state(b.save_state());
  resumed.train(50);
  resumed.synchronize();
  a.train(50);
  a.synchronize();
  sg::test::check_same_state(a, resumed);
  // NCCL's non-blocking mode (its kernels launched from a helper thread) captures the same step.
  dp.data_parallel = single_rank(/*nonblocking=*/true);
  cuda::CudaTrainer nonblocking(dp, data);
  nonblocking.train(100);
  sg::test::check_same_state(a, nonblocking);
}

TEST_CASE("a trainer refuses a program built for another rank count than its group") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 37, 11, rng);
  TrainerSpec spec = spec_for(odd_training(2), data, ProgramTarget::cuda);
  CHECK_THROWS_WITH(cuda::CudaTrainer(spec, data), doctest::Contains("has no process group"));
  spec.data_parallel = single_rank();
  CHECK_THROWS_WITH(cuda::CudaTrainer(spec, data), doctest::Contains("built for 2 ranks but the process group has 1"));
}

namespace {

// The descriptor a re-executed child of the test below finds its "peer" on.
constexpr int kChildLinkFd = 100;
constexpr int kChildExitStatus = 3;
constexpr const char* kChildCase = "peer watchdog child: replays a single-rank NCCL step until its watchdog ends it";

}  // namespace

// Not a test of its own (skipped unless selected): the process the next test
// starts. It trains a single-rank NCCL step (CUDA graph replays with the
// all-reduces on the communication stream) with a peer watchdog whose one
// link, to a "rank 1", is the parent's socket; when the parent closes it the
// watchdog must print its line, abort the real communicator while replays
// run, and end this process with kChildExitStatus.
TEST_CASE("peer watchdog child: replays a single-rank NCCL step until its watchdog ends it" * doctest::skip()) {
  REQUIRE(::fcntl(kChildLinkFd, F_GETFD) >= 0);
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 37, 11, rng);
  TrainerSpec dp = spec_for(odd_training(1), data, ProgramTarget::cuda);
  dp.data_parallel = single_rank();
  distributed::PeerLinks links;
  links.rank = 0;
  links.world_size = 2;
  links.links.push_back({1, distributed::Socket(kChildLinkFd)});
  distributed::WatchdogOptions watch;
  watch.check_every = std::chrono::milliseconds(10);
  watch.abort_grace = std::chrono::milliseconds(5000);
  watch.exit_status = kChildExitStatus;
  dp.data_parallel.watchdog = std::make_shared<distributed::PeerWatchdog>(std::move(links), watch);
  cuda::CudaTrainer trainer(dp, data);
  trainer.train(20);
  trainer.synchronize();
  std::fprintf(stderr, "replaying\n");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) trainer.train(20);  // graph replays until the watchdog ends us
  trainer.synchronize();
  FAIL("the watchdog did not end this process within 60 s of replays");
}

TEST_CASE("a rank whose peer goes away mid-run: its watchdog aborts the real NCCL communicator during replays and "
          "ends the process with one line") {
  int link[2], err[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, link) == 0);
  REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // exec a fresh copy of this binary: CUDA is not usable in a forked child
    ::dup2(link[1], kChildLinkFd);  // dup2 clears close-on-exec on the copy
    ::dup2(err[1], 2);
    const std::string select = std::string("--test-case=") + kChildCase;
    ::execl("/proc/self/exe", "test_data_parallel_gpu", "--no-skip", select.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(link[1]);
  ::close(err[1]);
  std::string text;
  const auto read_some = [&](int timeout_ms) {
    pollfd p{err[0], POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t k = ::read(err[0], buf, sizeof buf);
    if (k <= 0) return false;
    text.append(buf, static_cast<std::size_t>(k));
    return true;
  };
  const auto start = std::chrono::steady_clock::now();
  while (text.find("replaying") == std::string::npos &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(90))
    if (!read_some(1000) && ::waitpid(pid, nullptr, WNOHANG) != 0) break;
  INFO("child stderr: " << text);
  REQUIRE(text.find("replaying") != std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // well inside the replays
  const auto closed = std::chrono::steady_clock::now();
  ::close(link[0]);  // "rank 1" is gone without a goodbye
  int status = 0;
  bool ended = false;
  while (!ended && std::chrono::steady_clock::now() - closed < std::chrono::seconds(20)) {
    read_some(50);
    ended = ::waitpid(pid, &status, WNOHANG) == pid;
  }
  if (!ended) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  while (read_some(100)) {
  }
  ::close(err[0]);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - closed).count();
  INFO("child stderr: " << text);
  MESSAGE("the watchdog ended the replaying rank " << seconds << " s after its peer went away");
  CHECK(ended);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kChildExitStatus);
  CHECK(text.find("data parallel: rank 0 lost rank 1 (its connection closed without a goodbye): aborting NCCL and "
                  "ending this rank") != std::string::npos);
  CHECK(seconds < 5.0);
}
