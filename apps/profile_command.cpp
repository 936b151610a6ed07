#include "apps/profile_command.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/backend_choice.hpp"
#include "apps/cli_bounds.hpp"
#include "apps/load_dataset.hpp"
#include "apps/profile_cost.hpp"
#include "apps/report/sm_clock.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/epoch_schedule.hpp"
#include "runtime/io/atomic_file.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include <cuda_runtime.h>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/cuda/floors.hpp"
#include "apps/profile_stream_model.hpp"
#endif

namespace sg::app {

void add_profile_options(CLI::App& cmd, ProfileRequest& r) {
  cmd.add_option("--steps", r.steps, "profiled steps (median and min over these)")->capture_default_str()->check(integer_in(1));
  cmd.add_option("--warmup", r.warmup, "untimed steps first")->capture_default_str()->check(integer_in(0));
  cmd.add_option("--trace", r.trace, "Chrome/Perfetto trace path (default <out-dir>/trace.json)");
  cmd.add_option("--out-dir", r.out_dir, "where profile.{txt,csv,json,svg} go (default <run.out_dir>/profile)");
  cmd.add_flag("!--no-floors", r.floors, "CUDA: skip measuring the bench floors (rates then read against nominal H100 peaks)");
}

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double us_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

double min_of(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

std::string ops_of(const Graph& g, const std::vector<NodeId>& nodes) {
  std::vector<std::string> ops;
  for (NodeId n : nodes) ops.emplace_back(op_name(g.node(n).op));
  return fmt::format("{}", fmt::join(ops, "+"));
}

// Output shapes of the nodes (the updated value for an in-place node).
std::string shapes_of(const Graph& g, const std::vector<NodeId>& nodes) {
  std::vector<std::string> parts;
  for (NodeId n : nodes) {
    const Node& node = g.node(n);
    const auto& vs = node.outputs.empty() && !node.inputs.empty() ? std::vector<ValueId>{node.inputs[0]} : node.outputs;
    for (ValueId v : vs)
      parts.push_back(fmt::format("{}{} {}", g.value(v).name, shape_string(g.value(v).shape), dtype_name(g.value(v).dtype)));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

json node_args(const Graph& g, const std::vector<NodeId>& nodes) {
  json list = json::array();
  for (NodeId n : nodes) list.push_back(fmt::format("{} {}", n, op_name(g.node(n).op)));
  return {{"nodes", list}, {"shapes", shapes_of(g, nodes)}};
}

void fill_shares(report::ProfileReport& r) {
  const double sum = r.sum_median_us();
  for (auto& row : r.rows) row.share = sum > 0 ? row.median_us / sum : 0;
}

// ---- CPU: the reference executor, node by node --------------------------------

ProfileResult profile_cpu(const TrainConfig& config, const ProfileRequest& req, const Dataset& data,
                          report::RunTiming& timing, const std::string& note) {
  const auto spec = trainer_spec(config, data.train.images.count, data.test.images.count, ProgramTarget::cpu,
                                 data.train.images.dtype);
  check_training_program(spec.program, data.train.images.count, data.test.images.count);
  const auto& d = spec.program.train_data;
  auto exec = timing.time("backend construction (CPU executor, parameters)", [&] {
    auto e = std::make_unique<CpuExecutor<float>>(spec.program.train);
    e->tensor(d.images).u8 = data.train.images.pixels;
    e->tensor(d.labels).u8 = data.train.labels.labels;
    EpochSchedule epochs(data.train.images.count, d.batch, spec.shuffle_seed);
    e->tensor(d.perm).i32 = *epochs.permutation_if_changed(0);
    for (const auto& p : spec.program.init) e->tensor(p.name).real = p.values;
    e->set_learning_rate(spec.program.learning_rate);
    return e;
  });
  const Graph& g = exec->graph();
  timing.time("warm-up steps", [&] {
    for (int i = 0; i < req.warmup; ++i) exec->run();
  });

  // Units: a fusion group (all its nodes) or a lone node, in order of first node.
  std::vector<std::vector<NodeId>> units;
  std::vector<std::string> unit_names;
  std::vector<int> unit_of(g.nodes().size());
  std::map<int, int> unit_of_group;
  for (const Node& n : g.nodes()) {
    int u;
    if (n.fusion_group >= 0 && unit_of_group.count(n.fusion_group)) {
      u = unit_of_group[n.fusion_group];
    } else {
      u = int(units.size());
      units.emplace_back();
      unit_names.push_back(n.fusion_group >= 0 ? std::string(fusion_name(g.fusion_groups()[std::size_t(n.fusion_group)].kind))
                                               : std::string(op_name(n.op)));
      if (n.fusion_group >= 0) unit_of_group[n.fusion_group] = u;
    }
    units[std::size_t(u)].push_back(n.id);
    unit_of[std::size_t(n.id)] = u;
  }

  ProfileResult res;
  res.tracks = {{1, 1, "stepgraph profile " + config.source + " (CPU)", "reference executor: one event per node"},
                {1, 2, "stepgraph profile " + config.source + " (CPU)", "whole step (CpuExecutor::run)"}};
  const std::size_t n_nodes = g.nodes().size();
  std::vector<std::vector<double>> dur(units.size()), gap(units.size()), start(units.size());
  std::vector<double> step_us;
  const auto t0 = Clock::now();
  timing.time("profiled steps", [&] {
    for (int r = 0; r < req.steps; ++r) {
      std::vector<Clock::time_point> before(n_nodes), after(n_nodes);
      for (std::size_t i = 0; i < n_nodes; ++i) {
        before[i] = Clock::now();
        exec->run_node(g.nodes()[i]);
        after[i] = Clock::now();
      }
      std::vector<double> u_dur(units.size(), 0), u_gap(units.size(), 0), u_start(units.size(), -1);
      for (std::size_t i = 0; i < n_nodes; ++i) {
        const auto u = std::size_t(unit_of[i]);
        u_dur[u] += us_between(before[i], after[i]);
        if (i > 0) u_gap[u] += us_between(after[i - 1], before[i]);
        if (u_start[u] < 0) u_start[u] = us_between(before[0], before[i]);
        res.events.push_back({fmt::format("{}: {}", unit_names[u], op_name(g.nodes()[i].op)), "cpu_node",
                              us_between(t0, before[i]), us_between(before[i], after[i]), 1, 1,
                              node_args(g, {NodeId(i)})});
      }
      for (std::size_t u = 0; u < units.size(); ++u) {
        dur[u].push_back(u_dur[u]);
        gap[u].push_back(u_gap[u]);
        start[u].push_back(u_start[u]);
      }
    }
    for (int r = 0; r < req.steps; ++r) {  // the same step with no per-node clock reads
      const auto a = Clock::now();
      exec->run();
      const auto b = Clock::now();
      step_us.push_back(us_between(a, b));
      res.events.push_back({"step", "cpu_step", us_between(t0, a), us_between(a, b), 1, 2, json::object()});
    }
  });

  auto& rep = res.report;
  rep.config = config.source;
  rep.backend = "cpu (f32 reference executor, one row per fusion group or lone node)" + (note.empty() ? "" : "; " + note);
  rep.device = "host CPU";
  rep.method = "std::chrono::steady_clock around every CpuExecutor::run_node; rows sum their nodes";
  rep.repeats = req.steps;
  for (std::size_t u = 0; u < units.size(); ++u) {
    report::ProfileRow row;
    row.index = int(u);
    row.name = unit_names[u];
    row.label = fmt::format("U{} {} ({})", u, unit_names[u], ops_of(g, units[u]));
    row.nodes.assign(units[u].begin(), units[u].end());
    row.ops = ops_of(g, units[u]);
    row.shapes = shapes_of(g, units[u]);
    row.median_us = report::median(dur[u]);
    row.min_us = min_of(dur[u]);
    row.gap_us = report::median(gap[u]);
    row.start_us = report::median(start[u]);
    const auto cost = nodes_cost(g, units[u]);
    row.bytes = cost.bytes;
    row.flops = cost.flops;
    rep.rows.push_back(row);
  }
  fill_shares(rep);
  double sum_min = 0;
  for (const auto& row : rep.rows) sum_min += row.min_us;
  rep.totals = {{"sum of rows (median each)", rep.sum_median_us(), ""},
                {"sum of rows (min each)", sum_min, ""},
                {"whole step, CpuExecutor::run (median)", report::median(step_us), "no clock reads between nodes"},
                {"whole step, CpuExecutor::run (min)", min_of(step_us), ""}};
  rep.peak_source = "no CPU peak assumed: GB/s and TFLOP/s are achieved rates only";
  rep.extra["step_us_samples"] = step_us;
  rep.extra["trace_note"] = "timestamps as measured, from the first profiled step's start";
  return res;
}

// ---- CUDA: per-launch events, stream step, graph replay -------------------------

#ifdef STEPGRAPH_HAVE_CUDA
json clock_json(double mhz) { return std::isfinite(mhz) ? json(mhz) : json(nullptr); }

ProfileResult profile_cuda(const TrainConfig& config, const ProfileRequest& req, const Dataset& data,
                           report::RunTiming& timing) {
  check_cuda_can_run(config);  // CNN layers: one clear line, not a scheduler error
  const auto spec = trainer_spec(config, data.train.images.count, data.test.images.count, ProgramTarget::cuda,
                                 data.train.images.dtype);
  const std::string construction = "backend construction (upload, lowering, autotune, capture)";
  auto trainer = timing.time(construction, [&] { return std::make_unique<cuda::CudaTrainer>(spec, data); });
  for (const auto& [part, seconds] : trainer->setup_phases()) timing.add_part(construction, part, seconds);
  const auto& program = trainer->training_program();
  const Graph& g = program.graph();
  timing.time("warm-up steps", [&] {
    trainer->train(req.warmup);
    trainer->synchronize();
  });
  cuda::Floors floors;
  if (req.floors) floors = timing.time("bench floors (empty launch, graph node, copy, matmul)", [] { return cuda::measure_floors(); });
  const double clock_before = report::sm_clock_mhz();
  const auto p = timing.time("profiled steps", [&] { return trainer->profile_launches(req.steps); });
  const double clock_after = report::sm_clock_mhz();
  json phases = json::array();
  if (program.uses_whole_step())
    for (const auto& t : trainer->profile_step(std::min(req.steps, 9))) phases.push_back({{"phase", t.label}, {"us", 1e3 * t.ms}});

  cudaDeviceProp prop{};
  int device = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  SG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));

  ProfileResult res;
  auto& rep = res.report;
  rep.config = config.source;
  rep.backend = trainer->description();
  rep.device = fmt::format("{} ({} SMs)", prop.name, prop.multiProcessorCount);
  rep.method = "CUDA events before and after every launch on one stream, each step queued behind a GPU busy-wait "
               "(no host gaps); totals: the same step with events only at its ends (stream) and by graph replay";
  rep.repeats = req.steps;
  const auto& launches = program.schedule().launches;
  const std::size_t count = launches.size();
  for (std::size_t i = 0; i < count; ++i) {
    const Launch& l = launches[i];
    const std::vector<NodeId>& nodes = l.nodes;  // riders (the step advance) are among them already
    report::ProfileRow row;
    row.index = int(i);
    row.name = std::string(l.lowering->name());
    row.label = program.launch_label(i);
    row.nodes.assign(nodes.begin(), nodes.end());
    row.ops = ops_of(g, nodes);
    row.shapes = shapes_of(g, nodes);
    const auto& s = p.launches[i];
    row.median_us = report::median(s.dur_us);
    row.min_us = min_of(s.dur_us);
    row.start_us = report::median(s.start_us);
    std::vector<double> gaps;
    for (std::size_t r = 0; r < s.start_us.size(); ++r)
      gaps.push_back(i == 0 ? 0.0 : s.start_us[r] - (p.launches[i - 1].start_us[r] + p.launches[i - 1].dur_us[r]));
    row.gap_us = report::median(gaps);
    std::vector<ValueId> written = l.writes;
    written.insert(written.end(), l.carries.begin(), l.carries.end());  // compute copies written for the next step
    const auto cost = launch_cost(g, nodes, l.reads, written, l.updates);
    row.bytes = cost.bytes;
    row.flops = cost.flops;
    rep.rows.push_back(row);
  }
  fill_shares(rep);
  std::vector<double> span;  // first start event -> last end event, per repeat
  for (std::size_t r = 0; r < std::size_t(req.steps); ++r)
    span.push_back(p.launches[count - 1].start_us[r] + p.launches[count - 1].dur_us[r]);
  const double sum = rep.sum_median_us();
  const double stream = report::median(p.stream_step_us);
  rep.totals = {{"sum of launches (median each)", sum, "each launch between its own event pair"},
                {"step with per-launch events (median span)", report::median(span), "sum + gaps between launches"},
                {"stream step, no events between launches", stream,
                 fmt::format("sum of launches / this = {:.2f}: how much the event pairs inflate", stream > 0 ? sum / stream : 0.0)}};
  if (!p.replay_step_us.empty()) {
    rep.totals.push_back({"graph replay, one step per event pair", report::median(p.replay_step_us), ""});
    rep.totals.push_back({"graph replay, back to back (mean per step)", p.replay_back_to_back_us,
                          fmt::format("what training sees; sum of launches - this = {:.2f} us", sum - p.replay_back_to_back_us)});
  }
  rep.totals.push_back(stream_model_total(program.stream_plan(), rep.rows, stream, rep.extra));
  if (req.floors) {
    rep.totals.push_back({"floor: launches x empty graph node", floors.graph_node_us * double(count),
                          fmt::format("{:.2f} us per empty-kernel graph node (bench floor)", floors.graph_node_us)});
    rep.peak_gbs = floors.copy_bandwidth_gbs;
    rep.peak_tflops = floors.matmul_tflops;
    rep.peak_source = "floors measured now: D2D copy bandwidth, cuBLASLt fp16 8192^3 matmul";
    rep.extra["floors"] = {{"empty_launch_us", floors.empty_launch_us}, {"graph_node_us", floors.graph_node_us},
                           {"copy_bandwidth_gbs", floors.copy_bandwidth_gbs}, {"matmul_tflops", floors.matmul_tflops}};
  } else {
    rep.peak_gbs = 3350;
    rep.peak_tflops = 989;
    rep.peak_source = "assumed H100 SXM nominal: 3.35 TB/s HBM3, 989 TFLOP/s dense fp16";
  }
  rep.extra["sm_clock_mhz"] = {{"before", clock_json(clock_before)}, {"after", clock_json(clock_after)}};
  rep.extra["stream_step_us_samples"] = p.stream_step_us;
  rep.extra["replay_step_us_samples"] = p.replay_step_us;
  if (!phases.empty()) rep.extra["whole_step_phases"] = phases;
  rep.extra["trace_note"] = "profiled steps laid side by side (10 us apart, the busy-wait before each left out); times inside a step as measured";

  // Trace: repeats side by side (real durations and gaps inside a step; steps spaced by hand).
  const std::string proc = fmt::format("stepgraph profile {} ({})", config.source, prop.name);
  res.tracks = {{1, 1, proc, "stream: launches, an event pair each"},
                {1, 2, proc, "stream: whole step, no events between launches"},
                {1, 3, proc, "graph replay: one step per event pair"}};
  double step_len = 0;
  for (double v : span) step_len = std::max(step_len, v);
  for (double v : p.stream_step_us) step_len = std::max(step_len, v);
  for (double v : p.replay_step_us) step_len = std::max(step_len, v);
  const double pitch = step_len + 10.0;
  for (std::size_t r = 0; r < std::size_t(req.steps); ++r) {
    const double base = double(r) * pitch;
    for (std::size_t i = 0; i < count; ++i) {
      json args = node_args(g, std::vector<NodeId>(rep.rows[i].nodes.begin(), rep.rows[i].nodes.end()));
      args["label"] = rep.rows[i].label;
      args["repeat"] = r;
      res.events.push_back({rep.rows[i].name, "launch", base + p.launches[i].start_us[r], p.launches[i].dur_us[r], 1, 1, args});
    }
    res.events.push_back({"step (stream)", "step", base, p.stream_step_us[r], 1, 2, {{"repeat", r}}});
    if (r < p.replay_step_us.size())
      res.events.push_back({"step (graph replay)", "step", base, p.replay_step_us[r], 1, 3, {{"repeat", r}}});
  }
  return res;
}
#endif

}  // namespace

ProfileResult profile_config(const TrainConfig& config, const ProfileRequest& request, report::RunTiming& timing) {
  if (request.steps < 1) throw ConfigError("profile: --steps must be >= 1");
  Dataset data = load_dataset_while_device_starts(config, timing);
  std::string note;
  const std::string& kind = config.backend.kind;
  if (kind != "cpu" && cuda_backend_usable()) {
#ifdef STEPGRAPH_HAVE_CUDA
    return profile_cuda(config, request, data, timing);
#endif
  }
  if (kind == "cuda") throw ConfigError(config.source + ": backend.kind: cuda, but no CUDA GPU is available on this machine");
  if (kind != "cpu") note = "no CUDA GPU found: profiling the CPU reference backend";
  if (!note.empty()) spdlog::warn("{}", note);
  return profile_cpu(config, request, data, timing, note);
}

int run_profile(const TrainConfig& config, const ProfileRequest& request) {
  report::RunTiming timing;
  auto res = profile_config(config, request, timing);
  const std::filesystem::path dir = request.out_dir.empty() ? std::filesystem::path(config.run.out_dir) / "profile"
                                                            : std::filesystem::path(request.out_dir);
  const std::filesystem::path trace = request.trace.empty() ? dir / "trace.json" : std::filesystem::path(request.trace);
  auto& rep = res.report;
  timing.time("writing outputs (trace, CSV, SVG)", [&] {
    const json other = {{"config", rep.config}, {"backend", rep.backend}, {"device", rep.device}, {"method", rep.method},
                        {"note", rep.extra.value("trace_note", "")}};
    io::write_file_atomically(trace, report::trace_json(res.events, res.tracks, other).dump());
    io::write_file_atomically(dir / "profile.csv", report::to_csv(rep));
    io::write_file_atomically(dir / "profile.svg", report::to_svg(rep));
  });
  rep.phases = timing.to_json();
  rep.phases_text = timing.format("where this profile run's time went");
  const std::string table = report::format_table(rep);
  io::write_file_atomically(dir / "profile.txt", table);
  io::write_file_atomically(dir / "profile.json", report::to_json(rep).dump(2));
  std::fwrite(table.data(), 1, table.size(), stdout);
  std::printf("\nwrote %s/profile.{txt,csv,json,svg} and %s (open in ui.perfetto.dev or chrome://tracing)\n",
              dir.string().c_str(), trace.string().c_str());
  return 0;
}

}  // namespace sg::app
