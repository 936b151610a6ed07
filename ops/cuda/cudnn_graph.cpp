#include "ops/cuda/cudnn_graph.hpp"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace sg::cuda::cudnn {

void check(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  throw CudaError(fmt::format("{}:{}: {} failed: {}{}{}", file, line, call, cudnnGetErrorString(status),
                              detail[0] ? ": " : "", detail));
}

Handle::Handle() { SG_CUDNN_CHECK(cudnnCreate(&h_)); }

Handle::~Handle() {
  if (h_ && cudnnDestroy(h_) != CUDNN_STATUS_SUCCESS) std::fprintf(stderr, "stepgraph: cudnnDestroy failed\n");
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) { SG_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }

Descriptor::~Descriptor() {
  if (d_ && cudnnBackendDestroyDescriptor(d_) != CUDNN_STATUS_SUCCESS)
    std::fprintf(stderr, "stepgraph: cudnnBackendDestroyDescriptor failed\n");
}

Descriptor& Descriptor::operator=(Descriptor&& other) noexcept {
  if (this != &other) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = std::exchange(other.d_, nullptr);
  }
  return *this;
}

void Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count,
                     const void* values) {
  SG_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
}

void Descriptor::set_descriptor(cudnnBackendAttributeName_t name, const Descriptor& value) {
  set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, value.address());
}

void Descriptor::set_int64s(cudnnBackendAttributeName_t name, const std::vector<std::int64_t>& values) {
  set(name, CUDNN_TYPE_INT64, static_cast<std::int64_t>(values.size()), values.data());
}

void Descriptor::finalize() { SG_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

bool Descriptor::try_finalize(bool internal_errors_too) {
  const cudnnStatus_t status = cudnnBackendFinalize(d_);
  if (status == CUDNN_STATUS_SUCCESS) return true;
  // An engine that cannot run this graph says NOT_SUPPORTED (any of its
  // sub-codes); anything else is a real failure, except where the caller
  // also skips internal errors (a candidate engine's runtime compilation
  // failing: CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED).
  if (status / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000) return false;
  if (internal_errors_too && status / 1000 == CUDNN_STATUS_INTERNAL_ERROR / 1000) return false;
  check(status, "cudnnBackendFinalize", __FILE__, __LINE__);
  return false;
}

std::vector<std::int64_t> packed_strides(const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> strides(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

Descriptor make_tensor(const TensorSpec& spec) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &spec.type);
  t.set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, spec.dims);
  t.set_int64s(CUDNN_ATTR_TENSOR_STRIDES, spec.strides);
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &spec.uid);
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &spec.alignment);
  const bool is_virtual = spec.is_virtual;
  t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  t.finalize();
  return t;
}

namespace {

struct EngineInfo {
  std::int64_t index = -1;
  std::vector<cudnnBackendNumericalNote_t> notes;
  bool runtime_compiled = false;  // finalizing its plan compiles a kernel (NVRTC): tens to hundreds of ms
};

// The global index and notes of an engine configuration's engine.
EngineInfo engine_of(cudnnBackendDescriptor_t config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  std::int64_t got = 0;
  cudnnBackendDescriptor_t raw = engine.get();
  SG_CUDNN_CHECK(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &raw));
  std::int64_t index = -1;
  SG_CUDNN_CHECK(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, &index));
  std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  std::int64_t count = 0;
  SG_CUDNN_CHECK(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                          static_cast<std::int64_t>(notes.size()), &count, notes.data()));
  notes.resize(static_cast<std::size_t>(count));
  std::vector<cudnnBackendBehaviorNote_t> behavior(CUDNN_BEHAVIOR_NOTE_TYPE_COUNT);
  SG_CUDNN_CHECK(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                          static_cast<std::int64_t>(behavior.size()), &count, behavior.data()));
  behavior.resize(static_cast<std::size_t>(count));
  const bool compiled = std::find(behavior.begin(), behavior.end(), CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) != behavior.end();
  return {index, notes, compiled};
}

// Adds the plan of one engine configuration, unless its engine is excluded,
// already there (with the same `knobs`), or cannot run the graph.
void add_plan(const Handle& handle, cudnnBackendDescriptor_t config,
              const std::vector<cudnnBackendNumericalNote_t>& excluded, bool compiled_too, std::vector<Plan>& plans,
              const std::string& knobs = {}) {
  const EngineInfo info = engine_of(config);
  const std::int64_t engine = info.index;
  if (std::any_of(info.notes.begin(), info.notes.end(), [&](auto n) {
        return std::find(excluded.begin(), excluded.end(), n) != excluded.end();
      }))
    return;
  if (info.runtime_compiled && !compiled_too) return;
  if (std::any_of(plans.begin(), plans.end(), [&](const Plan& p) { return p.engine == engine && p.knobs == knobs; }))
    return;
  Plan p;
  p.plan = Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  const cudnnHandle_t h = handle.get();
  p.plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  p.plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
  // (A knob variant's plan may refuse its value with any status: it is skipped.)
  if (knobs.empty() ? !p.plan.try_finalize(/*internal_errors_too=*/true)
                    : cudnnBackendFinalize(p.plan.get()) != CUDNN_STATUS_SUCCESS)
    return;
  std::int64_t got = 0;
  SG_CUDNN_CHECK(cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                          &got, &p.workspace_bytes));
  // (Some knob settings ask for gigabytes of workspace: not a candidate for a step.)
  constexpr std::int64_t kMostVariantWorkspace = std::int64_t(64) << 20;
  if (!knobs.empty() && p.workspace_bytes > kMostVariantWorkspace) return;
  p.engine = engine;
  p.knobs = knobs;
  p.runtime_compiled = info.runtime_compiled;
  plans.push_back(std::move(p));
}

void append_heuristic_plans(const Handle& handle, const Descriptor& graph, cudnnBackendHeurMode_t mode,
                            std::size_t limit, const std::vector<cudnnBackendNumericalNote_t>& excluded,
                            std::vector<Plan>& plans) {
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (!heuristics.try_finalize()) return;
  std::int64_t count = 0;
  SG_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  std::int64_t got = 0;
  SG_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
  for (std::int64_t i = 0; i < got && plans.size() < limit; ++i)
    add_plan(handle, raw[static_cast<std::size_t>(i)], excluded, /*compiled_too=*/true, plans);
}

// Engine `index` (cuDNN's global index) for the graph; false where the engine does not take it.
bool engine_at(const Descriptor& graph, std::int64_t index, Descriptor& engine) {
  engine = Descriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  engine.set_descriptor(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
  engine.set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
  return engine.try_finalize();
}

// Every engine cuDNN has for the graph, by global index, in its default
// configuration (no knobs set): the heuristics rank only a few at shapes this
// small, and the fastest is often not among them. Runtime-compiled ones are
// left to the heuristics: compiling all of them costs seconds at start-up.
void append_every_engine(const Handle& handle, const Descriptor& graph, std::size_t limit,
                         const std::vector<cudnnBackendNumericalNote_t>& excluded, std::vector<Plan>& plans) {
  std::int64_t count = 0, got = 0;
  SG_CUDNN_CHECK(cudnnBackendGetAttribute(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64,
                                          1, &got, &count));
  for (std::int64_t index = 0; index < count && plans.size() < limit; ++index) {
    Descriptor engine;
    if (!engine_at(graph, index, engine)) continue;
    Descriptor config(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    config.set_descriptor(CUDNN_ATTR_ENGINECFG_ENGINE, engine);
    if (config.try_finalize()) add_plan(handle, config.get(), excluded, /*compiled_too=*/false, plans);
  }
}

// A knob's name as cudnnBackendKnobType_t spells it (without CUDNN_KNOB_TYPE_), for launch labels.
std::string knob_name(cudnnBackendKnobType_t type) {
  switch (type) {
    case CUDNN_KNOB_TYPE_SWIZZLE: return "SWIZZLE";
    case CUDNN_KNOB_TYPE_TILE_SIZE: return "TILE_SIZE";
    case CUDNN_KNOB_TYPE_EDGE: return "EDGE";
    case CUDNN_KNOB_TYPE_MULTIPLY: return "MULTIPLY";
    case CUDNN_KNOB_TYPE_SPLIT_K_BUF: return "SPLIT_K_BUF";
    case CUDNN_KNOB_TYPE_TILEK: return "TILEK";
    case CUDNN_KNOB_TYPE_STAGES: return "STAGES";
    case CUDNN_KNOB_TYPE_REDUCTION_MODE: return "REDUCTION_MODE";
    case CUDNN_KNOB_TYPE_SPLIT_K_SLC: return "SPLIT_K_SLC";
    case CUDNN_KNOB_TYPE_IDX_MODE: return "IDX_MODE";
    case CUDNN_KNOB_TYPE_SPECFILT: return "SPECFILT";
    case CUDNN_KNOB_TYPE_KERNEL_CFG: return "KERNEL_CFG";
    case CUDNN_KNOB_TYPE_WORKSPACE: return "WORKSPACE";
    case CUDNN_KNOB_TYPE_TILE_CGA_M: return "TILE_CGA_M";
    case CUDNN_KNOB_TYPE_TILE_CGA_N: return "TILE_CGA_N";
    case CUDNN_KNOB_TYPE_BLOCK_SIZE: return "BLOCK_SIZE";
    case CUDNN_KNOB_TYPE_OCCUPANCY: return "OCCUPANCY";
    case CUDNN_KNOB_TYPE_ARRAY_SIZE_PER_THREAD: return "ARRAY_SIZE_PER_THREAD";
    case CUDNN_KNOB_TYPE_SPLIT_COLS: return "SPLIT_COLS";
    case CUDNN_KNOB_TYPE_TILE_ROWS: return "TILE_ROWS";
    case CUDNN_KNOB_TYPE_TILE_COLS: return "TILE_COLS";
    case CUDNN_KNOB_TYPE_LOAD_SIZE: return "LOAD_SIZE";
    case CUDNN_KNOB_TYPE_CTA_COUNT: return "CTA_COUNT";
    case CUDNN_KNOB_TYPE_STREAM_K: return "STREAM_K";
    case CUDNN_KNOB_TYPE_SPLIT_P_SLC: return "SPLIT_P_SLC";
    case CUDNN_KNOB_TYPE_TILE_M: return "TILE_M";
    case CUDNN_KNOB_TYPE_TILE_N: return "TILE_N";
    case CUDNN_KNOB_TYPE_WARP_SPEC_CFG: return "WARP_SPEC_CFG";
    default: return fmt::format("knob {}", static_cast<int>(type));  // (a deprecated or newer type)
  }
}

// The knobs an engine lets a configuration set, each with its range.
struct KnobRange {
  cudnnBackendKnobType_t type;
  std::int64_t minimum = 0, maximum = 0, stride = 1;
};

std::vector<KnobRange> knob_ranges(const Descriptor& engine) {
  std::vector<Descriptor> infos;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
    infos.emplace_back(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR);
    raw.push_back(infos.back().get());
  }
  std::int64_t got = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               static_cast<std::int64_t>(raw.size()), &got, raw.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  std::vector<KnobRange> ranges;
  for (std::int64_t i = 0; i < got; ++i) {
    KnobRange k{};
    std::int64_t n = 0;
    const cudnnBackendDescriptor_t d = raw[static_cast<std::size_t>(i)];
    const bool read =
        cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &k.type) == 0 &&
        cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n, &k.minimum) == 0 &&
        cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n, &k.maximum) == 0 &&
        cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &n, &k.stride) == 0;
    if (read && k.stride > 0 && k.maximum > k.minimum) ranges.push_back(k);
  }
  return ranges;
}

// One engine's configurations with ONE knob set to each value of its range
// (at most `per_knob` values, spread over the range), the other knobs at their
// defaults, while `plans` holds fewer than `limit`: the heuristics and the
// default configurations leave out, e.g., split-K settings that suit a small
// output and a long reduction (a filter gradient over a large batch).
void append_knob_variants(const Handle& handle, const Descriptor& engine, std::size_t limit,
                          const std::vector<cudnnBackendNumericalNote_t>& excluded, std::vector<Plan>& plans) {
  constexpr std::int64_t per_knob = 8;
  for (const KnobRange& k : knob_ranges(engine)) {
    const std::int64_t steps = (k.maximum - k.minimum) / k.stride + 1;
    const std::int64_t every = std::max<std::int64_t>(1, (steps + per_knob - 1) / per_knob);
    for (std::int64_t s = 0; s < steps && plans.size() < limit; s += every) {
      const std::int64_t value = k.minimum + s * k.stride;
      Descriptor choice(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
      choice.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &k.type);
      choice.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value);
      if (cudnnBackendFinalize(choice.get()) != CUDNN_STATUS_SUCCESS) continue;
      Descriptor config(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      config.set_descriptor(CUDNN_ATTR_ENGINECFG_ENGINE, engine);
      config.set(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, choice.address());
      if (cudnnBackendFinalize(config.get()) != CUDNN_STATUS_SUCCESS) continue;
      add_plan(handle, config.get(), excluded, /*compiled_too=*/false, plans,
               fmt::format("{}={}", knob_name(k.type), value));
    }
  }
}

}  // namespace

std::vector<Plan> candidate_plans(const Handle& handle, const Descriptor& graph, std::size_t limit,
                                  const std::vector<cudnnBackendNumericalNote_t>& excluded, bool every_engine) {
  std::vector<Plan> plans;
  append_heuristic_plans(handle, graph, CUDNN_HEUR_MODE_A, limit, excluded, plans);
  append_heuristic_plans(handle, graph, CUDNN_HEUR_MODE_FALLBACK, limit, excluded, plans);
  if (every_engine) append_every_engine(handle, graph, limit, excluded, plans);
  return plans;
}

std::vector<Plan> knob_variant_plans(const Handle& handle, const Descriptor& graph,
                                     const std::vector<std::int64_t>& engines, std::size_t limit,
                                     const std::vector<cudnnBackendNumericalNote_t>& excluded) {
  std::vector<Plan> plans;
  for (std::int64_t index : engines) {
    Descriptor engine;
    if (engine_at(graph, index, engine)) append_knob_variants(handle, engine, limit, excluded, plans);
  }
  return plans;
}

void execute(const Handle& handle, const Plan& plan, const std::vector<std::int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, cudaStream_t stream) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set_int64s(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<std::int64_t>(pointers.size()),
           pointers.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  SG_CUDNN_CHECK(cudnnSetStream(handle.get(), stream));
  SG_CUDNN_CHECK(cudnnBackendExecute(handle.get(), plan.plan.get(), pack.get()));
}

std::int64_t pointer_alignment(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  std::int64_t a = 16;
  while (a > 1 && address % static_cast<std::uintptr_t>(a) != 0) a /= 2;
  return a;
}

}  // namespace sg::cuda::cudnn
