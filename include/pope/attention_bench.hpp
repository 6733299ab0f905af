// pope-bench attention: forward, backward and forward+backward time of the CUDA causal
// attention (the encoding's q/k transform included; the backward reads the q̃, k̃ the forward
// kept, as the model does) per positional encoding and sequence length at a fixed number of
// tokens B·T, and the TFLOP/s that time implies.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "pope/backend.hpp"

namespace pope {

struct AttentionBenchOptions {
  // Any model.position.kind name, or {"all"}: every method of the registry. The default: the
  // PoPE paper's four, PJ-RoPE's `full` (bias only) and `pj_rotary` (transform only), and one
  // encoding per other plan path: xpos (a scaled rotation) and t5_bias (lag buckets).
  std::vector<std::string> encodings{"nope", "rope", "pope", "alibi", "full", "pj_rotary", "xpos", "t5_bias"};
  std::vector<int> lengths{1024, 4096, 10240, 16384};
  int tokens = 16384;  // B = ⌊tokens / T⌋ (T = 10240: B = 1)
  int n_head = 12;
  int head_dim = 64;
  int warmup = 5;
  int repeats = 30;
  bool deterministic = true;  // false: the fused backward's atomic dq̃ (AttentionBackward::deterministic)
  // Each (encoding, T) is timed once per impl, side by side; cudnn skips encodings with a score
  // bias (cuDNN's SDPA takes none).
  std::vector<AttentionImpl> impls{AttentionImpl::fused};
};

struct AttentionBenchRow {
  std::string encoding;
  AttentionImpl impl = AttentionImpl::fused;
  // Whether the backward is bitwise repeatable: AttentionBenchOptions::deterministic for fused;
  // false for cudnn, whose backward accumulates dq̃ with atomic adds.
  bool deterministic = true;
  int batch = 0, seq_len = 0, n_head = 0, head_dim = 0, qk_width = 0;
  double forward_ms = 0.0, backward_ms = 0.0, total_ms = 0.0;  // medians
  double forward_flops = 0.0;  // causal: (QKᵀ + PV) = 2·B·H·(T²/2)·(qk_width + head_dim)
  double backward_flops = 0.0;  // 2.5 × forward (five products instead of two)
  double forward_tflops() const { return forward_flops / (forward_ms * 1e-3) / 1e12; }
  double backward_tflops() const { return backward_flops / (backward_ms * 1e-3) / 1e12; }
  double total_tflops() const { return (forward_flops + backward_flops) / (total_ms * 1e-3) / 1e12; }
};

// Throws ConfigError for bad options (an encoding that is no model.position.kind, T outside
// 1..tokens, a head_dim the encoding cannot split, no impl, …) and
// std::runtime_error without a CUDA device or in a build without CUDA.
std::vector<AttentionBenchRow> run_attention_benchmark(const AttentionBenchOptions& options);

std::string format_attention_bench(const std::vector<AttentionBenchRow>& rows);
nlohmann::json attention_bench_to_json(const std::vector<AttentionBenchRow>& rows);

}  // namespace pope
