// pope-bench matmul: the products of a config's linear layers (qkv, attention output, MLP in,
// MLP out; forward, input gradient, weight gradient) timed in bf16 as the model runs them and in
// per-tensor scaled FP8 as cuBLASLt runs them (e4m3 forward operands, e5m2 gradients, both
// operands K-major), with the casts FP8 needs timed apart: what train.precision = "fp8" can gain.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "pope/config.hpp"

namespace pope {

struct MatmulBenchOptions {
  int warmup = 5;
  int repeats = 20;
};

struct MatmulBenchRow {
  std::string linear;   // qkv, attn_proj, mlp_fc, mlp_proj
  std::string product;  // forward, input_grad, weight_grad
  std::int64_t m = 0, n = 0, k = 0;  // out [m, n], reduction k
  double bf16_ms = 0.0, fp8_ms = 0.0;  // medians
  double cast_ms = 0.0;  // the FP8 cast this product's new operand needs (forward: x, input_grad: dy; else 0)
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

struct MatmulBenchResult {
  std::string device;
  std::int64_t tokens = 0;  // rows of a micro-batch: micro_batch_size × seq_len
  int n_layer = 0, accumulation = 1;
  double weight_cast_ms = 0.0;  // casting one layer's four weights (and their transposes), once per step
  std::vector<MatmulBenchRow> rows;
};

// Throws ConfigError for bad options and std::runtime_error without a CUDA device with FP8
// tensor cores (sm_89 or later) or in a build without CUDA.
MatmulBenchResult run_matmul_benchmark(const RunConfig& config, const MatmulBenchOptions& options);

std::string format_matmul_bench(const MatmulBenchResult& result);
nlohmann::json matmul_bench_to_json(const MatmulBenchResult& result);

}  // namespace pope
