// run_attention_benchmark: one AttentionRunner per (encoding, T) on random bf16 inputs (fixed
// seed); warm-up calls, then every timed call between its own pair of CUDA events, all queued
// back to back, and the median per phase. "forward" is AttentionRunner::forward (q/k transform
// + attention), "backward" AttentionRunner::backward (transform again, row dots, the gradient
// kernels, transform backward, PoPE's δ gradient), "forward+backward" the two in a row.
// With several impls (--impl both) each (encoding, T) is timed with each on the same inputs,
// one row per impl, so that cuDNN's SDPA sits next to ours in one run.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "pope/attention_bench.hpp"
#include "pope/backend.hpp"
#include "pope/config.hpp"
#include "pope/position.hpp"
#include "pope/rng.hpp"
#include "model/parameter_init.hpp"
#include "position/registry.hpp"
#ifdef POPE_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_attention.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_device.hpp"
#include "runtime/bench/cuda_event_timer.hpp"
#endif

namespace pope {

namespace {

// "all" stands for every method of the registry (aliases left out).
AttentionBenchOptions expanded(AttentionBenchOptions options) {
  if (options.encodings == std::vector<std::string>{"all"}) options.encodings = position_kinds();
  return options;
}

void check_options(const AttentionBenchOptions& options) {
  for (const std::string& e : options.encodings)
    if (find_position_method(e) == nullptr)
      throw ConfigError("--encodings", fmt::format("unknown encoding '{}', expected one of the model.position.kind "
                                                   "names: {}",
                                                   e, position_method_names()));
  if (options.encodings.empty()) throw ConfigError("--encodings", "expected at least one encoding");
  if (options.lengths.empty()) throw ConfigError("--lengths", "expected at least one sequence length");
  for (int T : options.lengths)
    if (T <= 0 || T > options.tokens)
      throw ConfigError("--lengths", fmt::format("sequence length {} must be in 1..--tokens ({})", T, options.tokens));
  if (options.n_head <= 0 || options.head_dim <= 0 || options.head_dim % 2 != 0)
    throw ConfigError("--heads/--head-dim",
                      fmt::format("expected heads > 0 and an even head_dim > 0, got {} and {}", options.n_head,
                                  options.head_dim));
  if (options.repeats <= 0 || options.warmup < 0)
    throw ConfigError("--repeats/--warmup", "expected repeats > 0 and warmup ≥ 0");
  if (options.impls.empty()) throw ConfigError("--impl", "expected at least one attention impl");
}


#ifdef POPE_HAVE_CUDA

using bench::DeviceArray;
using bench::InterleavedTimer;
using bench::upload_random_bf16;

// cuDNN's SDPA takes no score bias: the cudnn rows leave out the encodings that add one.
bool runs_on(const std::string& kind, AttentionImpl impl) {
  if (impl != AttentionImpl::cudnn) return true;
  ModelConfig model;
  model.position.kind = kind;
  return !make_position_encoding(model)->has_score_bias();
}

AttentionBenchRow bench_one(const AttentionBenchOptions& options, const std::string& kind, AttentionImpl impl, int T,
                            const Tensor& qkv, const Tensor& dout, const Tensor& out, const Tensor& dqkv) {
  ModelConfig model;
  model.n_head = options.n_head;
  model.n_embd = options.n_head * options.head_dim;
  model.context_length = T;
  model.position.kind = kind;
  const std::unique_ptr<PositionEncoding> encoding = make_position_encoding(model);
  const int B = options.tokens / T, H = options.n_head, d = options.head_dim;  // ⌊tokens / T⌋ ≥ 1

  AttentionBenchRow row;
  row.encoding = kind;
  row.impl = impl;
  row.deterministic = impl == AttentionImpl::fused && options.deterministic;
  row.batch = B;
  row.seq_len = T;
  row.n_head = H;
  row.head_dim = d;
  row.qk_width = encoding->transforms_qk() ? encoding->qk_width(d) : d;
  row.forward_flops = 2.0 * B * H * (double(T) * T / 2.0) * (row.qk_width + d);
  row.backward_flops = 2.5 * row.forward_flops;

  DeviceArray lse(std::size_t(B) * H * T * sizeof(float));
  // q̃ and k̃ kept from the forward for the backward, as the model's training step keeps them.
  const std::int64_t encoded_numel = cuda::AttentionRunner::encoded_numel({B, T, H, d}, *encoding);
  DeviceArray encoded(std::size_t(encoded_numel) * sizeof(__nv_bfloat16));
  std::vector<std::unique_ptr<DeviceArray>> storage;
  std::vector<Tensor> params, grads;
  // The positional parameters at the model's initial values, the ones training starts from: a
  // PJ-bias's values decide how often the forward's running maxima move (docs/design.md, "The
  // forward's softmax"), so arbitrary values would time another workload.
  Rng rng(7);
  const std::vector<ParamSpec> specs = encoding->layer_parameters(H, d);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::size_t numel = std::size_t(shape_numel(specs[i].shape));
    std::vector<double> initial(numel);
    initialize_parameter(specs[i], rng, initial,
                         [&](std::span<double> out) { encoding->initialize_custom(i, out, H, d); });
    const std::vector<float> values(initial.begin(), initial.end());
    storage.push_back(std::make_unique<DeviceArray>(numel * sizeof(float)));
    params.push_back(storage.back()->tensor(DType::f32, {std::int64_t(numel)}));
    POPE_CUDA_CHECK(cudaMemcpy(params.back().data, values.data(), numel * sizeof(float), cudaMemcpyHostToDevice));
    storage.push_back(std::make_unique<DeviceArray>(numel * sizeof(float)));
    grads.push_back(storage.back()->tensor(DType::f32, {std::int64_t(numel)}));
    POPE_CUDA_CHECK(cudaMemset(grads.back().data, 0, numel * sizeof(float)));
  }

  const std::int64_t rows = std::int64_t(B) * T, C = std::int64_t(H) * d;  // the first rows of the shared buffers
  AttentionForward forward;
  forward.shape = {B, T, H, d};
  forward.encoding = encoding.get();
  forward.position = PositionContext{T, T, H, d, 0};
  forward.qkv = Tensor{qkv.data, DType::bf16, DeviceKind::cuda, {rows, 3 * C}};
  forward.out = Tensor{out.data, DType::bf16, DeviceKind::cuda, {rows, C}};
  forward.lse = lse.tensor(DType::f32, {B, H, T});
  forward.position_params = params;
  forward.encoded = encoded.tensor(DType::bf16, {encoded_numel});
  forward.impl = impl;
  AttentionBackward backward;
  backward.shape = forward.shape;
  backward.encoding = encoding.get();
  backward.position = forward.position;
  backward.qkv = forward.qkv;
  backward.out = forward.out;
  backward.lse = forward.lse;
  backward.dout = Tensor{dout.data, DType::bf16, DeviceKind::cuda, {rows, C}};
  backward.dqkv = Tensor{dqkv.data, DType::bf16, DeviceKind::cuda, {rows, 3 * C}};
  backward.position_params = params;
  backward.position_grads = grads;
  backward.deterministic = options.deterministic;
  backward.encoded = forward.encoded;
  backward.impl = impl;

  cuda::AttentionRunner runner;
  for (int i = 0; i < options.warmup; ++i) {
    runner.forward(forward, nullptr);
    runner.backward(backward, nullptr);
  }
  InterleavedTimer timer(options.repeats, 3);
  const std::vector<double> ms = timer.medians_ms({[&] { runner.forward(forward, nullptr); },
                                                   [&] { runner.backward(backward, nullptr); },
                                                   [&] {
                                                     runner.forward(forward, nullptr);
                                                     runner.backward(backward, nullptr);
                                                   }});
  row.forward_ms = ms[0];
  row.backward_ms = ms[1];
  row.total_ms = ms[2];
  return row;
}

#endif

}  // namespace

std::vector<AttentionBenchRow> run_attention_benchmark(const AttentionBenchOptions& requested) {
  const AttentionBenchOptions options = expanded(requested);
  check_options(options);
#ifdef POPE_HAVE_CUDA
  if (cuda_device_count() == 0) throw std::runtime_error("pope-bench attention: no CUDA device found");
  const std::int64_t rows = options.tokens, C = std::int64_t(options.n_head) * options.head_dim;
  DeviceArray qkv(std::size_t(rows * 3 * C) * 2), dout(std::size_t(rows * C) * 2), out(std::size_t(rows * C) * 2),
      dqkv(std::size_t(rows * 3 * C) * 2);
  const Tensor qkv_t = qkv.tensor(DType::bf16, {rows, 3 * C}), dout_t = dout.tensor(DType::bf16, {rows, C});
  std::mt19937 engine(1337);
  upload_random_bf16(qkv_t, -1.5f, 1.5f, engine);
  upload_random_bf16(dout_t, -1.0f, 1.0f, engine);
  std::vector<AttentionBenchRow> rows_out;
  for (const std::string& kind : options.encodings)
    for (int T : options.lengths)
      for (AttentionImpl impl : options.impls)
        if (runs_on(kind, impl))
          rows_out.push_back(bench_one(options, kind, impl, T, qkv_t, dout_t, out.tensor(DType::bf16, {rows, C}),
                                       dqkv.tensor(DType::bf16, {rows, 3 * C})));
  return rows_out;
#else
  throw std::runtime_error("pope-bench attention needs a build with CUDA (POPE_ENABLE_CUDA=ON)");
#endif
}

std::string format_attention_bench(const std::vector<AttentionBenchRow>& rows) {
  std::string text =
      fmt::format("{:<16} {:>5} {:>6} {:>3} {:>4} {:>4} {:>4} {:>6} | {:>9} {:>9} {:>9} | {:>7} {:>7} {:>7}\n",
                  "encoding", "impl", "T", "B", "H", "d", "W", "dq", "fwd ms", "bwd ms", "f+b ms", "fwd TF", "bwd TF",
                  "f+b TF");
  for (const AttentionBenchRow& r : rows)
    text += fmt::format(
        "{:<16} {:>5} {:>6} {:>3} {:>4} {:>4} {:>4} {:>6} | {:>9.3f} {:>9.3f} {:>9.3f} | {:>7.1f} {:>7.1f} {:>7.1f}\n",
        r.encoding, name_of(r.impl), r.seq_len, r.batch, r.n_head, r.head_dim, r.qk_width,
        r.deterministic ? "fixed" : "atomic",
        r.forward_ms, r.backward_ms, r.total_ms, r.forward_tflops(), r.backward_tflops(), r.total_tflops());
  text +=
      "TFLOP/s from causal FLOPs: forward 2·B·H·(T²/2)·(W + d) (QKᵀ over W, PV over d), backward 2.5× forward; "
      "times include the q/k transform (ours for either impl); cudnn: cuDNN's fused SDPA on the encoded q̃, k̃, "
      "for encodings without a score bias; positional parameters at the model's initial values.\n";
  return text;
}

nlohmann::json attention_bench_to_json(const std::vector<AttentionBenchRow>& rows) {
  nlohmann::json list = nlohmann::json::array();
  for (const AttentionBenchRow& r : rows)
    list.push_back({{"encoding", r.encoding},
                    {"impl", std::string(name_of(r.impl))},
                    {"deterministic", r.deterministic},
                    {"batch", r.batch},
                    {"seq_len", r.seq_len},
                    {"n_head", r.n_head},
                    {"head_dim", r.head_dim},
                    {"qk_width", r.qk_width},
                    {"forward_ms", r.forward_ms},
                    {"backward_ms", r.backward_ms},
                    {"forward_backward_ms", r.total_ms},
                    {"forward_tflops", r.forward_tflops()},
                    {"backward_tflops", r.backward_tflops()},
                    {"forward_backward_tflops", r.total_tflops()}});
  return {{"benchmark", "attention"}, {"rows", list}};
}

}  // namespace pope
