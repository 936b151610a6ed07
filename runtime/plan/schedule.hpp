#pragma once
// Lowers a fused graph into an ordered list of launches by covering it with
// lowerings. A lowering is one way of running a set of nodes as one launch (a
// cuBLASLt matmul with its epilogue, one of our fused kernels, ...); it says
// which nodes it takes (`match`). The scheduler knows none of them: it offers
// every still uncovered unit (a fusion group, or a lone node) to each lowering
// in priority order, orders the launches by where their nodes sit in the
// graph, lets launches that may ride on another (the step advance) join the
// last one that takes them, assigns the ReLU masks one launch writes and
// another reads, and checks the order. Backend-neutral: the CUDA program asks
// each launch's lowering to record it (runtime/cuda/lowering.hpp).
#include <any>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/graph.hpp"

namespace sg {

class Lowering;

// What the cover hands out: a fusion group, or one node outside any group.
// A unit runs where its anchor sits in the graph: its last node when it
// updates a value in place (after every read of the old value), else its
// first (before any consumer).
struct CoverUnit {
  int id = -1;
  std::vector<NodeId> nodes;  // in graph order
  int fusion_group = -1;      // -1 for a lone node
  NodeId anchor = -1;
};

// ReLU masks written by one matmul epilogue and read by a later one.
struct AuxBuffer {
  std::int64_t rows = 0, cols = 0;  // shape of the row-major output it masks
};

struct Launch {
  const Lowering* lowering = nullptr;
  std::vector<NodeId> nodes;     // graph nodes implemented, in the order the lowering gave
  std::vector<ValueId> reads;    // values read from outside the launch
  std::vector<ValueId> writes;   // values produced for use outside the launch
  std::vector<ValueId> updates;  // graph-owned values updated in place
  // Values this launch writes for the NEXT step (an fp32 master's compute
  // copy written by its update): they hold their bytes across steps, every
  // reader of this step runs before this launch, and the program fills them
  // once before the first step (RecordedLaunch::parameters_written).
  std::vector<ValueId> carries;
  std::vector<ValueId> scratch;  // intermediates a kernel keeps in device memory between its phases
  // (output, input) pairs whose output is the input's bytes seen with another
  // shape (reshape, flatten): the memory plan gives both one buffer.
  std::vector<std::pair<ValueId, ValueId>> aliases;
  int aux_write = -1, aux_read = -1;  // index into Schedule::aux
  std::vector<NodeId> riders;    // launches' nodes that joined this one after the cover (step advance)
  std::any detail;               // the lowering's own record of which node plays which part
};

struct Schedule {
  std::vector<Launch> launches;
  std::vector<AuxBuffer> aux;
};

// A lowering's answer to "do you take this unit?".
struct Match {
  std::vector<int> units;            // units taken, the offered one among them (their nodes run in anchor order)
  bool graph_order = false;          // list the launch's nodes in graph order instead (a whole step)
  std::any detail;                   // kept in Launch::detail
  std::vector<NodeId> reads_mask_of; // relu nodes whose epilogue mask this launch reads (cuBLASLt DRELU)
  std::vector<ValueId> unread;       // inputs of its nodes the launch never reads (a mask replaces them)
  std::vector<ValueId> scratch;
  std::vector<std::pair<ValueId, ValueId>> aliases;  // see Launch::aliases
  std::vector<ValueId> carries;      // outputs of its nodes written for the next step: see Launch::carries
  bool may_ride = false;             // may join a later launch whose lowering takes riders
  // Run where the last of its units sits rather than the first: a launch that
  // takes earlier nodes whose outputs only it reads (the update stage's
  // gradient casts), so its other inputs exist by then.
  bool runs_at_last_unit = false;
  // Run where this unit (one of `units`) sits instead: a launch that takes
  // earlier nodes whose outputs only it reads (the classifier head's pooling)
  // but also reads values produced between them and that unit (the weights'
  // casts). -1: first or last as above.
  int runs_at_unit = -1;
};

// The partial cover a lowering's match sees.
class Cover {
 public:
  explicit Cover(const Graph& graph);
  const Graph& graph() const { return g_; }
  const std::vector<CoverUnit>& units() const { return units_; }
  const CoverUnit& unit_of(NodeId node) const;
  bool taken(int unit) const { return taken_[static_cast<std::size_t>(unit)]; }
  bool taken_node(NodeId node) const { return taken(unit_of(node).id); }
  // The free unit of the given fusion kind that contains `node`, if any.
  const CoverUnit* free_group_with(NodeId node, FusionKind kind) const;
  FusionKind kind_of(const CoverUnit& unit) const;
  bool is_group(const CoverUnit& unit, FusionKind kind) const { return unit.fusion_group >= 0 && kind_of(unit) == kind; }
  // Whether a launch taken so far reads the epilogue mask of this relu node.
  bool mask_needed(NodeId relu) const;

  void take(const Match& match);  // used by the scheduler

 private:
  const Graph& g_;
  std::vector<CoverUnit> units_;
  std::vector<int> unit_of_node_;
  std::vector<bool> taken_;
  std::vector<NodeId> masks_;
};

class Lowering {
 public:
  virtual ~Lowering() = default;
  virtual std::string_view name() const = 0;
  // Offered a free unit: the units this lowering runs as one launch starting
  // from it, or nothing when it does not take it (pattern, dtypes, shapes,
  // options, device).
  virtual std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const = 0;
  // Whether `launch` (one of this lowering's) can also run `rider`'s nodes.
  virtual bool takes_rider(const Graph&, const Launch& /*launch*/, const Launch& /*rider*/) const { return false; }
  // A note on what the launch does beyond its nodes, for the dump ("epilogue=relu_bias").
  virtual std::string describe(const Graph&, const Launch&) const { return {}; }
};

// Covers `graph` with `lowerings`, highest priority first. Throws GraphError
// when a node is left that no lowering takes.
Schedule build_schedule(const Graph& graph, const std::vector<const Lowering*>& lowerings);

// Whether v is a graph output or read by a node outside `nodes`: a value a
// launch of those nodes must write (Launch::writes).
bool read_outside(const Graph& graph, ValueId v, const std::vector<NodeId>& nodes);

// Replays the schedule and throws GraphError if a launch reads a value before
// it is written or after it was updated in place.
void check_schedule_order(const Graph& graph, const Schedule& schedule);

// One line per launch, named by its lowering (for `inspect --format schedule`).
std::string dump_schedule(const Graph& graph, const Schedule& schedule);

// The launch's detail as the lowering stored it (throws GraphError when the
// launch belongs to another lowering).
template <typename Detail>
const Detail& detail_of(const Launch& launch) {
  const auto* d = std::any_cast<Detail>(&launch.detail);
  if (!d) throw GraphError("schedule: a launch's detail is not of the kind its lowering expects");
  return *d;
}

}  // namespace sg
