#include "runtime/training_program.hpp"

#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/tensor_blob.hpp"

namespace sg {
namespace {

[[noreturn]] void fail(std::string_view graph, const std::string& what) {
  throw std::invalid_argument(fmt::format("training program: {} graph: {}", graph, what));
}

const Value& bound(std::string_view graph, const Graph& g, ValueId id, std::string_view what, Role role, DType dtype) {
  if (id < 0 || static_cast<std::size_t>(id) >= g.values().size())
    fail(graph, fmt::format("the {} binding ({}) is not a value of the graph", what, id));
  const Value& v = g.value(id);
  if (v.role != role || v.dtype != dtype)
    fail(graph, fmt::format("the {} binding '{}' is a {} {} value, expected {} {}", what, v.name, role_name(v.role),
                            dtype_name(v.dtype), role_name(role), dtype_name(dtype)));
  return v;
}

bool is_output(const Graph& g, ValueId id) {
  for (ValueId o : g.outputs())
    if (o == id) return true;
  return false;
}

void check_bindings(std::string_view graph, const Graph& g, const DataBindings& d, std::int64_t rows,
                    bool needs_correct) {
  // The feature table: u8 images, or f16/f32 features (own data, issue 23).
  const DType feature_dtype = d.images >= 0 && static_cast<std::size_t>(d.images) < g.values().size()
                                  ? g.value(d.images).dtype
                                  : DType::u8;
  if (feature_dtype != DType::u8 && feature_dtype != DType::f16 && feature_dtype != DType::f32)
    fail(graph, fmt::format("the image table is {}, expected u8, f16 or f32", dtype_name(feature_dtype)));
  const Value& images = bound(graph, g, d.images, "images", Role::input, feature_dtype);
  if (images.shape.size() != 2 || images.shape[0] != rows)
    fail(graph, fmt::format("the image table '{}' is {} but the split has {} rows", images.name,
                            shape_string(images.shape), rows));
  // Class labels u8 [rows], or float targets f32 [rows, K].
  const bool targets = d.labels >= 0 && static_cast<std::size_t>(d.labels) < g.values().size() &&
                       g.value(d.labels).dtype == DType::f32;
  const Value& labels = bound(graph, g, d.labels, "labels", Role::label, targets ? DType::f32 : DType::u8);
  if (targets ? labels.shape.size() != 2 || labels.shape[0] != rows : labels.shape != Shape{rows})
    fail(graph, fmt::format("the label table '{}' is {} but the split has {} rows", labels.name,
                            shape_string(labels.shape), rows));
  const Value& perm = bound(graph, g, d.perm, "perm", Role::input, DType::i32);
  if (perm.shape != Shape{rows})
    fail(graph, fmt::format("the permutation '{}' is {} but the split has {} rows", perm.name,
                            shape_string(perm.shape), rows));
  const Value& step = bound(graph, g, d.step, "step", Role::state, DType::i32);
  if (step.shape != Shape{1})
    fail(graph, fmt::format("the step counter '{}' is {}, not [1]", step.name, shape_string(step.shape)));
  if (d.loss < 0 || static_cast<std::size_t>(d.loss) >= g.values().size() || !is_output(g, d.loss) ||
      g.value(d.loss).dtype != DType::f32 || element_count(g.value(d.loss).shape) != 1)
    fail(graph, "the loss binding is not an f32 scalar output of the graph");
  if (d.correct) {
    const ValueId c = *d.correct;
    if (c < 0 || static_cast<std::size_t>(c) >= g.values().size() || !is_output(g, c) ||
        g.value(c).dtype != DType::i32 || element_count(g.value(c).shape) != 1)
      fail(graph, "the correct-count binding is not an i32 scalar output of the graph");
  } else if (needs_correct && !targets) {
    fail(graph, "no correct-count binding (a classifier's eval graph counts correct predictions)");
  }
  if (d.batch <= 0 || d.batch > rows)
    fail(graph, fmt::format("batch {} is not in 1..{} (the split's rows)", d.batch, rows));
  if (d.ranks < 1 || d.batch * d.ranks > rows)
    fail(graph, fmt::format("the global batch {} x {} ranks is not in 1..{} (the split's rows)", d.batch, d.ranks, rows));
  for (Role role : {Role::param, Role::state})
    for (ValueId id : g.values_with_role(role))
      if (id != d.step && g.value(id).name == kStepEntry)
        fail(graph, fmt::format("{} value '{}' has the name of the checkpoint's step entry", role_name(role),
                                kStepEntry));
}

}  // namespace

void check_training_program(const TrainingProgram& p, std::int64_t train_rows, std::int64_t test_rows) {
  check_bindings("training", p.train, p.train_data, train_rows, false);
  check_bindings("eval", p.eval, p.eval_data, test_rows, true);
  if (test_rows % p.eval_data.batch != 0)
    fail("eval", fmt::format("batch {} does not divide the {} test rows", p.eval_data.batch, test_rows));
  // What the eval graph reads as a parameter is a parameter of the training
  // graph or one of its state values (batch norm's running statistics).
  const auto shared = [&](const std::optional<ValueId>& t) {
    return t && *t != p.train_data.step &&
           (p.train.value(*t).role == Role::param || p.train.value(*t).role == Role::state);
  };
  for (ValueId id : p.eval.values_with_role(Role::param)) {
    const Value& v = p.eval.value(id);
    const auto t = p.train.find_value(v.name);
    if (!shared(t) || p.train.value(*t).shape != v.shape || p.train.value(*t).dtype != v.dtype)
      fail("eval", fmt::format("parameter '{}' {} is not a parameter or state value of the training graph", v.name,
                               shape_string(v.shape)));
  }
  std::set<std::string> initialised;
  for (const auto& init : p.init) {
    const auto id = p.train.find_value(init.name);
    if (!shared(id))
      fail("training", fmt::format("initial values for '{}', which is not a parameter or state value", init.name));
    const Value& v = p.train.value(*id);
    if (v.shape != init.shape || element_count(v.shape) != static_cast<std::int64_t>(init.values.size()))
      fail("training", fmt::format("initial values for '{}' are {} ({} values) but the parameter is {}", init.name,
                                   shape_string(init.shape), init.values.size(), shape_string(v.shape)));
    if (!initialised.insert(init.name).second) fail("training", fmt::format("two initialisers for '{}'", init.name));
  }
  for (ValueId id : p.train.values_with_role(Role::param))
    if (!initialised.count(p.train.value(id).name))
      fail("training", fmt::format("parameter '{}' has no initial values", p.train.value(id).name));
}

std::set<std::string> shared_state_names(const TrainingProgram& p) {
  std::set<std::string> names;
  const auto add_if_state = [&](const std::string& name) {
    if (const auto id = p.train.find_value(name); id && p.train.value(*id).role == Role::state) names.insert(name);
  };
  for (ValueId id : p.eval.values_with_role(Role::param)) add_if_state(p.eval.value(id).name);
  for (const auto& init : p.init) add_if_state(init.name);
  return names;
}

}  // namespace sg
