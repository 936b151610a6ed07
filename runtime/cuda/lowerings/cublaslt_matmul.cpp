// Lowering: one matmul by cuBLASLt, with what its epilogue and alpha/beta
// can take along: bias [+ ReLU, keeping the ReLU mask for a later dgrad]
// (linear_forward), the ReLU derivative from such a mask (dgrad_drelu), or
// the fused SGD update straight into the weight (alpha = -lr, beta = 1 -
// lr*wd, C = D = W: no gradient buffer) or into the velocity (wgrad_sgd).
#include <fmt/format.h>

#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

enum class Role : std::uint8_t { forward, dgrad_relu, weight_update, plain };

struct MatmulNodes {
  Role role = Role::plain;
  NodeId matmul = -1;
  NodeId sgd = -1;       // weight_update
  ValueId bias = -1;     // forward
  ValueId output = -1;   // forward, dgrad_relu, plain
  bool relu = false;     // forward
};

// Where the result goes: the output value, the parameter or the velocity.
ValueId target_of(const sg::Graph& g, const MatmulNodes& m) {
  if (m.role != Role::weight_update) return m.output;
  const Node& sgd = g.node(m.sgd);
  return sgd.inputs.size() == 3 ? sgd.inputs[2] : sgd.inputs[0];
}

bool momentum(const sg::Graph& g, const MatmulNodes& m) {
  return m.role == Role::weight_update && g.node(m.sgd).inputs.size() == 3;
}

Epilogue epilogue_of(const MatmulNodes& m, const Launch& l) {
  switch (m.role) {
    case Role::forward:
      if (!m.relu) return Epilogue::bias;
      return l.aux_write >= 0 ? Epilogue::relu_aux_bias : Epilogue::relu_bias;
    case Role::dgrad_relu: return Epilogue::drelu;
    default: return Epilogue::none;
  }
}

std::string_view epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::none: return "none";
    case Epilogue::bias: return "bias";
    case Epilogue::relu_bias: return "relu_bias";
    case Epilogue::relu_aux_bias: return "relu_aux_bias";
    case Epilogue::drelu: return "drelu";
  }
  return "?";
}

class CublasLtMatmulLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "cublaslt_matmul"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    MatmulNodes m;
    m.matmul = node_of(g, unit, OpKind::matmul);
    if (m.matmul < 0 || !elem_type(g.value(g.node(m.matmul).inputs[0]).dtype)) return std::nullopt;
    Match match = single_unit(unit);
    const Node& last = g.node(unit.nodes.back());
    if (unit.fusion_group < 0) {
      m.output = g.node(m.matmul).outputs[0];
    } else if (cover.is_group(unit, FusionKind::linear_forward)) {
      m.role = Role::forward;
      m.bias = g.node(node_of(g, unit, OpKind::bias_add)).inputs[1];
      m.output = last.outputs[0];
      m.relu = last.op == OpKind::relu;
    } else if (cover.is_group(unit, FusionKind::dgrad_drelu)) {
      // The mask of the forward's ReLU replaces its output: the kernel never reads that value.
      m.role = Role::dgrad_relu;
      m.output = last.outputs[0];
      const ValueId relu_out = last.inputs[1];
      match.reads_mask_of = {g.value(relu_out).producer};
      match.unread = {relu_out};
    } else if (cover.is_group(unit, FusionKind::wgrad_sgd)) {
      m.role = Role::weight_update;
      m.sgd = node_of(g, unit, OpKind::sgd_update);
    } else {
      return std::nullopt;
    }
    if (!elem_type(g.value(target_of(g, m)).dtype)) return std::nullopt;
    match.detail = m;
    return match;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& m = detail_of<MatmulNodes>(l);
    std::string note = fmt::format("epilogue={}", epilogue_name(epilogue_of(m, l)));
    if (m.role == Role::weight_update)
      note += momentum(g, m) ? ",into=velocity(alpha=1,beta=momentum)+momentum_finish"
                             : ",into=param(alpha=-lr,beta=1-lr*wd)";
    return note;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& m = detail_of<MatmulNodes>(l);
    const Node& mm = g.node(m.matmul);
    MatmulShape shape = operand_shape(g, mm);
    shape.epilogue = epilogue_of(m, l);
    const ValueId target = target_of(g, m);
    shape.cd_type = *elem_type(g.value(target).dtype);
    // cuBLASLt has no fp16 accumulation into fp32 outputs (master weights).
    const bool half = c.options().accumulate_f16 && shape.cd_type == ElemType::f16;
    shape.accumulate = half ? Accumulate::f16 : Accumulate::f32;
    shape.reads_c = m.role == Role::weight_update;  // beta: 1 - lr * wd into W, or the momentum into the velocity

    struct Bound {
      std::unique_ptr<LtMatmul> matmul;
      const void *a, *b, *c, *alpha, *beta, *bias = nullptr;
      void *d, *aux = nullptr;
    };
    auto b = std::make_shared<Bound>();
    b->matmul = std::make_unique<LtMatmul>(c.lt(), shape, c.options().autotune, c.stream());
    b->a = c.ptr(mm.inputs[0]);
    b->b = c.ptr(mm.inputs[1]);
    b->d = c.ptr(target);
    b->c = b->d;
    b->alpha = c.one(half);
    b->beta = c.zero(half);
    if (m.role == Role::weight_update) {
      const SgdScalars* s = c.sgd_scalars(m.sgd);
      if (!momentum(g, m)) {
        b->alpha = half ? static_cast<const void*>(&s->neg_lr_h) : &s->neg_lr;
        b->beta = half ? static_cast<const void*>(&s->one_minus_lr_wd_h) : &s->one_minus_lr_wd;
      } else {
        b->beta = half ? static_cast<const void*>(&s->momentum_h) : &s->momentum;
      }
    }
    if (m.bias >= 0) b->bias = c.ptr(m.bias);
    const int mask = l.aux_write >= 0 ? l.aux_write : l.aux_read;
    if (mask >= 0) b->aux = c.aux(mask);
    std::function<void(cudaStream_t)> finish;
    if (momentum(g, m)) {  // the matmul wrote v = momentum*v + g; finish with v += wd*w, w -= lr*v
      const Node& sgd = g.node(m.sgd);
      const Value& w = g.value(sgd.inputs[0]);
      void* wp = c.ptr(w.id);
      void* vp = c.ptr(sgd.inputs[2]);
      const SgdScalars* s = c.sgd_scalars(sgd.id);
      const auto n = element_count(w.shape);
      with_float_type(w.dtype, [&](auto tag) {
        using T = decltype(tag);
        finish = [=](cudaStream_t st) { launch_momentum_finish(static_cast<T*>(wp), static_cast<T*>(vp), n, s, st); };
      });
    }
    return std::make_unique<BoundLaunch>(
        [b, finish](cudaStream_t s) {
          b->matmul->run(b->a, b->b, b->c, b->d, b->alpha, b->beta, b->bias, b->aux, s);
          if (finish) finish(s);
        },
        "cuBLASLt");
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_cublaslt_matmul_lowering() { return std::make_unique<CublasLtMatmulLowering>(); }

}  // namespace sg::cuda
