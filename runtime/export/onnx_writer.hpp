#pragma once
// ONNX export of the eval graph (issue 23; model.sequential networks, issue 37), built with Debian's libonnx-dev
// C++ API (onnx::ModelProto, protobuf) and checked with
// onnx::checker::check_model before it is serialised. Opset 13 (ai.onnx),
// IR version of the linked ONNX. Graph: input "input" float32 [N, D] (N
// dynamic) -> Mul(input_scale) -> Add(input_shift) -> per layer Gemm(transB=1)
// with initializers "<i>.weight" [out, in] and "<i>.bias" (the safetensors
// names) and the activation (Relu, Tanh, Sigmoid; GELU from Erf, GELU-tanh
// from Tanh, SiLU as x * Sigmoid(x): opset 13 has no Gelu) -> output "logits"
// [N, K] and "probabilities" = Softmax(logits, axis 1); a regression model
// has the one output "outputs" [N, K]. Dropout is identity at eval and
// appears in no node.
#include <string>

#include "runtime/export/exported_graph.hpp"
#include "runtime/export/exported_mlp.hpp"

namespace sg::exporting {

inline constexpr int kOnnxOpset = 13;

// Whether this build links ONNX (CMake found ONNX and protobuf).
bool onnx_export_available();
// The serialised ModelProto; throws std::runtime_error when this build has
// no ONNX support, or with the checker's message when the model fails it.
std::string onnx_bytes(const ExportedMlp& model);
// A model.sequential network (issue 37): input "input" float32 [N, D] (the
// rows predict reads), scaled, reshaped to [N, C, H, W] for an image model,
// then one group of nodes per layer (Conv, Gemm, MaxPool, AveragePool,
// GlobalAveragePool + Flatten, Flatten, Add, Concat, the LayerNorm formula,
// the activations as above; dropout as Identity), the parameters as
// initializers named layer<i>.weight / .bias like the safetensors export;
// outputs "logits" + "probabilities", or "outputs" for regression.
std::string onnx_bytes(const ExportedGraph& model);

}  // namespace sg::exporting
