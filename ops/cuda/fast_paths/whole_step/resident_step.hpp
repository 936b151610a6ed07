#pragma once
// Training steps of a small MLP with the weights resident in shared memory:
// ONE thread-block cluster runs `steps` consecutive SGD steps per launch.
// Block r of the S blocks owns columns [r*J, (r+1)*J) of every hidden layer
// (J = width / S): those rows of W and b, and the same columns of the
// classifier's weight. Activations and gradients move between blocks
// through distributed shared memory (DSMEM), never through global memory:
//   hidden forward   each block computes its J columns and stores them into
//                    every block's copy of the layer's output (all-gather)
//   logits           each block's J columns give a partial [batch, classes]
//                    sum, stored into every block; each block adds the S
//                    partials in rank order (the same bits everywhere)
//   dgrad            each block multiplies its J gradient columns by its W
//                    rows and stores the fp32 partial input gradient into the
//                    owner of each column (reduce-scatter); the owner adds
//                    the S partials in rank order
//   SGD              every update is local: a block owns what it updates
// so a step has one cluster barrier per exchange (5 for 784-H-H-H-10) and
// touches global memory only for the batch (and the loss). The weights are
// read at the start of a launch and written back at its end.
// Math and rounding points follow the whole-step kernel (fp16 operands, fp32
// accumulation, fp16 activations, gradients and parameters), for every
// activation of activation.hpp (a template argument; the ReLU instances are
// the kernels they always were). Where the activation's backward reads the
// forward input (gelu, gelu_tanh, silu), each block also keeps its own
// columns of every hidden layer's pre-activation in shared memory.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace sg::cuda {

struct WholeStepArgs;

constexpr int kResidentMaxLayers = 8;

// Where everything lives in a block's shared memory (byte offsets), and
// who owns what. Computed on the host by plan_resident_layout.
struct ResidentLayout {
  int cluster = 0;                          // S blocks
  int own[kResidentMaxLayers] = {};         // J of hidden layer l (its width / S)
  int w_stride[kResidentMaxLayers] = {};    // halves per owned W row (dims[l] + 8: no ldmatrix bank conflicts)
  int act_stride[kResidentMaxLayers] = {};  // halves per row of a gathered hidden output
  int x_stride = 0;                         // halves per row of the batch
  int own_stride = 0;                       // halves per row of the last hidden output / the gradient columns
  std::size_t x = 0, w[kResidentMaxLayers] = {}, b[kResidentMaxLayers] = {}, act[kResidentMaxLayers] = {};
  std::size_t w_last = 0, b_last = 0, h_last = 0, grad = 0, exchange[2] = {}, logits = 0, dlogits = 0,
              logits_partial = 0, row_loss = 0, labels = 0, staging = 0, labels_next = 0;
  std::size_t bytes = 0;
  // (Last, so the fields above keep their offsets in the ReLU kernels' parameters.)
  // [B][own_stride] own columns of hidden layer l's pre-activation, when the
  // activation's backward reads it (0 otherwise).
  std::size_t pre[kResidentMaxLayers] = {};
};

// `cluster`: the cluster size to use, one of kResidentClusterSizes
// (kernel_limits.hpp; BackendOptions::resident_cluster), or 0 for the
// largest that fits; another value throws CudaError.
// Empty when the resident kernel can run these sizes as one cluster (of
// that size); otherwise why not.
std::string resident_step_unsupported(const WholeStepArgs& args, int cluster);
// The layout for the largest cluster (16, 8, 4, 2, 1 blocks; or `cluster`)
// whose column split is whole tensor-core tiles and whose shared memory
// fits. Sets the kernel's attributes, so call it outside stream capture.
// Throws when resident_step_unsupported says why.
ResidentLayout plan_resident_layout(const WholeStepArgs& args, int cluster);
void launch_resident_steps(const WholeStepArgs& args, const ResidentLayout& layout, int steps, cudaStream_t stream);
// Names of the phases between consecutive phase_clock entries (first step).
std::vector<std::string> resident_step_phase_names(int layers);

}  // namespace sg::cuda
