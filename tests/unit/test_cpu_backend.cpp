// The CPU reference backend's non-attention ops: values against direct formulas,
// backwards against finite differences (in double), argument errors, float/double
// agreement and thread-count independence.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include "cpu/cpu_backend.hpp"
#include "cpu_gradient_check.hpp"

using namespace pope;
using pope::test::expect_gradient_matches;
using pope::test::host_tensor;
using pope::test::numerical_gradient;
using pope::test::random_values;
using pope::test::weighted_sum;

namespace {

std::unique_ptr<Backend> double_backend(int threads = 1) { return make_cpu_backend("double", threads); }

std::vector<float> to_float(const std::vector<double>& values) { return {values.begin(), values.end()}; }

}  // namespace

TEST(CpuBackend, FactoryDescribesItselfAndRejectsBadArguments) {
  auto f = make_cpu_backend("float", 2);
  EXPECT_EQ(f->description(), "cpu (float, 2 threads, OpenBLAS)");
  EXPECT_EQ(f->dtypes().activation, DType::f32);
  EXPECT_EQ(f->dtypes().parameter, DType::f32);
  EXPECT_EQ(f->dtypes().statistic, DType::f32);
  auto d = make_cpu_backend("double", 1);
  EXPECT_EQ(d->description(), "cpu (double, 1 thread, OpenBLAS)");
  EXPECT_EQ(d->dtypes().activation, DType::f64);
  EXPECT_EQ(d->device(), DeviceKind::cpu);
  EXPECT_THROW(make_cpu_backend("half", 1), std::invalid_argument);
  EXPECT_THROW(make_cpu_backend("float", -1), std::invalid_argument);
}

TEST(CpuBackend, AllocateGivesZeroedAlignedMemory) {
  auto backend = make_cpu_backend("float", 1);
  for (std::size_t bytes : {1, 100, 4096}) {
    Buffer buffer = backend->allocate(bytes);
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(buffer.get()) % 64, 0u);
    const auto* bytes_ptr = static_cast<const unsigned char*>(buffer.get());
    for (std::size_t i = 0; i < bytes; ++i) ASSERT_EQ(bytes_ptr[i], 0) << "byte " << i;
  }
  OwnedTensor t = allocate_tensor(*backend, {3, 5}, DType::f32);
  backend->fill(t.tensor, 2.5);
  std::vector<float> host(15);
  backend->copy_to_host(host.data(), t.tensor);
  for (float v : host) EXPECT_EQ(v, 2.5f);
  std::vector<float> other(15, 0.0f);
  other[7] = 9.0f;
  backend->copy_from_host(t.tensor, other.data());
  OwnedTensor u = allocate_tensor(*backend, {15}, DType::f32);
  backend->copy(u.tensor, t.tensor);
  EXPECT_EQ(u.tensor.as<float>()[7], 9.0f);
  OwnedTensor halves = allocate_tensor(*backend, {2}, DType::bf16);
  backend->fill(halves.tensor, -1.0);
  EXPECT_EQ(static_cast<const std::uint16_t*>(halves.tensor.data)[1], 0xBF80);  // bf16 −1
  OwnedTensor ids = allocate_tensor(*backend, {2}, DType::i32);
  backend->fill(ids.tensor, 7.0);
  EXPECT_EQ(ids.tensor.as<std::int32_t>()[1], 7);
  OwnedTensor wrong = allocate_tensor(*backend, {15}, DType::f64);
  EXPECT_THROW(backend->copy(wrong.tensor, t.tensor), std::invalid_argument);
}

TEST(CpuBackend, ConvertRoundsToBfloat16NearestEven) {
  auto backend = make_cpu_backend("float", 1);
  // 1 + 2⁻⁸ lies halfway between bf16 1.0 (0x3F80, even) and 1 + 2⁻⁷ (0x3F81): goes to even.
  // 1 + 3·2⁻⁸ lies halfway between 0x3F81 (odd) and 0x3F82: goes to 0x3F82.
  // 1 + 2⁻⁸ + 2⁻²⁰ is just above halfway: rounds up to 0x3F81. −2 is exact (0xC000).
  std::vector<float> source = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.0f,
                               std::numeric_limits<float>::quiet_NaN()};
  std::vector<std::uint16_t> bf16(source.size());
  const Tensor bf16_tensor{bf16.data(), DType::bf16, DeviceKind::cpu, {5}};  // host_tensor would say u16
  backend->convert(bf16_tensor, host_tensor(source, {5}));
  EXPECT_EQ(bf16[0], 0x3F80);
  EXPECT_EQ(bf16[1], 0x3F82);
  EXPECT_EQ(bf16[2], 0x3F81);
  EXPECT_EQ(bf16[3], 0xC000);
  std::vector<double> back(5);
  backend->convert(host_tensor(back, {5}), bf16_tensor);
  EXPECT_EQ(back[0], 1.0);
  EXPECT_EQ(back[1], 1.0 + 0x1p-6);
  EXPECT_EQ(back[2], 1.0 + 0x1p-7);
  EXPECT_EQ(back[3], -2.0);
  EXPECT_TRUE(std::isnan(back[4]));

  std::vector<double> wide = {0.1, -3.25};
  std::vector<float> narrow(2);
  backend->convert(host_tensor(narrow, {2}), host_tensor(wide, {2}));
  EXPECT_EQ(narrow[0], 0.1f);
  EXPECT_EQ(narrow[1], -3.25f);

  std::vector<std::int32_t> ints(2);
  EXPECT_THROW(backend->convert(host_tensor(ints, {2}), host_tensor(wide, {2})), std::invalid_argument);
  std::vector<float> short_dst(1);
  EXPECT_THROW(backend->convert(host_tensor(short_dst, {1}), host_tensor(wide, {2})), std::invalid_argument);
}

TEST(CpuBackend, EmbeddingGathersRowsAndAccumulatesGradient) {
  auto backend = double_backend();
  const int vocab = 5, width = 3;
  std::vector<double> table = random_values(vocab * width, 1);
  std::vector<std::int32_t> tokens = {4, 0, 4, 2};
  std::vector<double> out(tokens.size() * width);
  backend->embedding_forward(host_tensor(out, {4, width}), host_tensor(tokens, {4}), host_tensor(table, {vocab, width}));
  for (std::size_t n = 0; n < tokens.size(); ++n)
    for (int c = 0; c < width; ++c) EXPECT_EQ(out[n * width + c], table[tokens[n] * width + c]);

  // Backward against finite differences of Σ w·out, on top of a gradient already present.
  std::vector<double> weights = random_values(out.size(), 2);
  std::vector<double> dtable = random_values(table.size(), 3);
  const std::vector<double> before = dtable;
  backend->embedding_backward(host_tensor(dtable, {vocab, width}), host_tensor(weights, {4, width}),
                              host_tensor(tokens, {4}));
  auto loss = [&] {
    backend->embedding_forward(host_tensor(out, {4, width}), host_tensor(tokens, {4}), host_tensor(table, {vocab, width}));
    return weighted_sum(out, weights);
  };
  std::vector<double> added(table.size());
  for (std::size_t i = 0; i < table.size(); ++i) added[i] = dtable[i] - before[i];
  expect_gradient_matches(added, numerical_gradient(table, loss), "embedding dwte");

  std::vector<std::int32_t> bad = {0, 5, 1, 1};
  EXPECT_THROW(backend->embedding_forward(host_tensor(out, {4, width}), host_tensor(bad, {4}), host_tensor(table, {vocab, width})),
               std::invalid_argument);
  bad[1] = -1;
  EXPECT_THROW(backend->embedding_backward(host_tensor(dtable, {vocab, width}), host_tensor(out, {4, width}), host_tensor(bad, {4})),
               std::invalid_argument);
}

TEST(CpuBackend, RmsNormForwardAndGradients) {
  auto backend = double_backend();
  const int rows = 4, width = 6;
  const double eps = 1e-5;
  std::vector<double> x = random_values(rows * width, 4), gain = random_values(width, 5);
  std::vector<double> out(rows * width), rstd(rows);
  auto forward = [&] {
    backend->rmsnorm_forward(host_tensor(out, {rows, width}), host_tensor(rstd, {rows}), host_tensor(x, {rows, width}),
                             host_tensor(gain, {width}), eps);
  };
  forward();
  for (int n = 0; n < rows; ++n) {
    double mean_square = 0;
    for (int c = 0; c < width; ++c) mean_square += x[n * width + c] * x[n * width + c] / width;
    EXPECT_NEAR(rstd[n], 1 / std::sqrt(mean_square + eps), 1e-12);
    for (int c = 0; c < width; ++c)
      EXPECT_NEAR(out[n * width + c], x[n * width + c] / std::sqrt(mean_square + eps) * gain[c], 1e-12);
  }

  std::vector<double> weights = random_values(out.size(), 6);
  std::vector<double> dx = random_values(x.size(), 7), dgain = random_values(width, 8);
  const std::vector<double> dx_before = dx, dgain_before = dgain;
  backend->rmsnorm_backward(host_tensor(dx, {rows, width}), host_tensor(dgain, {width}), host_tensor(weights, {rows, width}),
                            host_tensor(x, {rows, width}), host_tensor(gain, {width}), host_tensor(rstd, {rows}));
  auto loss = [&] {
    forward();
    return weighted_sum(out, weights);
  };
  std::vector<double> dx_added(x.size()), dgain_added(width);
  for (std::size_t i = 0; i < x.size(); ++i) dx_added[i] = dx[i] - dx_before[i];
  for (int c = 0; c < width; ++c) dgain_added[c] = dgain[c] - dgain_before[c];
  expect_gradient_matches(dx_added, numerical_gradient(x, loss), "rmsnorm dx");
  expect_gradient_matches(dgain_added, numerical_gradient(gain, loss), "rmsnorm dgain");

  std::vector<double> short_gain(width - 1);
  EXPECT_THROW(backend->rmsnorm_forward(host_tensor(out, {rows, width}), host_tensor(rstd, {rows}),
                                        host_tensor(x, {rows, width}), host_tensor(short_gain, {width - 1}), eps),
               std::invalid_argument);
}

// out = op(a)·op(b) for every transpose combination: the forward against a direct triple
// loop (with alpha and beta), and the backward a model writes with transposed matmuls
// against finite differences.
TEST(CpuBackend, MatmulAllTransposesForwardAndBackward) {
  auto backend = double_backend();
  const int M = 3, K = 4, N = 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "transpose_a " << ta << ", transpose_b " << tb);
      const Shape a_shape = ta ? Shape{K, M} : Shape{M, K}, b_shape = tb ? Shape{N, K} : Shape{K, N};
      std::vector<double> a = random_values(M * K, 10), b = random_values(K * N, 11);
      auto op_a = [&](int i, int k) { return ta ? a[k * M + i] : a[i * K + k]; };
      auto op_b = [&](int k, int j) { return tb ? b[j * K + k] : b[k * N + j]; };

      std::vector<double> out = random_values(M * N, 12);
      const std::vector<double> prior = out;
      backend->matmul(host_tensor(out, {M, N}), host_tensor(a, a_shape), host_tensor(b, b_shape), ta, tb, 0.5, 2.0);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          double product = 0;
          for (int k = 0; k < K; ++k) product += op_a(i, k) * op_b(k, j);
          EXPECT_NEAR(out[i * N + j], 0.5 * product + 2.0 * prior[i * N + j], 1e-12);
        }

      const std::vector<double> weights = random_values(M * N, 13);  // dL/dout
      std::vector<double> dweights = weights;
      std::vector<double> da(a.size()), db(b.size());
      // dop(a) = dout · op(b)ᵀ, dop(b) = op(a)ᵀ · dout, stored transposed where a or b is.
      if (ta) backend->matmul(host_tensor(da, a_shape), host_tensor(b, b_shape), host_tensor(dweights, {M, N}), tb, true);
      else backend->matmul(host_tensor(da, a_shape), host_tensor(dweights, {M, N}), host_tensor(b, b_shape), false, !tb);
      if (tb) backend->matmul(host_tensor(db, b_shape), host_tensor(dweights, {M, N}), host_tensor(a, a_shape), true, ta);
      else backend->matmul(host_tensor(db, b_shape), host_tensor(a, a_shape), host_tensor(dweights, {M, N}), !ta, false);
      auto loss = [&] {
        backend->matmul(host_tensor(out, {M, N}), host_tensor(a, a_shape), host_tensor(b, b_shape), ta, tb);
        return weighted_sum(out, weights);
      };
      expect_gradient_matches(da, numerical_gradient(a, loss), "matmul da");
      expect_gradient_matches(db, numerical_gradient(b, loss), "matmul db");
    }
  }
  std::vector<double> a(6), b(6), out(4);
  EXPECT_THROW(backend->matmul(host_tensor(out, {2, 2}), host_tensor(a, {2, 3}), host_tensor(b, {2, 3}), false, false),
               std::invalid_argument);
  std::vector<float> a_float(6);
  EXPECT_THROW(backend->matmul(host_tensor(out, {2, 2}), host_tensor(a_float, {2, 3}), host_tensor(b, {3, 2}), false, false),
               std::invalid_argument);
}

// Output rows are computed in blocks of 64 by separate GEMM calls; check the blocks fit
// together for both layouts of a.
TEST(CpuBackend, MatmulSpanningSeveralRowBlocks) {
  auto backend = make_cpu_backend("double", 2);
  const int M = 150, K = 5, N = 7;
  for (bool ta : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "transpose_a " << ta);
    std::vector<double> a = random_values(M * K, 17), b = random_values(K * N, 18), out(M * N);
    backend->matmul(host_tensor(out, {M, N}), host_tensor(a, ta ? Shape{K, M} : Shape{M, K}), host_tensor(b, {K, N}), ta,
                    false);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double product = 0;
        for (int k = 0; k < K; ++k) product += (ta ? a[k * M + i] : a[i * K + k]) * b[k * N + j];
        ASSERT_NEAR(out[i * N + j], product, 1e-12) << "row " << i << ", column " << j;
      }
  }
}

TEST(CpuBackend, GeluValuesAndGradient) {
  auto backend = double_backend();
  std::vector<double> x = random_values(20, 14, 2.0), out(20);
  x[0] = 0.0;
  auto forward = [&] { backend->gelu_forward(host_tensor(out, {20}), host_tensor(x, {20})); };
  forward();
  EXPECT_EQ(out[0], 0.0);
  for (int i = 0; i < 20; ++i) {
    // The tanh approximation stays within 1e-3 of the exact x·Φ(x).
    const double exact = 0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0)));
    EXPECT_NEAR(out[i], exact, 1e-3) << "x = " << x[i];
  }
  std::vector<double> weights = random_values(20, 15), dx(20);
  backend->gelu_backward(host_tensor(dx, {20}), host_tensor(weights, {20}), host_tensor(x, {20}));
  auto loss = [&] {
    forward();
    return weighted_sum(out, weights);
  };
  expect_gradient_matches(dx, numerical_gradient(x, loss), "gelu dx");
}

TEST(CpuBackend, AddAllowsAliasing) {
  auto backend = double_backend();
  std::vector<double> a = {1, 2, 3}, b = {10, 20, 30}, out(3);
  backend->add(host_tensor(out, {3}), host_tensor(a, {3}), host_tensor(b, {3}));
  EXPECT_EQ(out, (std::vector<double>{11, 22, 33}));
  backend->add(host_tensor(a, {3}), host_tensor(a, {3}), host_tensor(b, {3}));
  EXPECT_EQ(a, (std::vector<double>{11, 22, 33}));
  std::vector<double> shorter(2);
  EXPECT_THROW(backend->add(host_tensor(out, {3}), host_tensor(shorter, {2}), host_tensor(b, {3})), std::invalid_argument);
}

// In place, bounds rounded to the dtype (float(−2π) is not double −2π), NaN kept, lowest ≤ highest.
TEST(CpuBackend, ClampHoldsValuesToTheBoundsInPlace) {
  const double lowest = -2.0 * std::numbers::pi;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> x = {0.5, -7.0, -1.0, 0.0, lowest, std::nextafter(0.0, 1.0), nan};
  double_backend()->clamp(host_tensor(x, {7}), lowest, 0.0);
  EXPECT_EQ(std::vector<double>(x.begin(), x.end() - 1), (std::vector<double>{0.0, lowest, -1.0, 0.0, lowest, 0.0}));
  EXPECT_TRUE(std::isnan(x.back()));
  std::vector<float> f = {-7.0f, 0.25f, -3.0f};
  make_cpu_backend("float", 2)->clamp(host_tensor(f, {3}), lowest, 0.0);
  EXPECT_EQ(f, (std::vector<float>{float(lowest), 0.0f, -3.0f}));
  EXPECT_THROW(double_backend()->clamp(host_tensor(x, {7}), 0.0, lowest), std::invalid_argument);
  EXPECT_THROW(double_backend()->clamp(host_tensor(f, {3}), lowest, 0.0), std::invalid_argument);  // float data
}

TEST(CpuBackend, CrossEntropyLossMaskingPaddingAndGradient) {
  auto backend = double_backend();
  const int rows = 4, vocab = 5, padded = 8;
  std::vector<double> logits = random_values(rows * padded, 16, 2.0);
  for (int n = 0; n < rows; ++n)
    for (int j = vocab; j < padded; ++j) logits[n * padded + j] = 50.0;  // would dominate if not excluded
  std::vector<std::int32_t> targets = {3, -1, 0, 4};
  const double grad_scale = 0.25;
  std::vector<double> losses(rows);

  std::vector<double> work = logits;
  backend->cross_entropy(host_tensor(losses, {rows}), host_tensor(work, {rows, padded}), host_tensor(targets, {rows}),
                         vocab, false, 1.0);
  for (int n = 0; n < rows; ++n) {
    if (targets[n] < 0) {
      EXPECT_EQ(losses[n], 0.0);
      continue;
    }
    double normaliser = 0;
    for (int j = 0; j < vocab; ++j) normaliser += std::exp(logits[n * padded + j]);
    EXPECT_NEAR(losses[n], std::log(normaliser) - logits[n * padded + targets[n]], 1e-12) << "row " << n;
  }
  EXPECT_EQ(work, logits) << "without compute_grad the logits stay as they were";

  backend->cross_entropy(host_tensor(losses, {rows}), host_tensor(work, {rows, padded}), host_tensor(targets, {rows}),
                         vocab, true, grad_scale);
  for (int j = 0; j < padded; ++j) EXPECT_EQ(work[1 * padded + j], 0.0) << "masked row, column " << j;
  for (int n = 0; n < rows; ++n)
    for (int j = vocab; j < padded; ++j) EXPECT_EQ(work[n * padded + j], 0.0) << "padded column " << j;
  auto loss = [&] {
    std::vector<double> copy = logits;
    backend->cross_entropy(host_tensor(losses, {rows}), host_tensor(copy, {rows, padded}), host_tensor(targets, {rows}),
                           vocab, false, 1.0);
    double total = 0;
    for (double l : losses) total += l * grad_scale;
    return total;
  };
  expect_gradient_matches(work, numerical_gradient(logits, loss), "cross_entropy dlogits");

  targets[2] = vocab;
  EXPECT_THROW(backend->cross_entropy(host_tensor(losses, {rows}), host_tensor(work, {rows, padded}),
                                      host_tensor(targets, {rows}), vocab, false, 1.0),
               std::invalid_argument);
  targets[2] = 0;
  EXPECT_THROW(backend->cross_entropy(host_tensor(losses, {rows}), host_tensor(work, {rows, padded}),
                                      host_tensor(targets, {rows}), padded + 1, false, 1.0),
               std::invalid_argument);
}

TEST(CpuBackend, GreedyTokensTakeTheFirstOfTheLargestRealColumn) {
  auto backend = double_backend();
  const int rows = 4, vocab = 5, padded = 8;
  std::vector<double> logits = random_values(rows * padded, 17, 2.0);
  for (int n = 0; n < rows; ++n)
    for (int j = vocab; j < padded; ++j) logits[n * padded + j] = 50.0;  // padding: never chosen
  logits[1 * padded + 1] = logits[1 * padded + 3] = 9.0;                // a tie: the lower column
  logits[2 * padded + 4] = std::numeric_limits<double>::infinity();    // refused: id 0, NaN
  std::vector<std::int32_t> ids(rows, -7);
  std::vector<double> log_probs(rows);
  std::vector<std::int32_t> past{40};
  backend->greedy_tokens(host_tensor(ids, {rows}), host_tensor(log_probs, {rows}), host_tensor(logits, {rows, padded}),
                         vocab, host_tensor(past, {1}), 3);
  EXPECT_EQ(past[0], 43) << "the next call's cached length";
  for (int n : {0, 1, 3}) {
    const double* z = logits.data() + n * padded;
    const int want = int(std::max_element(z, z + vocab) - z);
    EXPECT_EQ(ids[n], want) << "row " << n;
    double normaliser = 0;
    for (int j = 0; j < vocab; ++j) normaliser += std::exp(z[j]);
    EXPECT_NEAR(log_probs[n], z[want] - std::log(normaliser), 1e-12) << "row " << n;
  }
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(ids[2], 0);
  EXPECT_TRUE(std::isnan(log_probs[2]));
  EXPECT_THROW(backend->greedy_tokens(host_tensor(ids, {rows}), host_tensor(log_probs, {rows}),
                                      host_tensor(logits, {rows, padded}), padded + 1, Tensor{}, 0),
               std::invalid_argument);
}

TEST(CpuBackend, SumOfSquaresOverManyChunks) {
  auto backend = make_cpu_backend("float", 2);
  const int count = 10000;  // several of the fixed 4096-element chunks
  std::vector<float> x(count);
  double expected = 0;
  for (int i = 0; i < count; ++i) {
    x[i] = float(i % 7) - 3.0f;
    expected += double(x[i]) * x[i];
  }
  EXPECT_EQ(backend->sum_of_squares(host_tensor(x, {count})), expected);
}

// Two AdamW steps on three parameters (two in a weight-decayed segment, one not) plus one
// padding element outside every segment. lr 0.1, β1 0.9, β2 0.99, eps 0.05, wd 0.5,
// grad_scale 0.5, so the scaled gradients are g1 = (0.2, −0.1, 0.5), g2 = (−0.1, 0.3, 0.5).
// Step 1: m = 0.1 g1, v = 0.01 g1², m̂/(√v̂ + eps) = g/(|g| + 0.05):
//   θ0 = 1 − 0.1·0.5·1 − 0.1·0.2/0.25 = 0.87
//   θ1 = −2 + 0.1·0.5·2 + 0.1·0.1/0.15 = −1.8333…
//   θ2 = 0.5 − 0.1·0.5/0.55 = 0.40909…
// Step 2: m = 0.9 m + 0.1 g2 = (0.008, 0.021, 0.095), v = 0.99 v + 0.01 g2² =
// (0.000496, 0.000999, 0.004975), bias corrections 0.19 and 0.0199:
//   θ0 = 0.87·0.95 − 0.1·(0.008/0.19)/(√(0.000496/0.0199) + 0.05) = 0.806244945663
//   θ1 = −1.8333…·0.95 − 0.1·(0.021/0.19)/(√(0.000999/0.0199) + 0.05) = −1.78199652381
//   θ2 = 0.40909… − 0.1·0.5/0.55 = 0.318181818182
TEST(CpuBackend, AdamWMatchesHandComputedSteps) {
  auto backend = double_backend();
  std::vector<double> params = {1.0, -2.0, 0.5, 7.0}, m(4), v(4), copy(4);
  std::vector<float> float_copy(4);
  const std::vector<ParamSegment> segments = {{0, 2, true}, {2, 1, false}};
  AdamWStep step;
  step.lr = 0.1;
  step.beta1 = 0.9;
  step.beta2 = 0.99;
  step.eps = 0.05;
  step.weight_decay = 0.5;
  step.grad_scale = 0.5;

  std::vector<double> grads = {0.4, -0.2, 1.0, 1.0};
  step.step = 1;
  backend->adamw(host_tensor(params, {4}), host_tensor(grads, {4}), host_tensor(m, {4}), host_tensor(v, {4}), segments,
                 step, host_tensor(float_copy, {4}));
  EXPECT_NEAR(params[0], 0.87, 1e-12);
  EXPECT_NEAR(params[1], -1.83333333333333, 1e-12);
  EXPECT_NEAR(params[2], 0.409090909090909, 1e-12);
  EXPECT_EQ(params[3], 7.0) << "outside every segment";
  EXPECT_NEAR(m[0], 0.02, 1e-15);
  EXPECT_NEAR(v[2], 0.0025, 1e-15);
  EXPECT_EQ(float_copy[1], float(params[1])) << "compute copy receives the updated weights";

  grads = {-0.2, 0.6, 1.0, 1.0};
  step.step = 2;
  backend->adamw(host_tensor(params, {4}), host_tensor(grads, {4}), host_tensor(m, {4}), host_tensor(v, {4}), segments,
                 step, Tensor{});
  EXPECT_NEAR(params[0], 0.806244945663, 1e-11);
  EXPECT_NEAR(params[1], -1.78199652381, 1e-11);
  EXPECT_NEAR(params[2], 0.318181818182, 1e-11);
  EXPECT_EQ(params[3], 7.0);
  EXPECT_NEAR(m[1], 0.021, 1e-15);
  EXPECT_NEAR(v[1], 0.000999, 1e-15);

  const std::vector<ParamSegment> outside = {{3, 2, false}};
  EXPECT_THROW(backend->adamw(host_tensor(params, {4}), host_tensor(grads, {4}), host_tensor(m, {4}),
                              host_tensor(v, {4}), outside, step, Tensor{}),
               std::invalid_argument);
  step.step = 0;
  EXPECT_THROW(backend->adamw(host_tensor(params, {4}), host_tensor(grads, {4}), host_tensor(m, {4}),
                              host_tensor(v, {4}), segments, step, Tensor{}),
               std::invalid_argument);
}

// Every op with a reduction (rmsnorm's dgain, the embedding gradient, sum of squares,
// matmul's inner products) and the row-parallel ones give bit-identical float results on 1 and 2 threads.
TEST(CpuBackend, FloatResultsDoNotDependOnThreadCount) {
  const int rows = 67, width = 130, vocab = 11;
  const std::vector<float> x = to_float(random_values(rows * width, 20)), gain = to_float(random_values(width, 21));
  const std::vector<float> dout = to_float(random_values(rows * width, 22));
  std::vector<std::int32_t> tokens(rows);
  for (int n = 0; n < rows; ++n) tokens[n] = (n * 7) % vocab;

  struct Results {
    std::vector<float> out, rstd, dx, dgain, dwte, gelu, logits, params, product;
    double squares = 0;
  };
  auto run = [&](int threads) {
    auto backend = make_cpu_backend("float", threads);
    Results r;
    std::vector<float> xs = x, g = gain, dy = dout;
    r.out.resize(x.size());
    r.rstd.resize(rows);
    r.dx.assign(x.size(), 0.5f);
    r.dgain.assign(width, 0.25f);
    backend->rmsnorm_forward(host_tensor(r.out, {rows, width}), host_tensor(r.rstd, {rows}), host_tensor(xs, {rows, width}),
                             host_tensor(g, {width}), 1e-5);
    backend->rmsnorm_backward(host_tensor(r.dx, {rows, width}), host_tensor(r.dgain, {width}), host_tensor(dy, {rows, width}),
                              host_tensor(xs, {rows, width}), host_tensor(g, {width}), host_tensor(r.rstd, {rows}));
    r.dwte.assign(vocab * width, 0.0f);
    backend->embedding_backward(host_tensor(r.dwte, {vocab, width}), host_tensor(dy, {rows, width}), host_tensor(tokens, {rows}));
    r.gelu.resize(x.size());
    backend->gelu_backward(host_tensor(r.gelu, {rows, width}), host_tensor(dy, {rows, width}), host_tensor(xs, {rows, width}));
    r.logits = x;
    std::vector<float> losses(rows);
    backend->cross_entropy(host_tensor(losses, {rows}), host_tensor(r.logits, {rows, width}), host_tensor(tokens, {rows}),
                           width - 3, true, 0.5);
    // Large enough for OpenBLAS to use its threads.
    r.product.resize(std::size_t(width) * width);
    backend->matmul(host_tensor(r.product, {width, width}), host_tensor(xs, {rows, width}), host_tensor(dy, {rows, width}),
                    true, false);
    r.squares = backend->sum_of_squares(host_tensor(dy, {rows, width}));
    r.params = x;
    std::vector<float> m(x.size()), v(x.size());
    const ParamSegment all{0, rows * width, true};
    AdamWStep step;
    step.lr = 1e-3;
    step.weight_decay = 0.1;
    backend->adamw(host_tensor(r.params, {rows * width}), host_tensor(dy, {rows * width}), host_tensor(m, {rows * width}),
                   host_tensor(v, {rows * width}), std::span(&all, 1), step, Tensor{});
    return r;
  };
  const Results one = run(1), two = run(2);
  auto bitwise_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(bitwise_equal(one.out, two.out));
  EXPECT_TRUE(bitwise_equal(one.rstd, two.rstd));
  EXPECT_TRUE(bitwise_equal(one.dx, two.dx));
  EXPECT_TRUE(bitwise_equal(one.dgain, two.dgain));
  EXPECT_TRUE(bitwise_equal(one.dwte, two.dwte));
  EXPECT_TRUE(bitwise_equal(one.gelu, two.gelu));
  EXPECT_TRUE(bitwise_equal(one.logits, two.logits));
  EXPECT_TRUE(bitwise_equal(one.params, two.params));
  EXPECT_TRUE(bitwise_equal(one.product, two.product));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(one.squares), std::bit_cast<std::uint64_t>(two.squares));
}

TEST(CpuBackend, FloatAgreesWithDouble) {
  const int rows = 9, width = 16;
  std::vector<double> x = random_values(rows * width, 30), gain = random_values(width, 31), dout = random_values(rows * width, 32);
  std::vector<double> out(x.size()), rstd(rows), dx(x.size()), dgain(width);
  auto d = double_backend();
  d->rmsnorm_forward(host_tensor(out, {rows, width}), host_tensor(rstd, {rows}), host_tensor(x, {rows, width}),
                     host_tensor(gain, {width}), 1e-5);
  d->rmsnorm_backward(host_tensor(dx, {rows, width}), host_tensor(dgain, {width}), host_tensor(dout, {rows, width}),
                      host_tensor(x, {rows, width}), host_tensor(gain, {width}), host_tensor(rstd, {rows}));

  std::vector<float> xf = to_float(x), gf = to_float(gain), dyf = to_float(dout);
  std::vector<float> outf(x.size()), rstdf(rows), dxf(x.size()), dgainf(width);
  auto f = make_cpu_backend("float", 1);
  f->rmsnorm_forward(host_tensor(outf, {rows, width}), host_tensor(rstdf, {rows}), host_tensor(xf, {rows, width}),
                     host_tensor(gf, {width}), 1e-5);
  f->rmsnorm_backward(host_tensor(dxf, {rows, width}), host_tensor(dgainf, {width}), host_tensor(dyf, {rows, width}),
                      host_tensor(xf, {rows, width}), host_tensor(gf, {width}), host_tensor(rstdf, {rows}));
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(outf[i], out[i], 1e-5 * std::max(1.0, std::abs(out[i])));
    EXPECT_NEAR(dxf[i], dx[i], 1e-4 * std::max(1.0, std::abs(dx[i])));
  }
  for (int c = 0; c < width; ++c) EXPECT_NEAR(dgainf[c], dgain[c], 1e-4 * std::max(1.0, std::abs(dgain[c])));
}
