#include "graph/shape_inference.hpp"

#include <fmt/format.h>

#include "graph/op_registry.hpp"

namespace sg {

std::vector<OutputSpec> infer_outputs(OpKind op, const std::vector<const Value*>& in, const OpAttrs& attrs) {
  const OpDef& def = op_def(op);
  if (attrs.index() != def.attrs_index)
    throw GraphError(fmt::format("{}: attributes are {}, expected {}", def.name, attrs_kind_name(attrs),
                                 attrs_kind_name(def.attrs_index)));
  return def.infer(in, attrs);
}

}  // namespace sg
