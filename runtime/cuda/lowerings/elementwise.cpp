// Lowering: one node outside any fusion group, by one of our element-wise
// kernels. Maps (y = f(x) or f(a, b) elementwise) come from the kernels'
// own table (ops/cuda/map_kernels.hpp), so a new element-wise op needs its
// kernel and registry entry, not an edit here. The step advance may ride on
// a later launch that takes it (bias_grad_sgd, output_layer_backward).
#include <type_traits>

#include "ops/cuda/map_kernels.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

bool floating(const sg::Graph& g, ValueId v) { return is_floating(g.value(v).dtype); }

class ElementwiseLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "elementwise"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    bool takes = false;
    switch (n.op) {
      case OpKind::advance_step: {
        Match m = single_unit(unit);
        m.may_ride = true;
        return m;
      }
      case OpKind::cast: {
        // Same dtype (a copy), or between f32 and f16 / bf16.
        const DType from = g.value(n.inputs[0]).dtype, to = g.value(n.outputs[0]).dtype;
        takes = is_floating(from) && is_floating(to) && (from == to || from == DType::f32 || to == DType::f32);
        break;
      }
      case OpKind::sgd_update: {
        if (n.attr<SgdUpdateAttrs>().nesterov) return std::nullopt;  // sgd_multi_tensor's
        const DType w = g.value(n.inputs[0]).dtype, grad = g.value(n.inputs[1]).dtype;
        takes = (w == grad && is_floating(w)) || (w == DType::f32 && is_half_width_float(grad));
        break;
      }
      case OpKind::bias_add:
      case OpKind::reduce_rows: takes = floating(g, n.inputs[0]); break;
      default: {
        const MapKernels* k = find_map_kernels(op_name(n.op));
        takes = k && n.outputs.size() == 1 && static_cast<int>(n.inputs.size()) == k->arity;
        for (ValueId v : n.inputs) takes = takes && g.value(v).dtype == g.value(n.outputs[0]).dtype && floating(g, v);
        // A map may have no kernel for this dtype (a null entry in its table row).
        if (takes) {
          const DType d = g.value(n.outputs[0]).dtype;
          takes = (d == DType::f32 && k->f32) || (d == DType::f16 && k->f16) || (d == DType::bf16 && k->bf16);
        }
      }
    }
    if (!takes) return std::nullopt;
    return single_unit(unit);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const Value& x = g.value(n.inputs[0]);
    const auto count = element_count(x.shape);
    const bool dependent = c.options().dependent_launch;
    std::vector<void*> in;
    for (ValueId v : n.inputs) in.push_back(c.ptr(v));
    void* out = n.outputs.empty() ? nullptr : c.ptr(n.outputs[0]);
    std::function<void(cudaStream_t)> run;
    switch (n.op) {
      case OpKind::advance_step:
        run = [p = static_cast<std::int32_t*>(in[0])](cudaStream_t s) { launch_advance_step(p, s); };
        break;
      case OpKind::cast: {
        const Value& y = g.value(n.outputs[0]);
        const auto bytes = value_bytes(x);
        if (x.dtype == y.dtype)
          run = [=](cudaStream_t s) { SG_CUDA_CHECK(cudaMemcpyAsync(out, in[0], bytes, cudaMemcpyDeviceToDevice, s)); };
        else if (x.dtype == DType::f32)
          with_float_type(y.dtype, [&](auto tag) {
            using T = decltype(tag);
            if constexpr (!std::is_same_v<T, float>)
              run = [=](cudaStream_t s) { launch_cast(static_cast<const float*>(in[0]), count, static_cast<T*>(out), s); };
          });
        else
          with_float_type(x.dtype, [&](auto tag) {
            using T = decltype(tag);
            if constexpr (!std::is_same_v<T, float>)
              run = [=](cudaStream_t s) { launch_cast(static_cast<const T*>(in[0]), count, static_cast<float*>(out), s); };
          });
        break;
      }
      case OpKind::sgd_update: {
        const Value& grad = g.value(n.inputs[1]);
        void* v = n.inputs.size() == 3 ? in[2] : nullptr;
        const UpdateScalars* sc = c.update_scalars(n.id);
        with_float_type(grad.dtype, [&](auto tag) {
          using G = decltype(tag);
          if (x.dtype == grad.dtype)
            run = [=](cudaStream_t s) {
              launch_sgd_update(static_cast<G*>(in[0]), static_cast<const G*>(in[1]), static_cast<G*>(v), count, sc, s);
            };
          else  // fp32 master weights, f16 / bf16 gradient
            run = [=](cudaStream_t s) {
              launch_sgd_update(static_cast<float*>(in[0]), static_cast<const G*>(in[1]), static_cast<float*>(v), count,
                                sc, s);
            };
        });
        break;
      }
      default:
        with_float_type(x.dtype, [&](auto tag) {
          using T = decltype(tag);
          const auto rows = x.shape[0];
          const auto cols = x.shape.size() > 1 ? x.shape[1] : 1;
          if (n.op == OpKind::bias_add)
            run = [=](cudaStream_t s) {
              launch_bias_add(static_cast<const T*>(in[0]), static_cast<const T*>(in[1]), rows, cols, static_cast<T*>(out), s);
            };
          else if (n.op == OpKind::reduce_rows)
            run = [=](cudaStream_t s) {
              launch_reduce_rows(static_cast<const T*>(in[0]), rows, cols, static_cast<T*>(out), s, dependent);
            };
          else
            run = map_launch<T>(*find_map_kernels(op_name(n.op)), in, count, static_cast<T*>(out));
        });
    }
    return std::make_unique<BoundLaunch>(std::move(run), std::string(op_name(n.op)));
  }

 private:
  template <typename T>
  static std::function<void(cudaStream_t)> map_launch(const MapKernels& k, std::vector<void*> in, std::int64_t n, T* out) {
    const T* a = static_cast<const T*>(in[0]);
    const T* b = in.size() > 1 ? static_cast<const T*>(in[1]) : nullptr;
    if constexpr (std::is_same_v<T, float>) return [=, f = k.f32](cudaStream_t s) { f(a, b, n, out, s); };
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) return [=, f = k.bf16](cudaStream_t s) { f(a, b, n, out, s); };
    else return [=, f = k.f16](cudaStream_t s) { f(a, b, n, out, s); };
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_elementwise_lowering() { return std::make_unique<ElementwiseLowering>(); }

}  // namespace sg::cuda
