#include "runtime/cuda/stream_plan.hpp"

#include <algorithm>
#include <optional>

#include "runtime/cuda/lowering.hpp"
#include "runtime/plan/update_branches.hpp"

namespace sg::cuda {
namespace {

bool shares(const std::vector<ValueId>& a, const std::vector<ValueId>& b) {
  return std::any_of(a.begin(), a.end(), [&](ValueId v) { return std::find(b.begin(), b.end(), v) != b.end(); });
}

// Whether `later` must wait for `earlier`: it reads what earlier writes or
// updates, or it writes, updates or carries what earlier reads, writes or
// updates (a carried value is the next step's: no launch after its carrier reads it).
bool depends_on(const Launch& later, const Launch& earlier) {
  if (shares(later.reads, earlier.writes) || shares(later.reads, earlier.updates)) return true;
  for (const auto* touched : {&earlier.reads, &earlier.writes, &earlier.updates})
    if (shares(later.writes, *touched) || shares(later.updates, *touched) || shares(later.carries, *touched))
      return true;
  return false;
}

bool any(const std::vector<bool>& v) { return std::find(v.begin(), v.end(), true) != v.end(); }

}  // namespace

bool StreamPlan::forks() const { return any(on_communication); }

bool StreamPlan::splits_gradients() const { return any(on_gradient_stream); }

int StreamPlan::gradient_lanes() const {
  int lanes = 0;
  for (std::size_t i = 0; i < on_gradient_stream.size(); ++i)
    if (on_gradient_stream[i]) lanes = std::max(lanes, gradient_lane[i] + 1);
  return lanes;
}

std::vector<std::size_t> StreamPlan::joined_before(std::size_t index) const {
  std::vector<std::size_t> out;
  for (std::size_t c = 0; c < on_communication.size(); ++c)
    if ((on_communication[c] || on_gradient_stream[c]) && join_before[c] == index) out.push_back(c);
  return out;
}

std::vector<std::size_t> StreamPlan::forked_before(std::size_t index) const {
  std::vector<std::size_t> out;
  for (std::size_t g = 0; g < on_gradient_stream.size(); ++g)
    if (on_gradient_stream[g] && fork_before[g] == index) out.push_back(g);
  return out;
}

StreamPlan plan_streams(const sg::Graph&, const Schedule& s, const std::vector<bool>& on_communication,
                        const std::vector<bool>& on_gradient_stream, int gradient_streams) {
  const std::size_t n = s.launches.size();
  StreamPlan plan;
  plan.on_communication = on_communication;
  plan.on_gradient_stream = on_gradient_stream.empty() ? std::vector<bool>(n, false) : on_gradient_stream;
  plan.gradient_lane.assign(n, 0);
  plan.fork_before.assign(n, 0);
  plan.join_before.assign(n, n);
  plan.waits_for.assign(n, {});
  // The gradient stream runs its launches in the order of their forks
  // (schedule order among those forked at one place), so a launch forks no
  // earlier than an earlier gradient-stream launch it depends on, and one
  // that waits for a late launch of the step's stream holds back none that
  // do not depend on it.
  for (std::size_t g = 0; g < n; ++g) {
    if (!plan.on_gradient_stream[g]) continue;
    std::size_t fork = 0;
    for (std::size_t j = 0; j < g; ++j) {
      if (!depends_on(s.launches[g], s.launches[j])) continue;
      if (plan.on_step_stream(j)) {
        fork = std::max(fork, j + 1);
      } else if (plan.on_gradient_stream[j]) {
        fork = std::max(fork, plan.fork_before[j]);
      } else {  // an all-reduce: forked where it sits, so this forks after it and waits for it
        fork = std::max(fork, j + 1);
        plan.waits_for[g].push_back(j);
      }
    }
    plan.fork_before[g] = fork;
  }
  // Two lanes: among the launches forked at one place, one that depends on
  // an earlier one of the place continues on its lane (the latest such), and
  // the others (each the head of a chain: a weight gradient, a bias's
  // reshape and column sums) alternate between the lanes in schedule order.
  // Forks are computed for one lane first: a launch forks no earlier than a
  // gradient-stream launch it depends on in either lane, so that launch's
  // `done` event is recorded before a launch of the other lane waits for it.
  if (gradient_streams > 1) {
    std::vector<bool> head(n, false);
    for (std::size_t g = 0; g < n; ++g) {
      if (!plan.on_gradient_stream[g]) continue;
      const auto same_place = [&](std::size_t h) {
        return plan.on_gradient_stream[h] && plan.fork_before[h] == plan.fork_before[g];
      };
      std::optional<std::size_t> chain;  // the latest launch of the place that g depends on
      for (std::size_t h = g; h-- > 0 && !chain;)
        if (same_place(h) && depends_on(s.launches[g], s.launches[h])) chain = h;
      if (chain) {
        plan.gradient_lane[g] = plan.gradient_lane[*chain];
      } else {
        head[g] = true;
        for (std::size_t k = g; k-- > 0;)
          if (same_place(k) && head[k]) {
            plan.gradient_lane[g] = 1 - plan.gradient_lane[k];
            break;
          }
      }
      for (std::size_t j = 0; j < g; ++j)
        if (plan.on_gradient_stream[j] && plan.gradient_lane[j] != plan.gradient_lane[g] &&
            depends_on(s.launches[g], s.launches[j]))
          plan.waits_for[g].push_back(j);
    }
  }
  for (std::size_t c = 0; c < n; ++c) {
    if (!plan.on_communication[c]) continue;
    for (std::size_t j = 0; j < c; ++j)
      if (plan.on_gradient_stream[j] && depends_on(s.launches[c], s.launches[j])) plan.waits_for[c].push_back(j);
  }
  for (std::size_t c = 0; c < n; ++c) {
    if (plan.on_step_stream(c)) continue;
    for (std::size_t j = c + 1; j < n; ++j)
      if (plan.on_step_stream(j) && depends_on(s.launches[j], s.launches[c])) {
        plan.join_before[c] = j;
        break;
      }
  }
  return plan;
}

std::vector<bool> independent_launches(const Schedule& s) {
  std::vector<bool> independent(s.launches.size(), false);
  for (std::size_t i = 1; i < s.launches.size(); ++i) {
    const Launch& l = s.launches[i];
    bool free = !l.writes.empty() || !l.updates.empty();
    for (std::size_t j = 0; j < i && free; ++j) free = !depends_on(l, s.launches[j]);
    independent[i] = free;
  }
  return independent;
}

std::vector<bool> parameter_launches(const sg::Graph& graph, const Schedule& s) {
  // A value computed from the parameters alone: a parameter, or an output of
  // a node (not an in-place update) whose inputs all are.
  std::vector<bool> from_parameters(graph.values().size(), false);
  for (const Value& v : graph.values()) from_parameters[static_cast<std::size_t>(v.id)] = v.role == Role::param;
  for (const Node& n : graph.nodes()) {
    if (op_updates_in_place(n.op)) continue;
    const bool derived = !n.inputs.empty() && std::all_of(n.inputs.begin(), n.inputs.end(), [&](ValueId v) {
      return from_parameters[static_cast<std::size_t>(v)];
    });
    for (ValueId out : n.outputs) from_parameters[static_cast<std::size_t>(out)] = derived;
  }
  const auto derived = [&](ValueId v) { return from_parameters[static_cast<std::size_t>(v)]; };
  std::vector<bool> out(s.launches.size(), false);
  for (std::size_t i = 1; i < s.launches.size(); ++i) {
    const Launch& l = s.launches[i];
    out[i] = !l.writes.empty() && l.updates.empty() && std::all_of(l.reads.begin(), l.reads.end(), derived) &&
             std::all_of(l.writes.begin(), l.writes.end(), derived);
  }
  return out;
}

namespace {
bool gathers_rows(const sg::Graph& graph, const Launch& l) {
  return l.nodes.size() == 1 && graph.node(l.nodes.front()).op == OpKind::all_gather_batch;
}
}  // namespace

StreamPlan plan_streams(const sg::Graph& graph, const Schedule& s, const BackendOptions& options) {
  std::vector<bool> communicates;
  for (const Launch& l : s.launches)
    communicates.push_back(cuda_lowering_of(l).launch_stream() == LaunchStream::communication);
  const std::vector<bool> on_communication =
      options.communication_stream ? communicates : std::vector<bool>(s.launches.size(), false);
  std::vector<bool> on_gradient_stream(s.launches.size(), false);
  // Auto (0): a data-parallel rank keeps one gradient stream, its plan (the
  // all-reduces waiting for the weight gradients) as measured on 2 GPUs;
  // two lanes there are asked for explicitly (docs/data_parallel.md).
  const int lanes = options.gradient_streams > 0 ? static_cast<int>(options.gradient_streams)
                                                 : any(communicates) ? 1 : 2;
  if (options.weight_gradient_stream) on_gradient_stream = update_branch_launches(graph, s);
  if (options.independent_launch_stream) {
    const std::vector<bool> independent = independent_launches(s), prepared = parameter_launches(graph, s);
    for (std::size_t i = 0; i < independent.size(); ++i)
      on_gradient_stream[i] = on_gradient_stream[i] || independent[i] || prepared[i];
  }
  // An all-reduce is on an update branch too, but it communicates: it runs on
  // the communication stream, or where it sits when that stream is off. A
  // launch that reads what an all-reduce writes (an update) stays on the
  // step's stream too: on the gradient stream it would wait there for the
  // all-reduce and hold back the weight gradients forked after it.
  // A weight gradient that reads every rank's rows (all_gather_batch,
  // graph/gathered_gradients.hpp) is the exception: it stays on the gradient
  // stream, waiting there for its gather, where the weight gradients after it
  // wait for their own later gathers anyway and the chain runs on.
  std::vector<bool> after_communication(s.launches.size(), false);
  for (std::size_t i = 0; i < communicates.size(); ++i) {
    if (communicates[i]) on_gradient_stream[i] = false;
    for (std::size_t j = 0; j < i && !after_communication[i]; ++j)
      after_communication[i] = communicates[j] && depends_on(s.launches[i], s.launches[j]) &&
                               !gathers_rows(graph, s.launches[j]);
    if (after_communication[i]) on_gradient_stream[i] = false;
  }
  // A gradient-stream launch that forks after the step's stream has run its
  // last launch has nothing to run beside: on the step's stream it starts as
  // early (the joins wait for what it depends on) and does not queue behind
  // the gradient stream's backlog. Moving one may push a later one's fork
  // past the end too, so until nothing moves. (The launches after an
  // all-reduce do not count as the step's stream running: they wait for it.
  // A lowering keeps a launch that has the last weight gradients to run
  // beside there: CudaLowering::runs_beside_chain_end.)
  StreamPlan plan = plan_streams(graph, s, on_communication, on_gradient_stream, lanes);
  for (bool moved = true; moved;) {
    moved = false;
    std::size_t last_step = 0;
    for (std::size_t j = 0; j < plan.on_gradient_stream.size(); ++j)
      if (plan.on_step_stream(j) && !after_communication[j]) last_step = j;
    for (std::size_t g = last_step + 1; g < plan.on_gradient_stream.size(); ++g)
      if (plan.on_gradient_stream[g] && plan.fork_before[g] > last_step &&
          !cuda_lowering_of(s.launches[g]).runs_beside_chain_end(s.launches[g])) {
        on_gradient_stream[g] = false;
        moved = true;
      }
    if (moved) plan = plan_streams(graph, s, on_communication, on_gradient_stream, lanes);
  }
  return plan;
}

void keep_live_until_joined(ArenaRequest& request, const Schedule& s, const StreamPlan& plan) {
  if (s.launches.empty()) return;
  const int last_launch = static_cast<int>(s.launches.size()) - 1;
  for (std::size_t c = 0; c < s.launches.size(); ++c) {
    if (plan.on_step_stream(c)) continue;
    const int from = plan.on_gradient_stream[c] ? static_cast<int>(plan.fork_before[c]) : static_cast<int>(c);
    const int until = std::min(static_cast<int>(plan.join_before[c]), last_launch);
    const Launch& l = s.launches[c];
    for (const auto* ids : {&l.reads, &l.writes, &l.updates, &l.scratch})
      for (ValueId id : *ids)
        if (const int slot = request.buffer_of_value[static_cast<std::size_t>(id)]; slot >= 0) {
          auto& b = request.buffers[static_cast<std::size_t>(slot)];
          b.first = std::min(b.first, from);
          b.last = std::max(b.last, until);
        }
  }
}

}  // namespace sg::cuda
