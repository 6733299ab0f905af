// run_matmul_benchmark: for each linear layer of a block (x [M, K] · Wᵀ, W [N, K]) its three
// products on random operands, as the bf16 training step queues them and as FP8 needs them:
//   forward      out [M, N] = x · Wᵀ         bf16 as is; FP8 e4m3 x · e4m3 W (fast accumulation)
//   input_grad   out [M, K] = dy · W         bf16 as is; FP8 e5m2 dy · e4m3 Wᵀ stored [K, N]
//   weight_grad  out [N, K] += dyᵀ · x (f32) bf16 as is; FP8 e5m2 dyᵀ stored [N, M] · e4m3 xᵀ stored [K, M]
// and the casts that make those operands (x and dy each to FP8 and its transpose in one pass;
// the weights once per step). All phases interleaved call by call, medians of CUDA event pairs.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "pope/matmul_bench.hpp"
#ifdef POPE_HAVE_CUDA
#include "cuda/cublaslt_matmul.hpp"
#include "cuda/cuda_device.hpp"
#include "fp8_cast.cuh"
#include "runtime/bench/cuda_event_timer.hpp"
#endif

namespace pope {

#ifdef POPE_HAVE_CUDA

namespace {

using bench::DeviceArray;
using cuda::GemmCall;
using cuda::GemmOperand;
using kernels::Fp8Format;

struct Linear {
  const char* name;
  std::int64_t k, n;  // in, out features
};

// One linear layer's operands in every form its products read.
struct Operands {
  DeviceArray x, w, dy, out_x, out_w, grad_w;  // bf16 x [M, K], W [N, K], dy [M, N]; bf16 outs; f32 dW
  DeviceArray x8, x8_t, w8, w8_t, dy8, dy8_t;  // FP8 forms
  DeviceArray scales;                          // 1.0 each: the cast scale and the dequantization factors
  DeviceArray amax;

  Operands(std::int64_t M, const Linear& l)
      : x(std::size_t(M * l.k) * 2), w(std::size_t(l.n * l.k) * 2), dy(std::size_t(M * l.n) * 2),
        out_x(std::size_t(M * std::max(l.k, l.n)) * 2), out_w(std::size_t(M * l.n) * 2),
        grad_w(std::size_t(l.n * l.k) * 4), x8(std::size_t(M * l.k)), x8_t(std::size_t(M * l.k)),
        w8(std::size_t(l.n * l.k)), w8_t(std::size_t(l.n * l.k)), dy8(std::size_t(M * l.n)),
        dy8_t(std::size_t(M * l.n)), scales(sizeof(float)), amax(sizeof(float)) {}
};

void fill(const DeviceArray& array, std::int64_t count, float bound, std::mt19937& engine) {
  bench::upload_random_bf16(array.tensor(DType::bf16, {count}), -bound, bound, engine);
}

void check_launch(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(status)));
}

}  // namespace

MatmulBenchResult run_matmul_benchmark(const RunConfig& config, const MatmulBenchOptions& options) {
  if (options.repeats <= 0 || options.warmup < 0)
    throw ConfigError("--repeats/--warmup", "expected repeats > 0 and warmup ≥ 0");
  if (cuda_device_count() == 0) throw std::runtime_error("pope-bench matmul needs a CUDA device");
  cudaDeviceProp properties{};
  check_launch(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  if (properties.major * 10 + properties.minor < 89)
    throw std::runtime_error(fmt::format("pope-bench matmul: FP8 tensor cores need sm_89 or later, this GPU is sm_{}{}",
                                         properties.major, properties.minor));
  const std::int64_t C = config.model.n_embd, M = std::int64_t(config.train.micro_batch_size) * config.train.seq_len;
  const Linear linears[] = {{"qkv", C, 3 * C}, {"attn_proj", C, C}, {"mlp_fc", C, 4 * C}, {"mlp_proj", 4 * C, C}};

  MatmulBenchResult result;
  result.device = cuda_device_summary(0);
  result.tokens = M;
  result.n_layer = config.model.n_layer;
  result.accumulation = config.grad_accumulation(1);
  cuda::CublasLtMatmul matmul;
  std::mt19937 engine(1234);
  const float one = 1.0f;
  for (const Linear& l : linears) {
    Operands o(M, l);
    fill(o.x, M * l.k, 1.0f, engine);
    fill(o.w, l.n * l.k, 0.05f, engine);
    fill(o.dy, M * l.n, 1e-3f, engine);
    check_launch(cudaMemcpy(o.scales.get(), &one, sizeof(one), cudaMemcpyHostToDevice), "cudaMemcpy");
    check_launch(cudaMemset(o.grad_w.get(), 0, std::size_t(l.n * l.k) * 4), "cudaMemset");
    const auto* scale = static_cast<const float*>(o.scales.get());
    auto* amax = static_cast<float*>(o.amax.get());
    auto bytes = [](const DeviceArray& a) { return static_cast<std::uint8_t*>(a.get()); };
    auto bf16 = [](const DeviceArray& a) { return static_cast<const __nv_bfloat16*>(a.get()); };
    auto cast = [&](const DeviceArray& in, std::int64_t rows, std::int64_t cols, Fp8Format format,
                    const DeviceArray& out, const DeviceArray& out_t) {
      check_launch(kernels::fp8_cast_transpose_bf16(bf16(in), rows, cols, format, scale, bytes(out), bytes(out_t), amax,
                                                    nullptr),
                   "fp8_cast_transpose_bf16");
    };
    // The operands the FP8 products read, made once before timing.
    cast(o.x, M, l.k, Fp8Format::e4m3, o.x8, o.x8_t);
    cast(o.w, l.n, l.k, Fp8Format::e4m3, o.w8, o.w8_t);
    cast(o.dy, M, l.n, Fp8Format::e5m2, o.dy8, o.dy8_t);

    auto gemm = [&](void* out, bool out_f32, const void* a, const void* b, std::int64_t m, std::int64_t n,
                    std::int64_t k, bool ta, bool tb, GemmOperand at, GemmOperand bt, bool fast) {
      GemmCall call;
      call.out = out, call.out_is_f32 = out_f32, call.a = a, call.b = b, call.m = m, call.n = n, call.k = k;
      call.transpose_a = ta, call.transpose_b = tb, call.a_type = at, call.b_type = bt;
      call.beta = out_f32 ? 1.0f : 0.0f;
      if (at != GemmOperand::bf16) call.a_scale_inv = call.b_scale_inv = scale, call.fast_accumulation = fast;
      return [&matmul, call] { matmul.run(call, nullptr); };
    };
    const GemmOperand b16 = GemmOperand::bf16, e4 = GemmOperand::e4m3, e5 = GemmOperand::e5m2;
    const std::vector<std::function<void()>> phases = {
        gemm(o.out_w.get(), false, o.x.get(), o.w.get(), M, l.n, l.k, false, true, b16, b16, false),
        gemm(o.out_w.get(), false, o.x8.get(), o.w8.get(), M, l.n, l.k, false, true, e4, e4, true),
        gemm(o.out_x.get(), false, o.dy.get(), o.w.get(), M, l.k, l.n, false, false, b16, b16, false),
        gemm(o.out_x.get(), false, o.dy8.get(), o.w8_t.get(), M, l.k, l.n, false, true, e5, e4, false),
        gemm(o.grad_w.get(), true, o.dy.get(), o.x.get(), l.n, l.k, M, true, false, b16, b16, false),
        gemm(o.grad_w.get(), true, o.dy8_t.get(), o.x8_t.get(), l.n, l.k, M, false, true, e5, e4, false),
        [&] { cast(o.x, M, l.k, Fp8Format::e4m3, o.x8, o.x8_t); },
        [&] { cast(o.dy, M, l.n, Fp8Format::e5m2, o.dy8, o.dy8_t); },
        [&] { cast(o.w, l.n, l.k, Fp8Format::e4m3, o.w8, o.w8_t); },
    };
    for (int i = 0; i < options.warmup; ++i)
      for (const auto& phase : phases) phase();
    bench::InterleavedTimer timer(options.repeats, int(phases.size()));
    const std::vector<double> ms = timer.medians_ms(phases);
    result.rows.push_back({l.name, "forward", M, l.n, l.k, ms[0], ms[1], ms[6]});
    result.rows.push_back({l.name, "input_grad", M, l.k, l.n, ms[2], ms[3], ms[7]});
    result.rows.push_back({l.name, "weight_grad", l.n, l.k, M, ms[4], ms[5], 0.0});
    result.weight_cast_ms += ms[8];
  }
  return result;
}

#else

MatmulBenchResult run_matmul_benchmark(const RunConfig&, const MatmulBenchOptions&) {
  throw std::runtime_error("pope-bench matmul needs a build with CUDA");
}

#endif

std::string format_matmul_bench(const MatmulBenchResult& r) {
  std::string out = fmt::format("pope-bench matmul: {} | {} rows per micro-batch, {} layers, {} micro-batches a step\n\n",
                                r.device, r.tokens, r.n_layer, r.accumulation);
  out += "| linear | product | out [m, n], k | bf16 ms | TFLOP/s | FP8 ms | TFLOP/s | FP8 / bf16 | cast ms |\n";
  out += "|---|---|---|---:|---:|---:|---:|---:|---:|\n";
  double bf16 = 0, fp8 = 0, casts = 0;
  for (const MatmulBenchRow& row : r.rows) {
    out += fmt::format("| {} | {} | [{}, {}], {} | {:.3f} | {:.0f} | {:.3f} | {:.0f} | {:.2f} | {:.3f} |\n", row.linear,
                       row.product, row.m, row.n, row.k, row.bf16_ms, row.flops() / (row.bf16_ms * 1e9), row.fp8_ms,
                       row.flops() / (row.fp8_ms * 1e9), row.fp8_ms / row.bf16_ms, row.cast_ms);
    bf16 += row.bf16_ms;
    fp8 += row.fp8_ms;
    casts += row.cast_ms;
  }
  const double per_step = double(r.n_layer) * r.accumulation;
  out += fmt::format(
      "\nPer step ({} layers × {} micro-batches): bf16 linear-layer GEMMs {:.1f} ms; FP8 GEMMs {:.1f} ms, plus {:.1f} ms "
      "of activation and gradient casts as separate passes and {:.2f} ms of weight casts.\n",
      r.n_layer, r.accumulation, bf16 * per_step, fp8 * per_step, casts * per_step, r.weight_cast_ms * r.n_layer);
  return out;
}

nlohmann::json matmul_bench_to_json(const MatmulBenchResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const MatmulBenchRow& row : r.rows)
    rows.push_back({{"linear", row.linear}, {"product", row.product}, {"m", row.m}, {"n", row.n}, {"k", row.k},
                    {"bf16_ms", row.bf16_ms}, {"fp8_ms", row.fp8_ms}, {"cast_ms", row.cast_ms}});
  return {{"device", r.device},       {"tokens", r.tokens},   {"n_layer", r.n_layer},
          {"accumulation", r.accumulation}, {"weight_cast_ms", r.weight_cast_ms}, {"rows", rows}};
}

}  // namespace pope
