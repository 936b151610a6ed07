#pragma once
// Output shapes and dtypes of every op, with errors that name the op and the
// offending shapes. Used by the builder and re-run by the verifier.
#include <vector>

#include "graph/op.hpp"
#include "graph/value.hpp"

namespace sg {

struct OutputSpec {
  Shape shape;
  DType dtype;
};

// Throws GraphError on arity, rank, shape or dtype mismatch.
std::vector<OutputSpec> infer_outputs(OpKind op, const std::vector<const Value*>& inputs,
                                      const OpAttrs& attrs);

}  // namespace sg
