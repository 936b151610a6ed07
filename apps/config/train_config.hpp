#pragma once
// The typed training configuration read from YAML (configs/*.yaml). Every key
// below is the YAML key path; unknown keys, wrong types and out-of-range
// values are ConfigError naming the file, line and key.
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/backend_options.hpp"
#include "runtime/data_parallel_defaults.hpp"

namespace sg::app {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One entry of model.sequential: `- conv2d: {out: 10, kernel: 5}` (the layer
// kind as the only key, its options as a mapping; `- relu` or `- relu: {}`
// for a layer without options). Defaults resolved on loading.
struct LayerConfig {
  std::string kind;          // linear conv2d max_pool2d avg_pool2d global_avg_pool2d layer_norm batch_norm flatten
                             // dropout dropout2d add concat residual, or an activation name
  std::int64_t out = 0;      // linear: features; conv2d: channels (required)
  std::int64_t kernel = 0;   // conv2d, max_pool2d, avg_pool2d (required)
  std::int64_t stride = 0;   // conv2d: default 1; max_pool2d, avg_pool2d: default kernel
  std::int64_t padding = 0;  // conv2d
  bool bias = true;          // linear, conv2d: false leaves the bias out (PyTorch's bias=False, e.g. before batch_norm)
  double p = 0.5;            // dropout, dropout2d (PyTorch's default)
  double eps = 1e-5;         // layer_norm, batch_norm (PyTorch's default)
  double momentum = 0.1;     // batch_norm (PyTorch's default)
  // Any layer (issue 37's model graph): its name, and the layers it reads
  // (empty: the one before; "input": the model's input). add: two or more.
  std::string name = {};
  std::vector<std::string> inputs = {};
  // residual (issue 37's short form of a residual block): `body` runs on the
  // block's input (the layer before, or its one `inputs` entry), and its
  // output is added to that input, or to `projection`'s output (none or one
  // layer, e.g. a 1x1 conv2d, also on the block's input); `name` names the sum.
  std::vector<LayerConfig> body = {};
  std::vector<LayerConfig> projection = {};
  bool operator==(const LayerConfig&) const = default;
};
// "conv2d{out: 10, kernel: 5, stride: 1, padding: 0}" (the layer's keys only).
std::string layer_text(const LayerConfig& layer);

struct ModelConfig {
  // Either `layers` (full list, input first, classes last: [784,128,128,128,10])
  // or `input` + `hidden_width` + `hidden_depth` + `classes`; after loading,
  // `layers` always holds the expanded list.
  std::vector<std::int64_t> layers;
  std::int64_t input = 784;
  std::int64_t hidden_width = 0;
  std::int64_t hidden_depth = 0;
  std::int64_t classes = 10;
  // Between hidden layers: relu | gelu | gelu_tanh | silu | tanh | sigmoid | identity.
  std::string activation = "relu";
  std::string loss = "softmax_xent";  // softmax_xent | mse | l1 (mse/l1 regress float targets)
  double label_smoothing = 0.0;       // softmax_xent only: PyTorch CrossEntropyLoss(label_smoothing)
  double dropout = 0.0;               // after each hidden activation (training only), in [0, 1)
  // The Sequential form (issue 22), instead of layers / hidden_width: the
  // per-example input shape (`input: [1, 28, 28]` or `[784]`; a plain
  // `input: 784` means [784]) and the layer list. After loading, `input` is
  // the shape's element count and `classes` the last layer's outputs;
  // `layers` stays empty.
  std::vector<std::int64_t> input_shape;
  std::vector<LayerConfig> sequential;
  bool is_sequential() const { return !sequential.empty(); }
};

struct DataConfig {
  std::string dir = "data/mnist";  // folder with the four IDX files (.gz or raw)
  std::int64_t batch_size = 32;
  std::uint64_t shuffle_seed = 1;
  bool normalize = false;          // (x - mean) / std after scaling to [0,1]
  double mean = 0.1307;
  double std = 0.3081;
  std::int64_t train_limit = 0;    // use the first N training images (0 = all)
  std::int64_t test_limit = 0;     // use the first N test images (0 = all)
  std::int64_t eval_batch_size = 1000;
  // Your own data (runtime/data/dataset_files.hpp, docs/own_data.md).
  std::string format;              // idx | npy | csv; "" = guess (idx without train_x, else train_x's extension)
  std::string train_x;             // npy: x.npy, data.npz or data.npz:array; csv: the table
  std::string train_y;             // npy: y.npy or data.npz:array ("" with an .npz train_x: its y_train)
  std::string test_x;              // "" : the .npz's x_test if it has one, else data.test_fraction
  std::string test_y;
  std::string label_column;        // csv: the label (or comma-separated target) column(s)
  double test_fraction = 0.0;      // without test files: this fraction of the training rows (0 < f < 1)
  std::uint64_t split_seed = 0;    // which rows test_fraction picks
  // Training batches of images augmented inside the step (issue 37; never at eval).
  std::int64_t augment_translate = 0;  // data.augment.translate: up to this many pixels each way, zero-filled
  bool augment_flip = false;           // data.augment.flip: mirror left-right with probability 1/2
};

struct LrScheduleConfig {
  std::string kind = "constant";   // constant | step | cosine
  std::int64_t warmup_steps = 0;   // linear warm-up from 0 over this many steps
  std::int64_t step_size = 1000;   // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  double min_lr = 0.0;             // cosine: floor
};

struct OptimConfig {
  std::string name = "sgd";        // sgd | adam | adamw | rmsprop
  double lr = 0.01;
  double momentum = 0.0;           // sgd, rmsprop
  double weight_decay = 0.0;       // sgd, adam, rmsprop: L2 added to the gradient; adamw: decoupled (PyTorch)
  bool nesterov = false;           // sgd: Nesterov momentum (needs momentum > 0)
  double beta1 = 0.9;              // adam, adamw: `betas: [beta1, beta2]`
  double beta2 = 0.999;
  double eps = 1e-8;               // adam, adamw, rmsprop
  double alpha = 0.99;             // rmsprop: smoothing constant of the squared-gradient average
  bool centered = false;           // rmsprop: normalise by the centered second moment (PyTorch's `centered`)
  double clip_grad_norm = 0.0;     // > 0: clip the global gradient L2 norm to this (0 = off)
  LrScheduleConfig schedule;
};

struct PrecisionConfig {
  std::string weights = "fp16";     // fp16 | bf16 | fp32 (fp32 master weights; fp16 / bf16: the compute dtype)
  std::string accumulate = "fp32";  // fp16 | fp32 (cuBLASLt compute type)
  std::string compute = "fp16";     // fp16 | bf16: matmul inputs and activations
  // fp32 | compute: what data-parallel ranks reduce fp32 master weights' gradients in (compute: f16/bf16, half the
  // bytes; docs/data_parallel.md). Nothing changes for fp16/bf16 weights, whose gradients are in the compute dtype.
  std::string all_reduce = "fp32";
};

// Data-parallel ranks (--gpus, torchrun / Slurm / Open MPI variables; docs/data_parallel.md).
struct DataParallelConfig {
  // 0: one all-reduce bucket per layer (each issued when its layer's gradients are done); > 0: layers' buckets
  // joined, in the order their gradients complete, until one holds at least this many MiB (PyTorch DDP's
  // bucket_cap_mb; DDP's default is 25): fewer NCCL calls for small layers, less overlap with the backward pass.
  // 4: with one update launch per bucket, the 1024-wide MLP's 5.8 MB in two buckets (+3.5% over 25 on 2 H200s,
  // docs/data_parallel.md); networks under 4 MB of gradients, or of layers over 4 MB, are bucketed as with 25.
  double bucket_mb = 4.0;
  // NCCL's CTAs (thread blocks) per collective, fixed; 0: NCCL's own choice (docs/data_parallel.md measures both).
  std::int64_t nccl_ctas = data_parallel_defaults::kNcclCtas;
  // The step's arena in NCCL symmetric memory, registered as one window: each bucket is one ncclSum of the
  // pre-scaled gradients on NCCL's symmetric (load/store over NVLink) kernels; false: the ring on plain memory.
  bool symmetric_memory = data_parallel_defaults::kSymmetricMemory;
  // ZeRO-1: each parameter of zero1_min_mb or more reduced-scattered, updated by the rank that owns its share
  // (the optimizer state's work split N ways), gathered back at the next step's start beside the forward;
  // checkpoints hold every share (gathered on save). Not with optim.clip_grad_norm. docs/data_parallel.md says
  // when it pays.
  bool zero1 = false;
  // Smaller parameters stay all-reduced with zero1 (their two collectives would cost more than half their update).
  double zero1_min_mb = 16.0;
  // How a layer's weight gradient becomes the global batch's: "reduce" (each rank's gradient all-reduced),
  // "gather" (each rank gathers every rank's rows of the layer's input and output gradient and computes the whole
  // batch's gradient itself: fewer bytes where a layer has more weights than rows, the single-process fused
  // gradient-and-update kernels kept), "auto" (gather a layer where its gathers' bytes and calls cost less than
  // its all-reduce: the 8192-wide MLP's hidden layers, 0.59 -> 0.86 efficiency on 2 H200s; nothing in the
  // shipped configs). graph/gathered_gradients.hpp, docs/data_parallel.md.
  std::string weight_gradients = "auto";
};

struct RunConfig {
  // Exactly one of steps / epochs is > 0. A --set of one over a file that sets the other replaces it
  // (`--set run.steps=50` on an epochs config trains 50 steps; parse_config logs that).
  std::int64_t steps = 0;
  std::int64_t epochs = 0;
  std::uint64_t seed = 0;          // parameter initialisation
  std::int64_t eval_every = 0;     // 0 = only at the end
  std::int64_t log_every = 100;
  std::string out_dir = "runs/default";  // metrics, plot, resolved config
  std::string checkpoint;          // path to write at the end / on Ctrl-C ("" = none)
  std::int64_t checkpoint_every = 0;
  std::string resume;              // checkpoint to resume from ("" = fresh)
  // loss.svg's y axis: linear | log | auto (log when every loss is > 0 and they span more than two decades,
  // as a regression run's late losses do; linear otherwise).
  std::string loss_plot_scale = "auto";
};

struct BackendConfig {
  std::string kind = "auto";       // auto | cuda | cpu
  bool cuda_graph = true;          // false: plain stream launches
  // Every other backend: key, typed: read, written and checked row by row from
  // runtime/backend_option_table.hpp (accumulate_f16 comes from precision.accumulate).
  BackendOptions options;
};

struct TrainConfig {
  std::string source;  // file the config came from (for messages)
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  PrecisionConfig precision;
  DataParallelConfig data_parallel;
  RunConfig run;
  BackendConfig backend;
};

// Loads and validates `path`, then applies `overrides` ("optim.lr=0.1"; the
// value is parsed as YAML) before validation. Throws ConfigError.
TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});
// Same from YAML text; `source` names it in messages.
TrainConfig parse_config(const std::string& yaml_text, const std::string& source,
                         const std::vector<std::string>& overrides = {});
// The fully resolved configuration as YAML (every key, defaults included);
// parse_config(to_yaml(c)) reproduces c.
std::string to_yaml(const TrainConfig& config);

}  // namespace sg::app
