#pragma once
// Adam/AdamW's first training step on the GPU checked element by element
// against the CPU reference rule (tests/cuda_backend/test_whole_step.cpp).
#include <cuda_fp16.h>
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "ops/cpu/reference_ops.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/training_helpers.hpp"

namespace sg::test {

inline std::map<std::string, io::TensorBlob> blobs_by_name(const std::vector<io::TensorBlob>& blobs) {
  std::map<std::string, io::TensorBlob> out;
  for (const auto& b : blobs) out.emplace(b.name, b);
  return out;
}

// Adam/AdamW's first step checked element by element: each parameter's new
// value against the CPU reference rule applied to the GPU's own gradient
// (m = (1 - beta1) g after one step; weight decay as the rule adds it),
// rounded to the weight's dtype, by norm of the change; and the moments,
// linear and quadratic in the gradients, against the CPU's by norm.
// Comparing the parameter changes with the CPU's instead fails now and
// then: the update is normalised per element, and a ReLU input rounded to
// an fp16 zero on one side only flips a mask, so the weights it touches
// move by lr instead of ~0 (0.25 of the change's norm at seed 4056547135).
// The moments carry the same flips as gradient differences (v squares
// them): over 22 seeds on an H200 (session Y) the update matched
// everywhere and the moments' error reached 0.127 (seed 4056547135; 0.063
// at 1007, below 0.05 at the others). Their bound is twice that: it still
// fails for a wrong beta (m off by 10x) or a moment left at zero.
inline void check_first_adam_step(const OptimizerSpec& opt, const std::vector<io::TensorBlob>& start, Trainer& gpu,
                                  Trainer& cpu) {
  const auto before = blobs_by_name(start), after = blobs_by_name(gpu.save_state()),
             cpu_after = blobs_by_name(cpu.save_state());
  std::vector<float> want, got, moments_gpu, moments_cpu;
  for (const auto& [name, blob] : before) {
    if (!after.count("adam_m_" + name)) continue;  // not a parameter
    const std::vector<float> w0 = floats_from_blob(blob), w1 = floats_from_blob(after.at(name)),
                             m = floats_from_blob(after.at("adam_m_" + name));
    std::vector<float> w = w0, g(m.size()), m0(m.size(), 0.f), v0(m.size(), 0.f);
    for (std::size_t i = 0; i < m.size(); ++i) g[i] = m[i] / float(1.0 - opt.beta1);
    const bool decoupled = opt.kind == OptimizerKind::adamw;
    ref::adam_update<float>(w.data(), g.data(), m0.data(), v0.data(), static_cast<std::int64_t>(w.size()),
                            float(opt.lr), float(opt.beta1), float(opt.beta2), float(opt.eps),
                            decoupled ? float(opt.weight_decay) : 0.f, decoupled, 1, 1.f);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float rounded = blob.dtype == DType::f16 ? __half2float(__float2half(w[i])) : w[i];
      want.push_back(rounded - w0[i]);
      got.push_back(w1[i] - w0[i]);
    }
    for (const char* slot : {"adam_m_", "adam_v_"}) {
      const auto x = floats_from_blob(after.at(slot + name)), y = floats_from_blob(cpu_after.at(slot + name));
      moments_gpu.insert(moments_gpu.end(), x.begin(), x.end());
      moments_cpu.insert(moments_cpu.end(), y.begin(), y.end());
    }
  }
  REQUIRE(!want.empty());
  CHECK(relative_error(got, want) < 2e-2);
  CHECK(relative_error(moments_gpu, moments_cpu) < 0.25);
}

}  // namespace sg::test
