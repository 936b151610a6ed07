// Lowering: one matmul by cuBLASLt, with what its epilogue and alpha/beta
// can take along: bias [+ ReLU, keeping the ReLU mask for a later dgrad]
// (linear_forward), the ReLU derivative from such a mask (dgrad_drelu), or
// the fused SGD update straight into the weight (alpha = -lr, beta = 1 -
// lr*wd, C = D = W: no gradient buffer) or into the velocity (wgrad_sgd).
// A linear_forward group ending in gelu_tanh runs cuBLASLt's GELU_AUX_BIAS
// (GELU_BIAS where nothing reads the pre-activation), which writes the
// pre-activation as aux for the backward, and a dgrad_dgelu group its DGELU
// reading it; cuBLASLt's GELU is the tanh approximation. Where the width is
// not a multiple of 8 (cuBLASLt's aux leading-dimension rule) the same
// launch runs the matmul with the bias epilogue and then the gelu_tanh /
// gelu_tanh_backward map kernel.
#include <fmt/format.h>

#include "ops/cuda/map_kernels.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

enum class Role : std::uint8_t { forward, dgrad_relu, dgrad_gelu, weight_update, plain };

struct MatmulNodes {
  Role role = Role::plain;
  NodeId matmul = -1;
  NodeId sgd = -1;       // weight_update
  ValueId bias = -1;     // forward
  ValueId output = -1;   // forward, dgrad_relu, plain
  bool relu = false;     // forward
  bool gelu = false;     // forward: the group ends in gelu_tanh
  ValueId pre_activation = -1;  // gelu forward (written when read outside) and dgrad_gelu (read)
  bool pre_activation_read = false;  // gelu forward: the backward reads it
  bool gelu_in_epilogue = false;     // else the matmul plus a gelu map kernel
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
      if (m.gelu) return !m.gelu_in_epilogue ? Epilogue::bias : m.pre_activation_read ? Epilogue::gelu_aux_bias : Epilogue::gelu_bias;
      if (!m.relu) return Epilogue::bias;
      return l.aux_write >= 0 ? Epilogue::relu_aux_bias : Epilogue::relu_bias;
    case Role::dgrad_relu: return Epilogue::drelu;
    case Role::dgrad_gelu: return m.gelu_in_epilogue ? Epilogue::dgelu : Epilogue::none;
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
    case Epilogue::gelu_bias: return "gelu_bias";
    case Epilogue::gelu_aux_bias: return "gelu_aux_bias";
    case Epilogue::dgelu: return "dgelu";
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
      m.gelu = last.op == OpKind::gelu_tanh;
      if (m.gelu) {
        m.pre_activation = last.inputs[0];
        m.pre_activation_read = g.consumers(m.pre_activation).size() > 1;
        // GELU_BIAS has no aux; GELU_AUX_BIAS's aux (the pre-activation) needs n % 8 == 0.
        m.gelu_in_epilogue = !m.pre_activation_read || gelu_aux_fits(g.value(m.output).shape[1]);
      }
    } else if (cover.is_group(unit, FusionKind::dgrad_dgelu)) {
      m.role = Role::dgrad_gelu;
      m.output = last.outputs[0];
      m.pre_activation = last.inputs[1];
      m.gelu_in_epilogue = gelu_aux_fits(g.value(m.output).shape[1]);
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
    if ((m.gelu || m.role == Role::dgrad_gelu) && !m.gelu_in_epilogue)
      note += m.gelu ? "+gelu_tanh kernel" : "+gelu_tanh_backward kernel";
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
    // The GELU forward outside the epilogue writes the pre-activation first.
    const bool gelu_after = m.gelu && !m.gelu_in_epilogue;
    const ValueId target = gelu_after ? m.pre_activation : target_of(g, m);
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
    b->matmul = std::make_unique<LtMatmul>(c.lt(), shape, c.options().autotune, c.stream(), kAutotuneMinMacs,
                                           c.options().cublaslt_split_k);
    b->a = c.ptr(mm.inputs[0]);
    b->b = c.ptr(mm.inputs[1]);
    b->d = c.ptr(target);
    b->c = b->d;
    b->alpha = c.one(half);
    b->beta = c.zero(half);
    if (m.role == Role::weight_update) {
      const UpdateScalars* s = c.update_scalars(m.sgd);
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
    if ((shape.epilogue == Epilogue::gelu_aux_bias || shape.epilogue == Epilogue::dgelu)) b->aux = c.ptr(m.pre_activation);
    std::function<void(cudaStream_t)> finish;
    if ((m.gelu || m.role == Role::dgrad_gelu) && !m.gelu_in_epilogue) {
      // forward: out = gelu_tanh(pre); dgrad: out = out * gelu_tanh'(pre), in place.
      const Value& out = g.value(m.output);
      const MapKernels* k = find_map_kernels(m.gelu ? "gelu_tanh" : "gelu_tanh_backward");
      if (!k) throw CudaError("cublaslt_matmul: no gelu_tanh map kernel");
      const void* pre = c.ptr(m.pre_activation);
      void* y = c.ptr(out.id);
      const auto n = element_count(out.shape);
      const bool forward = m.gelu;
      with_float_type(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* a = static_cast<const T*>(forward ? pre : y);
        const T* bb = forward ? nullptr : static_cast<const T*>(pre);
        T* yy = static_cast<T*>(y);
        if constexpr (std::is_same_v<T, float>) finish = [=, f = k->f32](cudaStream_t st) { f(a, bb, n, yy, st); };
        else if constexpr (std::is_same_v<T, __half>) finish = [=, f = k->f16](cudaStream_t st) { f(a, bb, n, yy, st); };
        else finish = [=, f = k->bf16](cudaStream_t st) { f(a, bb, n, yy, st); };
      });
    }
    if (momentum(g, m)) {  // the matmul wrote v = momentum*v + g; finish with v += wd*w, w -= lr*v
      const Node& sgd = g.node(m.sgd);
      const Value& w = g.value(sgd.inputs[0]);
      void* wp = c.ptr(w.id);
      void* vp = c.ptr(sgd.inputs[2]);
      const UpdateScalars* s = c.update_scalars(sgd.id);
      const auto n = element_count(w.shape);
      with_float_type(w.dtype, [&](auto tag) {
        using T = decltype(tag);
        finish = [=](cudaStream_t st) { launch_momentum_finish(static_cast<T*>(wp), static_cast<T*>(vp), n, s, st); };
      });
    }
    std::string label = b->matmul->label();
    return std::make_unique<BoundLaunch>(
        [b, finish](cudaStream_t s) {
          b->matmul->run(b->a, b->b, b->c, b->d, b->alpha, b->beta, b->bias, b->aux, s);
          if (finish) finish(s);
        },
        std::move(label));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_cublaslt_matmul_lowering() { return std::make_unique<CublasLtMatmulLowering>(); }

}  // namespace sg::cuda
