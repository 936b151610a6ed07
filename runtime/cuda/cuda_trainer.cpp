#include "runtime/cuda/cuda_trainer.hpp"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/activation_layout_choice.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/floors.hpp"
#include "runtime/cuda/loss_watch.hpp"
#include "runtime/cuda/timed_layout_choice.hpp"
#include "runtime/epoch_schedule.hpp"
#include "runtime/cuda/rank_device.hpp"
#include "runtime/tensor_blob.hpp"
#ifdef STEPGRAPH_HAVE_NCCL
#include "runtime/cuda/nccl_communicator.hpp"
#include "runtime/cuda/nccl_window.hpp"
#endif

namespace sg::cuda {
namespace {

// A captured run of `steps` consecutive training steps (one kernel for all
// of them when the program keeps the weights resident on chip).
struct CapturedSteps {
  Graph graph;
  GraphExec exec;
  std::int64_t steps = 0;
};

CapturedSteps capture(const CudaProgram& program, std::int64_t steps, cudaStream_t stream) {
  begin_capture(stream);
  program.record_steps(stream, steps);
  CapturedSteps c;
  c.graph = end_capture(stream);
  c.exec = GraphExec(c.graph);
  c.steps = steps;
  return c;
}

// The program, checked against the data and against what this backend runs:
// f16 or bf16 activations, so whatever reads the image table must produce
// one of those (a model builder targets the CUDA backend for that).
const TrainingProgram& checked(const TrainingProgram& p, const Dataset& data) {
  check_training_program(p, data.train.images.count, data.test.images.count);
  for (const auto& [g, d] : {std::pair{&p.train, &p.train_data}, std::pair{&p.eval, &p.eval_data}})
    for (NodeId n : g->consumers(d->images))
      for (ValueId out : g->node(n).outputs)
        if (!is_half_width_float(g->value(out).dtype))
          throw std::invalid_argument(fmt::format(
              "the CUDA backend runs f16 or bf16 activations, but '{}' (read from the image table '{}') is {}: build the "
              "program for the CUDA backend",
              g->value(out).name, g->value(d->images).name, dtype_name(g->value(out).dtype)));
  return p;
}

// The program's own buffer of a bound graph-owned value.
DeviceBuffer& owned(CudaProgram& program, ValueId id) { return program.owned(program.graph().value(id).name); }

void upload_split(CudaProgram& program, const DataBindings& d, const data::Split& split) {
  owned(program, d.images).upload(split.images.pixels.data(), split.images.pixels.size());
  // Class labels (u8) or float targets (f32 [rows, K], own data).
  if (split.labels.target_width > 0)
    owned(program, d.labels).upload(split.labels.targets.data(), split.labels.targets.size() * sizeof(float));
  else
    owned(program, d.labels).upload(split.labels.labels.data(), split.labels.labels.size());
}


std::string float_blob_bytes(const Value& v, const std::vector<float>& values) {
  return blob_from_floats(v.name, v.shape, v.dtype, values).bytes;
}

}  // namespace

struct CudaTrainer::Impl {
  std::string layout_choice;  // "channels-last (...)" or "NCHW (...)": activation_layout_choice.hpp
  TrainerSpec spec;
  DataBindings train_data, eval_data;
  int device = -1;  // a data-parallel rank's GPU (select_device), set before the stream and handles below exist
  Stream stream;
  LtHandle lt;
  DeviceValues params;
#ifdef STEPGRAPH_HAVE_NCCL
  std::unique_ptr<NcclCommunicator> communicator;  // data parallel only; outlives the programs and graphs below
#endif
  std::unique_ptr<CudaProgram> train;
  std::unique_ptr<CudaProgram> eval;
  CapturedSteps one_step, many_steps, eval_step;
  EpochSchedule epochs;
  std::int64_t eval_batches = 0;
  std::vector<std::pair<std::string, double>> setup_phases;  // Trainer::setup_phases
  DeviceBuffer first_nonfinite;  // loss_watch.hpp: -1 until a loss is not finite

  Impl(const TrainerSpec& s, const Dataset& data)
      : spec(with_activation_layout(s, device_available(), layout_choice)),
        train_data(checked(spec.program, data).train_data),
        eval_data(spec.program.eval_data),
        device(select_device(s.data_parallel, spec.program)),
        epochs(data.train.images.count, train_data.batch * train_data.ranks, s.shuffle_seed) {
    if (!device_available()) throw CudaError("no CUDA GPU is available (cudaGetDeviceCount found none)");
    auto part_start = std::chrono::steady_clock::now();
    const auto end_part = [&](const char* part) {
      const auto now = std::chrono::steady_clock::now();
      setup_phases.emplace_back(part, std::chrono::duration<double>(now - part_start).count());
      part_start = now;
    };
    ProgramOptions options;
    options.backend = s.backend;
    if (!s.cuda_graph) options.backend.steps_per_launch = 1;  // stream launches: one step per record
    options.learning_rate = spec.program.learning_rate;
    options.shared_state = shared_state_names(spec.program);
#ifdef STEPGRAPH_HAVE_NCCL
    if (s.data_parallel.world_size > 0) {
      const auto timeout = std::chrono::milliseconds(static_cast<long long>(s.data_parallel.timeout_s * 1000));
      const NcclTuning tuning{s.data_parallel.nccl_ctas, s.data_parallel.symmetric_memory};
      communicator = std::make_unique<NcclCommunicator>(s.data_parallel.nccl_id, s.data_parallel.rank,
                                                        s.data_parallel.world_size, timeout,
                                                        s.data_parallel.nonblocking_nccl, tuning);
      // From here on a dead peer or an NCCL error aborts the communicator
      // (releasing a stuck replay) and ends this rank: no hang.
      if (s.data_parallel.watchdog) communicator->watched_by(*s.data_parallel.watchdog);
      options.communicator = communicator.get();
      end_part("joining the NCCL communicator");
    }
#endif
    ProgramOptions train_options = options;
#ifdef STEPGRAPH_HAVE_NCCL
    if (communicator) put_arena_in_window(train_options, *communicator);  // only the training step all-reduces
#endif
    train = std::make_unique<CudaProgram>(spec.program.train, params, lt, train_options, stream.get());
    end_part("lowering the training step (cover, memory plan, cuBLASLt plans and autotune)");
    for (const auto& [part, seconds] : train->setup_parts()) setup_phases.emplace_back("    " + part, seconds);
    eval = std::make_unique<CudaProgram>(spec.program.eval, params, lt, options, stream.get());
    end_part("lowering the eval step");
    upload_split(*train, train_data, data.train);
    upload_split(*eval, eval_data, data.test);
    eval_batches = data.test.images.count / eval_data.batch;
    reset_loss_watch();
    std::vector<std::int32_t> identity(static_cast<std::size_t>(data.test.images.count));
    std::iota(identity.begin(), identity.end(), 0);
    owned(*eval, eval_data.perm).upload(identity.data(), identity.size() * sizeof(std::int32_t));
    for (const auto& p : spec.program.init) {
      const Value& v = train->graph().value(train->graph().value_named(p.name));
      const auto bytes = float_blob_bytes(v, p.values);
      params.at(p.name).upload(bytes.data(), bytes.size());
    }
    train->parameters_written(stream.get());
    train->set_learning_rate(spec.program.learning_rate, stream.get());
    stream.synchronize();
    end_part("uploading the dataset and initial parameters");
#ifdef STEPGRAPH_HAVE_NCCL
    if (communicator) {
      // Each gradient bucket's all-reduce once outside capture, so NCCL sets
      // up its connections (lazily, on first use) before the graph records
      // them; and each sharded parameter's all-gather (ZeRO-1), which reads
      // the parameter. They write only arena slots no step has filled yet.
      for (std::size_t i = 0; i < train->schedule().launches.size(); ++i)
        if (const auto name = train->schedule().launches[i].lowering->name();
            name == "nccl_all_reduce" || name == "nccl_all_gather")
          train->record_launch(i, stream.get());
      stream.synchronize();
      communicator->check_async();
      end_part("NCCL warm-up (each gradient bucket's collective once)");
    }
#endif
    if (s.cuda_graph) {
      one_step = capture(*train, 1, stream.get());
      if (s.backend.steps_per_launch > 1) many_steps = capture(*train, s.backend.steps_per_launch, stream.get());
      eval_step = capture(*eval, 1, stream.get());
      end_part("capturing and instantiating the CUDA graphs");
    }
  }

  // `watch_from` >= 0: the global step before these; a loss watch follows every launch.
  void run_train_steps(std::int64_t steps, std::int64_t watch_from = -1) {
    while (steps > 0) {
      if (many_steps.steps > 1 && steps >= many_steps.steps) {
        many_steps.exec.launch(stream.get());
        steps -= many_steps.steps;
        watch_from = watch(watch_from, many_steps.steps);
      } else if (one_step.steps == 1) {
        one_step.exec.launch(stream.get());
        --steps;
        watch_from = watch(watch_from, 1);
      } else {
        train->record(stream.get());
        --steps;
        watch_from = watch(watch_from, 1);
      }
    }
  }

  std::int64_t watch(std::int64_t before, std::int64_t steps) {
    if (before < 0) return before;
    enqueue_loss_watch(static_cast<const float*>(train->device_ptr(train_data.loss)), first_nonfinite.as<long long>(),
                       before + steps, stream.get());
    return before + steps;
  }

  void reset_loss_watch() {
    const long long none = -1;
    if (!first_nonfinite.data()) first_nonfinite = DeviceBuffer(sizeof none);
    stream.synchronize();
    first_nonfinite.upload(&none, sizeof none);
  }

  void set_device_step(CudaProgram& program, const DataBindings& d, std::int64_t step) {
    const auto value = static_cast<std::int32_t>(step);
    stream.synchronize();
    owned(program, d.step).upload(&value, sizeof value);
  }

  void upload_permutation_if_needed(std::int64_t step) {
    if (auto perm = epochs.permutation_if_changed(step)) {
      stream.synchronize();  // epoch boundaries are rare: a plain synchronous upload is fine
      owned(*train, train_data.perm).upload(perm->data(), perm->size() * sizeof(std::int32_t));
    }
  }
};

CudaTrainer::CudaTrainer(const TrainerSpec& spec, const Dataset& data)
    : impl_(layout_timing_skipped(spec).empty() ? std::unique_ptr<Impl>(faster_layout(spec, data))
                                                 : std::make_unique<Impl>(spec, data)) {}

void CudaTrainer::note_layout_timing(std::string choice, double seconds) {
  impl_->layout_choice = std::move(choice);
  impl_->setup_phases.emplace_back("building and timing the other activation layout (backend.autotune)", seconds);
}

CudaTrainer::~CudaTrainer() = default;

std::vector<std::pair<std::string, double>> CudaTrainer::setup_phases() const { return impl_->setup_phases; }

std::string CudaTrainer::description() const {
  cudaDeviceProp prop{};
  int device = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  SG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const auto& s = impl_->spec;
  const auto& program = *impl_->train;
  // One whole-step launch, or the whole-step kernel with the update stage's
  // launch after it (an update rule: no fast path declined), both named.
  std::string whole_step;
  if (program.uses_whole_step()) {
    whole_step = fmt::format(" ({})", program.launch_label(0));
  } else if (const std::string why = program.declined_reason("whole_step"); !why.empty()) {
    whole_step = fmt::format(" (whole-step kernel not used: {})", why);
  } else {
    std::vector<std::string> labels;
    for (std::size_t i = 0; i < program.schedule().launches.size(); ++i) labels.push_back(program.launch_label(i));
    whole_step = fmt::format(" ({})", fmt::join(labels, "; "));
  }
  return fmt::format("cuda on {} ({}, {} launches per step{}{}, {} accumulate, {} activations)", prop.name,
                     s.cuda_graph ? "CUDA graph replay" : "stream launches", program.schedule().launches.size(),
                     whole_step,
                     s.cuda_graph && s.backend.steps_per_launch > 1
                         ? fmt::format(", {} steps per graph", s.backend.steps_per_launch)
                         : "",
                     s.backend.accumulate_f16 ? "fp16" : "fp32", impl_->layout_choice);
}

std::vector<std::pair<std::string, std::string>> CudaTrainer::declined_fast_paths() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& d : impl_->train->declined_fast_paths()) out.emplace_back(d.name, d.reason);
  return out;
}

void CudaTrainer::train(std::int64_t steps) {
  while (steps > 0) {
    impl_->upload_permutation_if_needed(step_);
    const auto chunk = std::min(steps, impl_->epochs.steps_left_in_epoch(step_));
    impl_->run_train_steps(chunk, step_);
    step_ += chunk;
    steps -= chunk;
  }
}

std::int64_t CudaTrainer::first_nonfinite_step() {
  impl_->stream.synchronize();
  long long first = -1;
  impl_->first_nonfinite.download(&first, sizeof first);
  return first;
}

double CudaTrainer::last_loss() {
  impl_->stream.synchronize();
  float loss = 0;
  SG_CUDA_CHECK(
      cudaMemcpy(&loss, impl_->train->device_ptr(impl_->train_data.loss), sizeof loss, cudaMemcpyDeviceToHost));
  return loss;
}

EvalResult CudaTrainer::evaluate_cancellable(const EvalStopCheck& stop_requested) {
  auto& im = *impl_;
  gather_shards();  // every rank evaluates: the eval program reads whole parameters
  im.set_device_step(*im.eval, im.eval_data, 0);
  const auto batch = im.eval_data.batch;
  double loss_sum = 0, correct = 0;
  std::int64_t b = 0;
  bool stopped = false;
  for (; b < im.eval_batches; ++b) {
    if (stop_requested && stop_requested()) {  // each batch is synchronized below: a stop waits for one batch at most
      stopped = true;
      break;
    }
    if (im.eval_step.steps == 1) im.eval_step.exec.launch(im.stream.get());
    else im.eval->record(im.stream.get());
    im.stream.synchronize();
    float loss = 0;
    std::int32_t hits = 0;
    SG_CUDA_CHECK(cudaMemcpy(&loss, im.eval->device_ptr(im.eval_data.loss), sizeof loss, cudaMemcpyDeviceToHost));
    if (im.eval_data.correct)  // a regression eval has no correct count
      SG_CUDA_CHECK(cudaMemcpy(&hits, im.eval->device_ptr(*im.eval_data.correct), sizeof hits, cudaMemcpyDeviceToHost));
    loss_sum += double(loss) * double(batch);
    correct += hits;
  }
  const double n = double(std::max<std::int64_t>(1, b * batch));
  return {loss_sum / n, im.eval_data.correct ? correct / n : NAN, b * batch, stopped};
}

void CudaTrainer::gather_shards() {
  if (impl_->train->gather_shards(impl_->stream.get())) impl_->stream.synchronize();
}

void CudaTrainer::set_learning_rate(double lr) { impl_->train->set_learning_rate(lr, impl_->stream.get()); }

std::vector<io::TensorBlob> CudaTrainer::save_state() {
  impl_->stream.synchronize();
  const sg::Graph& g = impl_->train->graph();
  std::vector<io::TensorBlob> blobs;
  for (Role role : {Role::param, Role::state})
    for (ValueId id : g.values_with_role(role)) {
      if (id == impl_->train_data.step) continue;
      const Value& v = g.value(id);
      io::TensorBlob blob{v.name, v.dtype, v.shape, std::string(value_bytes(v), '\0')};
      SG_CUDA_CHECK(cudaMemcpy(blob.bytes.data(), impl_->train->device_ptr(id), blob.bytes.size(), cudaMemcpyDeviceToHost));
      blobs.push_back(std::move(blob));
    }
  blobs.push_back(step_blob(step_));
  return blobs;
}

void CudaTrainer::load_state(const std::vector<io::TensorBlob>& blobs) {
  impl_->stream.synchronize();
  const sg::Graph& g = impl_->train->graph();
  for (const auto& blob : blobs) {
    if (blob.name == kStepEntry) continue;
    const auto id = g.find_value(blob.name);
    const bool restorable = id && (g.value(*id).role == Role::param || g.value(*id).role == Role::state) &&
                            *id != impl_->train_data.step;
    if (!restorable || g.value(*id).shape != blob.shape)
      throw std::invalid_argument(fmt::format("state entry '{}' {} does not match the model", blob.name, shape_string(blob.shape)));
    const Value& v = g.value(*id);
    // Same dtype: raw bytes (bit-exact resume); otherwise convert through float.
    const std::string bytes = blob.dtype == v.dtype ? blob.bytes : float_blob_bytes(v, floats_from_blob(blob));
    SG_CUDA_CHECK(cudaMemcpy(impl_->train->device_ptr(*id), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  // Pageable copies may return before their DMA lands, and the stream below
  // does not wait for the default stream (DeviceBuffer::upload says more).
  SG_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  impl_->train->parameters_written(impl_->stream.get());
  step_ = step_from_blobs(blobs);
  impl_->set_device_step(*impl_->train, impl_->train_data, step_);
  impl_->reset_loss_watch();
}

void CudaTrainer::replay_steps(std::int64_t steps) {
  if (impl_->one_step.steps != 1) throw CudaError("replay_steps: this trainer was built without CUDA graphs");
  impl_->run_train_steps(steps);
  step_ += steps;
}

void CudaTrainer::launch_steps(std::int64_t steps) {
  for (std::int64_t i = 0; i < steps; ++i) impl_->train->record(impl_->stream.get());
  step_ += steps;
}

void CudaTrainer::synchronize() const { impl_->stream.synchronize(); }
void* CudaTrainer::stream_handle() const { return impl_->stream.get(); }

std::vector<LaunchTiming> CudaTrainer::profile_step(int repeats) {
  auto& program = *impl_->train;
  if (program.uses_whole_step()) {  // one launch: time its phases instead
    std::vector<LaunchTiming> out;
    for (const auto& [phase, us] : program.profile_whole_step(repeats, impl_->stream.get()))
      out.push_back({"whole_step: " + phase, us / 1e3});
    step_ += repeats;
    return out;
  }
  const auto count = program.schedule().launches.size();
  cudaStream_t s = impl_->stream.get();
  std::vector<std::vector<double>> us(count);
  for (int r = 0; r < repeats; ++r) {
    std::vector<Event> marks(count + 1);
    enqueue_busy_wait(s, 5000.0);  // the host enqueues the whole step while the GPU waits
    marks[0].record(s);
    for (std::size_t i = 0; i < count; ++i) {
      program.record_launch(i, s);
      marks[i + 1].record(s);
    }
    marks[count].synchronize();
    ++step_;
    for (std::size_t i = 0; i < count; ++i) us[i].push_back(1e3 * Event::elapsed_ms(marks[i], marks[i + 1]));
  }
  std::vector<LaunchTiming> out;
  for (std::size_t i = 0; i < count; ++i) {
    std::sort(us[i].begin(), us[i].end());
    out.push_back({program.launch_label(i), us[i][us[i].size() / 2] / 1e3});
  }
  return out;
}

StepProfile CudaTrainer::profile_launches(int repeats) {
  if (repeats < 1) throw CudaError("profile_launches: repeats must be >= 1");
  auto& program = *impl_->train;
  const auto count = program.schedule().launches.size();
  cudaStream_t s = impl_->stream.get();
  const double wait_us = 5000.0 + 20.0 * double(count);  // longer than the host needs to enqueue one step
  StepProfile p;
  p.launches.resize(count);
  for (int r = 0; r < repeats; ++r) {  // every launch between its own two events
    std::vector<Event> starts(count), ends(count);
    enqueue_busy_wait(s, wait_us);
    for (std::size_t i = 0; i < count; ++i) {
      starts[i].record(s);
      program.record_launch(i, s);
      ends[i].record(s);
    }
    ends[count - 1].synchronize();
    ++step_;
    for (std::size_t i = 0; i < count; ++i) {
      p.launches[i].start_us.push_back(1e3 * Event::elapsed_ms(starts[0], starts[i]));
      p.launches[i].dur_us.push_back(1e3 * Event::elapsed_ms(starts[i], ends[i]));
    }
  }
  for (int r = 0; r < repeats; ++r) {  // the same launches with no events between them
    Event a, b;
    enqueue_busy_wait(s, wait_us);
    a.record(s);
    program.record(s);
    b.record(s);
    b.synchronize();
    ++step_;
    p.stream_step_us.push_back(1e3 * Event::elapsed_ms(a, b));
  }
  if (impl_->one_step.steps == 1) {
    for (int r = 0; r < repeats; ++r) {  // one graph replay per event pair
      Event a, b;
      enqueue_busy_wait(s, wait_us);
      a.record(s);
      impl_->one_step.exec.launch(s);
      b.record(s);
      b.synchronize();
      ++step_;
      p.replay_step_us.push_back(1e3 * Event::elapsed_ms(a, b));
    }
    Event a, b;  // replays back to back, as training runs them
    enqueue_busy_wait(s, 5000.0 + 10.0 * repeats);
    a.record(s);
    for (int r = 0; r < repeats; ++r) impl_->one_step.exec.launch(s);
    b.record(s);
    b.synchronize();
    step_ += repeats;
    p.replay_back_to_back_us = 1e3 * Event::elapsed_ms(a, b) / repeats;
  }
  return p;
}

std::size_t CudaTrainer::cuda_graph_nodes() const {
  if (!impl_->one_step.graph.get()) return 0;
  std::size_t n = 0;
  SG_CUDA_CHECK(cudaGraphGetNodes(impl_->one_step.graph.get(), nullptr, &n));
  return n;
}

std::size_t CudaTrainer::dump_cuda_graph(const std::string& path) const {
  if (!impl_->one_step.graph.get()) throw CudaError("dump_cuda_graph: built without CUDA graphs");
  SG_CUDA_CHECK(cudaGraphDebugDotPrint(impl_->one_step.graph.get(), path.c_str(), cudaGraphDebugDotFlagsVerbose));
  return cuda_graph_nodes();
}

const CudaProgram& CudaTrainer::training_program() const { return *impl_->train; }

void CudaTrainer::poison_activations() { impl_->train->poison_arena(impl_->stream.get()); }

std::unique_ptr<Trainer> make_cuda_trainer(const TrainerSpec& spec, const Dataset& data) {
  return std::make_unique<CudaTrainer>(spec, data);
}

}  // namespace sg::cuda
