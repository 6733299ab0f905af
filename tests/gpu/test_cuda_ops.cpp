// The CUDA backend's ops (all but attention) against the CPU reference backend on the same
// random inputs: bf16 paths within ‖out − ref‖/‖ref‖ < 1e-2, fp32 paths far tighter; every
// output poisoned with NaN first; sizes that are not multiples of any tile or vector width;
// accumulation semantics on non-zero starting values; bitwise determinism where promised;
// and errors for bad arguments. Reports SKIPPED on machines without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda_op_test_support.hpp"

using namespace pope;
using pope::test::download;
using pope::test::make_ids;
using pope::test::make_tensor;
using pope::test::poison;
using pope::test::random_bf16_values;
using pope::test::relative_error;

namespace {

constexpr double kBf16Tolerance = 1e-2;  // one bf16 rounding per output is ≈ 2e-3

// Runs `action` and expects std::invalid_argument whose message contains `text`.
void expect_invalid_argument(const std::function<void()>& action, const std::string& text) {
  try {
    action();
    ADD_FAILURE() << "expected std::invalid_argument containing \"" << text << "\"";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << error.what();
  }
}

std::vector<std::int32_t> random_ids(std::size_t count, int limit, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<int> pick(0, limit - 1);
  std::vector<std::int32_t> ids(count);
  for (auto& id : ids) id = pick(engine);
  return ids;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    gpu_ = make_cuda_backend(0);
    cpu_ = make_cpu_backend("float", 0);
  }

  // The same values on both backends: `gpu_dtype` (bf16 or f32) on the GPU, f32 on the CPU.
  struct Pair {
    OwnedTensor gpu, cpu;
  };
  Pair pair(const Shape& shape, DType gpu_dtype, const std::vector<float>& values) {
    return {make_tensor(*gpu_, shape, gpu_dtype, values), make_tensor(*cpu_, shape, DType::f32, values)};
  }
  Pair ids(const std::vector<std::int32_t>& values) { return {make_ids(*gpu_, values), make_ids(*cpu_, values)}; }

  // ‖gpu − cpu‖ / ‖cpu‖ of a pair after the ops ran on both.
  double error_of(const Pair& p) {
    return relative_error(download(*gpu_, p.gpu.tensor), download(*cpu_, p.cpu.tensor));
  }

  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_F(CudaOps, DescribesDeviceAndDtypes) {
  EXPECT_EQ(gpu_->description().rfind("cuda (", 0), 0u) << gpu_->description();
  EXPECT_NE(gpu_->description().find("sm_"), std::string::npos) << gpu_->description();
  EXPECT_EQ(gpu_->device(), DeviceKind::cuda);
  EXPECT_EQ(gpu_->dtypes().activation, DType::bf16);
  EXPECT_EQ(gpu_->dtypes().parameter, DType::f32);
  EXPECT_EQ(gpu_->dtypes().statistic, DType::f32);
  EXPECT_THROW(make_cuda_backend(cuda_device_count()), std::runtime_error);
}

TEST_F(CudaOps, AllocateZeroesAndFillWritesEveryDtype) {
  OwnedTensor raw = allocate_tensor(*gpu_, {1001}, DType::u16);
  std::vector<std::uint16_t> bits(1001, 0xFFFF);
  gpu_->copy_to_host(bits.data(), raw.tensor);
  for (std::size_t i = 0; i < bits.size(); ++i) ASSERT_EQ(bits[i], 0) << "element " << i;

  gpu_->fill(raw.tensor, 9.0);
  gpu_->copy_to_host(bits.data(), raw.tensor);
  for (auto b : bits) ASSERT_EQ(b, 9);
  OwnedTensor halves = allocate_tensor(*gpu_, {1001}, DType::bf16);
  gpu_->fill(halves.tensor, -1.0);
  gpu_->copy_to_host(bits.data(), halves.tensor);
  for (auto b : bits) ASSERT_EQ(b, 0xBF80);  // bf16 −1
  OwnedTensor ints = allocate_tensor(*gpu_, {1001}, DType::i32);
  gpu_->fill(ints.tensor, 7.0);
  std::vector<std::int32_t> int_values(1001);
  gpu_->copy_to_host(int_values.data(), ints.tensor);
  for (auto v : int_values) ASSERT_EQ(v, 7);
  for (DType dtype : {DType::f32, DType::f64}) {
    OwnedTensor t = allocate_tensor(*gpu_, {1001}, dtype);
    gpu_->fill(t.tensor, -3.25);
    for (double v : download(*gpu_, t.tensor)) ASSERT_EQ(v, -3.25) << dtype_name(dtype);
  }
}

TEST_F(CudaOps, CopyAndConvertBetweenFloatDtypes) {
  // Raw normal floats (not bf16-representable) exercise the rounding to bf16.
  std::mt19937_64 engine(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> values(1001);
  for (float& v : values) v = normal(engine);
  OwnedTensor f32 = make_tensor(*gpu_, {1001}, DType::f32, values);
  OwnedTensor bf16 = allocate_tensor(*gpu_, {1001}, DType::bf16);
  OwnedTensor f64 = allocate_tensor(*gpu_, {7, 143}, DType::f64);
  OwnedTensor back = allocate_tensor(*gpu_, {1001}, DType::f32);
  for (const OwnedTensor* t : {&bf16, &f64, &back}) poison(*gpu_, t->tensor);

  gpu_->convert(bf16.tensor, f32.tensor);
  gpu_->convert(f64.tensor, f32.tensor);
  gpu_->convert(back.tensor, bf16.tensor);
  const std::vector<double> rounded = download(*gpu_, bf16.tensor), wide = download(*gpu_, f64.tensor),
                            narrow = download(*gpu_, back.tensor);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double expected_bf16 = bf16_to_float(float_to_bf16(values[i]));
    ASSERT_EQ(rounded[i], expected_bf16) << "element " << i;
    ASSERT_EQ(wide[i], double(values[i])) << "element " << i;
    ASSERT_EQ(narrow[i], expected_bf16) << "element " << i;
  }

  OwnedTensor copied = allocate_tensor(*gpu_, {1001}, DType::f32);
  poison(*gpu_, copied.tensor);
  gpu_->copy(copied.tensor, f32.tensor);
  EXPECT_EQ(download(*gpu_, copied.tensor), download(*gpu_, f32.tensor));
  expect_invalid_argument([&] { gpu_->copy(f64.tensor, f32.tensor); }, "copy");
}

TEST_F(CudaOps, RejectsHostTensorsAndWrongDtypes) {
  OwnedTensor host = allocate_tensor(*cpu_, {4}, DType::f32);
  expect_invalid_argument([&] { gpu_->fill(host.tensor, 1.0); }, "expected CUDA device memory");
  OwnedTensor f32 = allocate_tensor(*gpu_, {4, 4}, DType::f32);
  OwnedTensor bf16 = allocate_tensor(*gpu_, {4, 4}, DType::bf16);
  expect_invalid_argument([&] { gpu_->matmul(bf16.tensor, f32.tensor, bf16.tensor, false, false); },
                          "matmul: a is f32");
  expect_invalid_argument([&] { gpu_->gelu_forward(f32.tensor, bf16.tensor); }, "gelu_forward: out is f32");
  OwnedTensor wide = allocate_tensor(*gpu_, {4, 5}, DType::bf16);
  expect_invalid_argument([&] { gpu_->matmul(bf16.tensor, bf16.tensor, wide.tensor, false, false); },
                          "expected [M, K]·[K, N] = [M, N]");
}

TEST_F(CudaOps, EmbeddingForwardGathersRowsExactly) {
  const int vocab = 101, rows = 300;
  for (int width : {72, 37}) {  // 16-byte row copies, and element copies
    SCOPED_TRACE(width);
    Pair table = pair({vocab, width}, DType::bf16, random_bf16_values(std::size_t(vocab) * width, 1));
    Pair tokens = ids(random_ids(rows, vocab, 2));
    Pair out = pair({rows, width}, DType::bf16, std::vector<float>(std::size_t(rows) * width, 0.0f));
    poison(*gpu_, out.gpu.tensor);
    gpu_->embedding_forward(out.gpu.tensor, tokens.gpu.tensor, table.gpu.tensor);
    cpu_->embedding_forward(out.cpu.tensor, tokens.cpu.tensor, table.cpu.tensor);
    EXPECT_EQ(download(*gpu_, out.gpu.tensor), download(*cpu_, out.cpu.tensor));
  }
}

TEST_F(CudaOps, EmbeddingBackwardAccumulatesLikeCpu) {
  const int vocab = 61, rows = 2000;
  // Skewed ids: token 3 makes a long run (≥ 667 entries, longer than the kernel's 256-entry
  // window for finding a run's end), the rest spread; token vocab-1 never appears.
  std::vector<std::int32_t> token_ids = random_ids(rows, vocab - 1, 3);
  for (int n = 0; n < rows; n += 3) token_ids[std::size_t(n)] = 3;
  // 16-byte groups (264: 33 of them, more than one pass of 32 lanes), and single elements.
  for (int width : {72, 264, 37}) {
    SCOPED_TRACE(width);
    Pair tokens = ids(token_ids);
    Pair dout = pair({rows, width}, DType::bf16, random_bf16_values(std::size_t(rows) * width, 4));
    const std::vector<float> initial = random_bf16_values(std::size_t(vocab) * width, 5);
    Pair dtable = pair({vocab, width}, DType::f32, initial);
    gpu_->embedding_backward(dtable.gpu.tensor, dout.gpu.tensor, tokens.gpu.tensor);
    cpu_->embedding_backward(dtable.cpu.tensor, dout.cpu.tensor, tokens.cpu.tensor);
    EXPECT_LT(error_of(dtable), 1e-5);
    const std::vector<double> result = download(*gpu_, dtable.gpu.tensor);
    for (int c = 0; c < width; ++c)
      EXPECT_EQ(result[std::size_t(vocab - 1) * width + c], initial[std::size_t(vocab - 1) * width + c]) << c;
  }
}

TEST_F(CudaOps, EmbeddingBackwardIsBitwiseDeterministic) {
  const int vocab = 50, width = 768, rows = 4096;
  OwnedTensor tokens = make_ids(*gpu_, random_ids(rows, vocab, 6));
  OwnedTensor dout = make_tensor(*gpu_, {rows, width}, DType::bf16, random_bf16_values(std::size_t(rows) * width, 7));
  const std::vector<float> initial = random_bf16_values(std::size_t(vocab) * width, 8);
  std::vector<std::vector<double>> results;
  for (int run = 0; run < 2; ++run) {
    OwnedTensor dtable = make_tensor(*gpu_, {vocab, width}, DType::f32, initial);
    gpu_->embedding_backward(dtable.tensor, dout.tensor, tokens.tensor);
    results.push_back(download(*gpu_, dtable.tensor));
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_NE(results[0], std::vector<double>(initial.begin(), initial.end()));
}

TEST_F(CudaOps, BadTokenIdsAreReportedAtTheNextSynchronisation) {
  const int vocab = 101, width = 16;
  OwnedTensor table = make_tensor(*gpu_, {vocab, width}, DType::bf16, random_bf16_values(vocab * width, 9));
  std::vector<std::int32_t> token_ids = random_ids(10, vocab, 10);
  token_ids[5] = 500;
  OwnedTensor tokens = make_ids(*gpu_, token_ids);
  OwnedTensor out = allocate_tensor(*gpu_, {10, width}, DType::bf16);
  gpu_->embedding_forward(out.tensor, tokens.tensor, table.tensor);
  expect_invalid_argument([&] { gpu_->synchronize(); }, "tokens[5] = 500");
  EXPECT_NO_THROW(gpu_->synchronize());  // reported once, then cleared

  token_ids[5] = 1;
  token_ids[7] = -4;
  OwnedTensor negative = make_ids(*gpu_, token_ids);
  OwnedTensor dtable = allocate_tensor(*gpu_, {vocab, width}, DType::f32);
  OwnedTensor dout = make_tensor(*gpu_, {10, width}, DType::bf16, random_bf16_values(10 * width, 11));
  gpu_->embedding_backward(dtable.tensor, dout.tensor, negative.tensor);
  expect_invalid_argument([&] { gpu_->synchronize(); }, "tokens[7] = -4");
}

TEST_F(CudaOps, RmsnormForwardMatchesCpu) {
  for (auto [rows, width] : {std::pair{67, 203}, std::pair{64, 768}}) {  // element and 16-byte paths
    SCOPED_TRACE(width);
    Pair x = pair({rows, width}, DType::bf16, random_bf16_values(std::size_t(rows) * width, 12, 2.0f));
    std::vector<float> gain_values = random_bf16_values(std::size_t(width), 13, 0.2f);
    for (float& g : gain_values) g = bf16_to_float(float_to_bf16(1.0f + g));
    Pair gain = pair({width}, DType::bf16, gain_values);
    Pair out = pair({rows, width}, DType::bf16, std::vector<float>(std::size_t(rows) * width, 0.0f));
    Pair rstd = pair({rows}, DType::f32, std::vector<float>(std::size_t(rows), 0.0f));
    poison(*gpu_, out.gpu.tensor);
    poison(*gpu_, rstd.gpu.tensor);
    gpu_->rmsnorm_forward(out.gpu.tensor, rstd.gpu.tensor, x.gpu.tensor, gain.gpu.tensor, 1e-5);
    cpu_->rmsnorm_forward(out.cpu.tensor, rstd.cpu.tensor, x.cpu.tensor, gain.cpu.tensor, 1e-5);
    EXPECT_LT(error_of(out), kBf16Tolerance);
    EXPECT_LT(error_of(rstd), 1e-5);
  }
}

// The backward's inputs: x, gain, dout and the forward's rstd (computed on the CPU and given
// to both backends); dx and dgain start from non-zero values, since both accumulate.
TEST_F(CudaOps, RmsnormBackwardAccumulatesLikeCpu) {
  // Element and 16-byte paths; 3000 columns: 4 warps per block (8 above), 1100 rows: 35 chunks of
  // 32, the last one short (the chunk sums run in 32 slices)
  for (auto [rows, width] : {std::pair{100, 300}, std::pair{64, 768}, std::pair{1100, 3000}}) {
    SCOPED_TRACE(width);
    const std::size_t count = std::size_t(rows) * width;
    Pair x = pair({rows, width}, DType::bf16, random_bf16_values(count, 14, 2.0f));
    Pair gain = pair({width}, DType::bf16, random_bf16_values(std::size_t(width), 15));
    Pair dout = pair({rows, width}, DType::bf16, random_bf16_values(count, 16));
    OwnedTensor out_cpu = allocate_tensor(*cpu_, {rows, width}, DType::f32);
    OwnedTensor rstd_cpu = allocate_tensor(*cpu_, {rows}, DType::f32);
    cpu_->rmsnorm_forward(out_cpu.tensor, rstd_cpu.tensor, x.cpu.tensor, gain.cpu.tensor, 1e-5);
    const std::vector<double> rstd_values = download(*cpu_, rstd_cpu.tensor);
    Pair rstd = pair({rows}, DType::f32, std::vector<float>(rstd_values.begin(), rstd_values.end()));
    Pair dx = pair({rows, width}, DType::bf16, random_bf16_values(count, 17));
    Pair dgain = pair({width}, DType::f32, random_bf16_values(std::size_t(width), 18));

    gpu_->rmsnorm_backward(dx.gpu.tensor, dgain.gpu.tensor, dout.gpu.tensor, x.gpu.tensor, gain.gpu.tensor,
                           rstd.gpu.tensor);
    cpu_->rmsnorm_backward(dx.cpu.tensor, dgain.cpu.tensor, dout.cpu.tensor, x.cpu.tensor, gain.cpu.tensor,
                           rstd.cpu.tensor);
    EXPECT_LT(error_of(dx), kBf16Tolerance);
    EXPECT_LT(error_of(dgain), 1e-4);
  }
}

TEST_F(CudaOps, RmsnormBackwardIsBitwiseDeterministic) {
  const int rows = 1000, width = 768;
  const std::size_t count = std::size_t(rows) * width;
  OwnedTensor x = make_tensor(*gpu_, {rows, width}, DType::bf16, random_bf16_values(count, 19));
  OwnedTensor gain = make_tensor(*gpu_, {width}, DType::bf16, random_bf16_values(std::size_t(width), 20));
  OwnedTensor dout = make_tensor(*gpu_, {rows, width}, DType::bf16, random_bf16_values(count, 21));
  OwnedTensor out = allocate_tensor(*gpu_, {rows, width}, DType::bf16);
  OwnedTensor rstd = allocate_tensor(*gpu_, {rows}, DType::f32);
  gpu_->rmsnorm_forward(out.tensor, rstd.tensor, x.tensor, gain.tensor, 1e-5);
  std::vector<std::vector<double>> dx_runs, dgain_runs;
  for (int run = 0; run < 2; ++run) {
    OwnedTensor dx = make_tensor(*gpu_, {rows, width}, DType::bf16, random_bf16_values(count, 22));
    OwnedTensor dgain = make_tensor(*gpu_, {width}, DType::f32, random_bf16_values(std::size_t(width), 23));
    gpu_->rmsnorm_backward(dx.tensor, dgain.tensor, dout.tensor, x.tensor, gain.tensor, rstd.tensor);
    dx_runs.push_back(download(*gpu_, dx.tensor));
    dgain_runs.push_back(download(*gpu_, dgain.tensor));
  }
  EXPECT_EQ(dx_runs[0], dx_runs[1]);
  EXPECT_EQ(dgain_runs[0], dgain_runs[1]);
}

TEST_F(CudaOps, RmsnormBackwardRefusesDxAliasingDout) {
  OwnedTensor t = allocate_tensor(*gpu_, {4, 8}, DType::bf16);
  OwnedTensor gain = allocate_tensor(*gpu_, {8}, DType::bf16);
  OwnedTensor dgain = allocate_tensor(*gpu_, {8}, DType::f32);
  OwnedTensor rstd = allocate_tensor(*gpu_, {4}, DType::f32);
  OwnedTensor x = allocate_tensor(*gpu_, {4, 8}, DType::bf16);
  expect_invalid_argument(
      [&] { gpu_->rmsnorm_backward(t.tensor, dgain.tensor, t.tensor, x.tensor, gain.tensor, rstd.tensor); },
      "dx aliases");
}

class CudaMatmul : public CudaOps {
 protected:
  // Compares out = alpha · op(a) · op(b) + beta · out with the CPU, out starting non-zero
  // (NaN-poisoned when beta is 0). `a_row_offset` > 0 takes a as a view starting that many rows
  // into a larger tensor, so its pointer is not 16-byte aligned.
  void expect_matmul_matches(std::int64_t m, std::int64_t k, std::int64_t n, bool transpose_a, bool transpose_b,
                             DType out_dtype, double alpha, double beta, double tolerance, int a_row_offset = 0) {
    SCOPED_TRACE(::testing::Message() << "m " << m << " k " << k << " n " << n << " ta " << transpose_a << " tb "
                                      << transpose_b << " out " << dtype_name(out_dtype) << " beta " << beta);
    const std::int64_t a_rows = transpose_a ? k : m, a_cols = transpose_a ? m : k;
    const std::int64_t b_rows = transpose_b ? n : k, b_cols = transpose_b ? k : n;
    Pair a_full = pair({a_rows + a_row_offset, a_cols}, DType::bf16,
                       random_bf16_values(std::size_t((a_rows + a_row_offset) * a_cols), seed_++));
    Pair b = pair({b_rows, b_cols}, DType::bf16, random_bf16_values(std::size_t(b_rows * b_cols), seed_++));
    Pair out = pair({m, n}, out_dtype, random_bf16_values(std::size_t(m * n), seed_++));
    if (beta == 0.0) poison(*gpu_, out.gpu.tensor);
    const Tensor a_gpu = a_full.gpu.tensor.rows(a_row_offset, a_row_offset + a_rows);
    const Tensor a_cpu = a_full.cpu.tensor.rows(a_row_offset, a_row_offset + a_rows);
    gpu_->matmul(out.gpu.tensor, a_gpu, b.gpu.tensor, transpose_a, transpose_b, alpha, beta);
    cpu_->matmul(out.cpu.tensor, a_cpu, b.cpu.tensor, transpose_a, transpose_b, alpha, beta);
    EXPECT_LT(error_of(out), tolerance);
  }
  std::uint64_t seed_ = 100;
};

TEST_F(CudaMatmul, EveryTransposeAtOddSizes) {
  for (bool transpose_a : {false, true})
    for (bool transpose_b : {false, true}) {
      expect_matmul_matches(37, 53, 71, transpose_a, transpose_b, DType::bf16, 1.0, 0.0, kBf16Tolerance);
      // f32 output accumulating (the weight-gradient path), with alpha ≠ 1.
      expect_matmul_matches(37, 53, 71, transpose_a, transpose_b, DType::f32, 0.5, 1.0, 1e-4);
      // An operand at an odd address (a row view), as classifier chunks can produce.
      expect_matmul_matches(37, 53, 71, transpose_a, transpose_b, DType::bf16, 1.0, 0.0, kBf16Tolerance, 1);
    }
}

class CudaMatmulEpilogue : public CudaMatmul {
 protected:
  // The fused epilogue on the GPU against the CPU's composition of matmul, add and GELU,
  // out (and, for gelu, aux) NaN-poisoned so that every element must be written.
  void expect_epilogue_matches(std::int64_t m, std::int64_t k, std::int64_t n, Backend::MatmulEpilogue epilogue) {
    SCOPED_TRACE(::testing::Message() << "m " << m << " k " << k << " n " << n << " epilogue " << int(epilogue));
    Pair a = pair({m, k}, DType::bf16, random_bf16_values(std::size_t(m * k), seed_++));
    Pair b = pair({n, k}, DType::bf16, random_bf16_values(std::size_t(n * k), seed_++));
    Pair aux = pair({m, n}, DType::bf16, random_bf16_values(std::size_t(m * n), seed_++));
    Pair out = pair({m, n}, DType::bf16, random_bf16_values(std::size_t(m * n), seed_++));
    poison(*gpu_, out.gpu.tensor);
    if (epilogue == Backend::MatmulEpilogue::gelu) poison(*gpu_, aux.gpu.tensor);
    gpu_->matmul_epilogue(out.gpu.tensor, a.gpu.tensor, b.gpu.tensor, false, true, epilogue, aux.gpu.tensor);
    cpu_->matmul_epilogue(out.cpu.tensor, a.cpu.tensor, b.cpu.tensor, false, true, epilogue, aux.cpu.tensor);
    EXPECT_LT(error_of(out), kBf16Tolerance);
    EXPECT_LT(error_of(aux), kBf16Tolerance);
  }
};

TEST_F(CudaMatmulEpilogue, AddGeluAndGeluBackwardAtGptShapesAndOddSizes) {
  for (auto epilogue : {Backend::MatmulEpilogue::add, Backend::MatmulEpilogue::gelu,
                        Backend::MatmulEpilogue::gelu_backward}) {
    expect_epilogue_matches(256, 768, 3072, epilogue);  // fused in cuBLASLt
    expect_epilogue_matches(37, 53, 71, epilogue);      // gelu ones fall back to separate ops
  }
}

TEST_F(CudaMatmulEpilogue, RefusesAuxAliasingOut) {
  OwnedTensor a = allocate_tensor(*gpu_, {8, 8}, DType::bf16);
  OwnedTensor out = allocate_tensor(*gpu_, {8, 8}, DType::bf16);
  expect_invalid_argument(
      [&] {
        gpu_->matmul_epilogue(out.tensor, a.tensor, a.tensor, false, true, Backend::MatmulEpilogue::add, out.tensor);
      },
      "aux aliases out");
}

// Decoding's products of one row per sequence (kernels/few_rows_matmul.cu): up to 8 rows, plain,
// with the add and GELU epilogues, f32 logits, and with the RMSNorm fused in front.
class CudaFewRowsMatmul : public CudaMatmulEpilogue {
 protected:
  // rmsnorm_matmul against the CPU's composition; and on the GPU, bit for bit, against
  // rmsnorm_forward followed by the same product: the fused norm is the stored norm.
  void expect_rmsnorm_matmul_matches(std::int64_t rows, std::int64_t k, std::int64_t n, bool gelu) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " k " << k << " n " << n << " gelu " << gelu);
    Pair x = pair({rows, k}, DType::bf16, random_bf16_values(std::size_t(rows * k), seed_++, 2.0f));
    std::vector<float> gain_values = random_bf16_values(std::size_t(k), seed_++, 0.2f);
    for (float& g : gain_values) g = bf16_to_float(float_to_bf16(1.0f + g));
    Pair gain = pair({k}, DType::bf16, gain_values);
    Pair w = pair({n, k}, DType::bf16, random_bf16_values(std::size_t(n * k), seed_++, 0.05f));
    auto zeros = [&](Shape shape, DType dtype) {
      return pair(shape, dtype, std::vector<float>(std::size_t(shape_numel(shape)), 0.0f));
    };
    Pair out = zeros({rows, n}, DType::bf16), aux = zeros({rows, n}, DType::bf16);
    Pair norm = zeros({rows, k}, DType::bf16), rstd = zeros({rows}, DType::f32);
    for (Pair* p : {&out, &aux, &norm, &rstd}) poison(*gpu_, p->gpu.tensor);
    const std::optional<Backend::MatmulEpilogue> epilogue =
        gelu ? std::optional(Backend::MatmulEpilogue::gelu) : std::nullopt;
    gpu_->rmsnorm_matmul(out.gpu.tensor, norm.gpu.tensor, rstd.gpu.tensor, x.gpu.tensor, gain.gpu.tensor, 1e-5,
                         w.gpu.tensor, epilogue, aux.gpu.tensor);
    cpu_->rmsnorm_matmul(out.cpu.tensor, norm.cpu.tensor, rstd.cpu.tensor, x.cpu.tensor, gain.cpu.tensor, 1e-5,
                         w.cpu.tensor, epilogue, aux.cpu.tensor);
    EXPECT_LT(error_of(out), kBf16Tolerance);
    EXPECT_LT(error_of(norm), kBf16Tolerance);
    EXPECT_LT(error_of(rstd), 1e-5);
    if (gelu) {
      EXPECT_LT(error_of(aux), kBf16Tolerance);
    }

    OwnedTensor norm2 = allocate_tensor(*gpu_, {rows, k}, DType::bf16), rstd2 = allocate_tensor(*gpu_, {rows}, DType::f32);
    OwnedTensor out2 = allocate_tensor(*gpu_, {rows, n}, DType::bf16), aux2 = allocate_tensor(*gpu_, {rows, n}, DType::bf16);
    gpu_->rmsnorm_forward(norm2.tensor, rstd2.tensor, x.gpu.tensor, gain.gpu.tensor, 1e-5);
    if (gelu) {
      gpu_->matmul_epilogue(out2.tensor, norm2.tensor, w.gpu.tensor, false, true, Backend::MatmulEpilogue::gelu,
                            aux2.tensor);
      EXPECT_EQ(download(*gpu_, aux2.tensor), download(*gpu_, aux.gpu.tensor));
    } else {
      gpu_->matmul(out2.tensor, norm2.tensor, w.gpu.tensor, false, true);
    }
    EXPECT_EQ(download(*gpu_, norm2.tensor), download(*gpu_, norm.gpu.tensor));
    EXPECT_EQ(download(*gpu_, rstd2.tensor), download(*gpu_, rstd.gpu.tensor));
    EXPECT_EQ(download(*gpu_, out2.tensor), download(*gpu_, out.gpu.tensor));
  }
};

TEST_F(CudaFewRowsMatmul, PlainProductsOfOneToEightRowsMatchCpu) {
  for (std::int64_t rows : {1, 2, 3, 5, 8, 9}) {  // 9: past the kernel, cuBLASLt again
    expect_matmul_matches(rows, 768, 2304, false, true, DType::bf16, 1.0, 0.0, kBf16Tolerance);
    expect_matmul_matches(rows, 64, 71, false, true, DType::bf16, 1.0, 0.0, kBf16Tolerance);
    expect_matmul_matches(rows, 768, 1000, false, true, DType::f32, 1.0, 0.0, 1e-4);  // logits
    expect_matmul_matches(rows, 53, 71, false, true, DType::bf16, 1.0, 0.0, kBf16Tolerance);  // k not a multiple of 8
    expect_matmul_matches(rows, 64, 71, false, true, DType::bf16, 1.0, 0.0, kBf16Tolerance, 1);  // unaligned a
  }
}

TEST_F(CudaFewRowsMatmul, EpiloguesOfOneToEightRowsMatchCpu) {
  for (std::int64_t rows : {1, 3, 8})
    for (auto epilogue : {Backend::MatmulEpilogue::add, Backend::MatmulEpilogue::gelu}) {
      expect_epilogue_matches(rows, 768, 3072, epilogue);
      expect_epilogue_matches(rows, 3072, 768, epilogue);
      expect_epilogue_matches(rows, 64, 71, epilogue);
    }
}

TEST_F(CudaFewRowsMatmul, FusedNormMatchesCpuAndTheStandaloneNormBitwise) {
  for (std::int64_t rows : {1, 2, 5, 8})
    for (bool gelu : {false, true}) {
      expect_rmsnorm_matmul_matches(rows, 768, 2304, gelu);
      expect_rmsnorm_matmul_matches(rows, 64, 71, gelu);
    }
  expect_rmsnorm_matmul_matches(37, 64, 71, true);  // many rows: the composed ops
}

TEST_F(CudaMatmul, GptLayerShapes) {
  const std::int64_t rows = 256, channels = 768;
  expect_matmul_matches(rows, channels, 3 * channels, false, true, DType::bf16, 1.0, 0.0, kBf16Tolerance);  // x·Wᵀ
  expect_matmul_matches(rows, 3 * channels, channels, false, false, DType::bf16, 1.0, 0.0, kBf16Tolerance);  // dy·W
  expect_matmul_matches(3 * channels, rows, channels, true, false, DType::f32, 1.0, 1.0, 1e-4);  // dW += dyᵀ·x
  // The same product twice reuses the cached plan and gives the same bits.
  OwnedTensor a =
      make_tensor(*gpu_, {rows, channels}, DType::bf16, random_bf16_values(std::size_t(rows * channels), 1));
  OwnedTensor w = make_tensor(*gpu_, {channels, channels}, DType::bf16,
                              random_bf16_values(std::size_t(channels * channels), 2));
  std::vector<std::vector<double>> runs;
  for (int run = 0; run < 2; ++run) {
    OwnedTensor out = allocate_tensor(*gpu_, {rows, channels}, DType::bf16);
    poison(*gpu_, out.tensor);
    gpu_->matmul(out.tensor, a.tensor, w.tensor, false, true);
    runs.push_back(download(*gpu_, out.tensor));
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST_F(CudaOps, GeluAndAddMatchCpuIncludingAliasingAndUnalignedViews) {
  for (int offset : {0, 1}) {  // 1: every pointer one element past a 16-byte boundary
    for (std::int64_t n : {std::int64_t(1000003), std::int64_t(4096)}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " offset " << offset);
      const std::size_t total = std::size_t(n + offset);
      Pair x = pair({n + offset}, DType::bf16, random_bf16_values(total, 24, 2.0f));
      Pair y = pair({n + offset}, DType::bf16, random_bf16_values(total, 25));
      Pair out = pair({n + offset}, DType::bf16, std::vector<float>(total, 0.0f));
      poison(*gpu_, out.gpu.tensor);
      auto view = [&](const OwnedTensor& t) { return t.tensor.rows(offset, n + offset); };

      gpu_->gelu_forward(view(out.gpu), view(x.gpu));
      cpu_->gelu_forward(view(out.cpu), view(x.cpu));
      const auto gelu_gpu = download(*gpu_, view(out.gpu)), gelu_cpu = download(*cpu_, view(out.cpu));
      EXPECT_LT(relative_error(gelu_gpu, gelu_cpu), kBf16Tolerance);

      // dx aliases dout, as the model calls it.
      gpu_->gelu_backward(view(y.gpu), view(y.gpu), view(x.gpu));
      cpu_->gelu_backward(view(y.cpu), view(y.cpu), view(x.cpu));
      EXPECT_LT(relative_error(download(*gpu_, view(y.gpu)), download(*cpu_, view(y.cpu))), kBf16Tolerance);

      // out aliases a.
      gpu_->add(view(x.gpu), view(x.gpu), view(out.gpu));
      cpu_->add(view(x.cpu), view(x.cpu), view(out.cpu));
      EXPECT_LT(relative_error(download(*gpu_, view(x.gpu)), download(*cpu_, view(x.cpu))), kBf16Tolerance);
    }
  }
}

// Clamp in place on f32, bit for bit the CPU's (the same f32 bounds, std::clamp's comparisons:
// NaN kept, infinities clamped), over a view that leaves its neighbours alone; bad arguments.
TEST_F(CudaOps, ClampEqualsTheCpuBitwise) {
  const double lowest = -2.0 * std::numbers::pi;
  const std::int64_t n = 100003;
  std::mt19937_64 engine(31);
  std::normal_distribution<float> normal(-3.0f, 5.0f);
  std::vector<float> values(std::size_t(n + 2));
  for (float& v : values) v = normal(engine);
  values[1] = std::numeric_limits<float>::quiet_NaN();
  values[2] = std::numeric_limits<float>::infinity();
  values[3] = -std::numeric_limits<float>::infinity();
  values[4] = float(lowest);
  values[5] = std::nextafter(float(lowest), 0.0f);
  values[6] = -0.0f;
  Pair x = pair({n + 2}, DType::f32, values);
  const auto view = [&](const OwnedTensor& t) { return t.tensor.rows(1, n + 1); };
  gpu_->clamp(view(x.gpu), lowest, 0.0);
  cpu_->clamp(view(x.cpu), lowest, 0.0);
  const std::vector<double> got = download(*gpu_, x.gpu.tensor), want = download(*cpu_, x.cpu.tensor);
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_EQ(got[2], 0.0);
  EXPECT_EQ(got[3], double(float(lowest)));
  EXPECT_EQ(got.front(), double(values.front())) << "before the view";
  EXPECT_EQ(got.back(), double(values.back())) << "after the view";
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
      continue;
    }
    ASSERT_EQ(std::signbit(got[i]), std::signbit(want[i])) << "element " << i;
    ASSERT_EQ(got[i], want[i]) << "element " << i;
    ASSERT_TRUE(i == 0 || i == got.size() - 1 || (got[i] >= float(lowest) && got[i] <= 0.0)) << "element " << i;
  }
  Pair half = pair({8}, DType::bf16, std::vector<float>(8, 1.0f));
  expect_invalid_argument([&] { gpu_->clamp(half.gpu.tensor, lowest, 0.0); }, "clamp");
  expect_invalid_argument([&] { gpu_->clamp(x.gpu.tensor, 0.0, lowest); }, "lowest");
}

class CudaCrossEntropy : public CudaOps {
 protected:
  // Logits with random values in the padded columns too (they must be ignored), targets with
  // two masked rows and one at the last real column. bf16 logits (training) hold bf16 values;
  // f32 logits (evaluation) hold values bf16 cannot represent, so that rounding them anywhere
  // on the way would show against the fp32 CPU reference.
  void expect_matches_cpu(int rows, int vocab, int padded, bool compute_grad, DType logits_dtype = DType::bf16) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " vocab " << vocab << " padded " << padded << " grad "
                                      << compute_grad << " logits " << dtype_name(logits_dtype));
    const bool f32 = logits_dtype == DType::f32;
    std::vector<float> logit_values = random_bf16_values(std::size_t(rows) * padded, 26, 3.0f);
    if (f32) {
      std::mt19937_64 engine(30);
      std::uniform_real_distribution<float> below_bf16_resolution(-0.01f, 0.01f);
      for (float& v : logit_values) v += below_bf16_resolution(engine);
    }
    Pair logits = pair({rows, padded}, logits_dtype, logit_values);
    std::vector<std::int32_t> target_values = random_ids(std::size_t(rows), vocab, 27);
    target_values[1] = -1;
    target_values[std::size_t(rows) - 2] = -100;
    target_values[std::size_t(rows) - 1] = vocab - 1;
    Pair targets = ids(target_values);
    Pair losses = pair({rows}, DType::f32, std::vector<float>(std::size_t(rows), 0.0f));
    poison(*gpu_, losses.gpu.tensor);
    const double grad_scale = 0.25;
    gpu_->cross_entropy(losses.gpu.tensor, logits.gpu.tensor, targets.gpu.tensor, vocab, compute_grad, grad_scale);
    cpu_->cross_entropy(losses.cpu.tensor, logits.cpu.tensor, targets.cpu.tensor, vocab, compute_grad, grad_scale);
    EXPECT_LT(error_of(losses), 1e-5);  // bf16-rounding the f32 logits would cost a few 1e-4
    const std::vector<double> loss_values = download(*gpu_, losses.gpu.tensor);
    EXPECT_EQ(loss_values[1], 0.0);
    EXPECT_EQ(loss_values[std::size_t(rows) - 2], 0.0);

    const std::vector<double> result = download(*gpu_, logits.gpu.tensor);
    if (!compute_grad) {
      EXPECT_EQ(result, std::vector<double>(logit_values.begin(), logit_values.end())) << "logits were modified";
      return;
    }
    EXPECT_LT(relative_error(result, download(*cpu_, logits.cpu.tensor)), f32 ? 1e-4 : kBf16Tolerance);
    for (int n = 0; n < rows; ++n) {
      const bool masked = target_values[std::size_t(n)] < 0;
      for (int c = masked ? 0 : vocab; c < padded; ++c)
        ASSERT_EQ(result[std::size_t(n) * padded + c], 0.0) << "row " << n << " column " << c;
    }
  }
};

TEST_F(CudaCrossEntropy, PaddedVocabularyAndMaskedTargets) {
  expect_matches_cpu(33, 1000, 1024, false);
  expect_matches_cpu(33, 1000, 1024, true);
  expect_matches_cpu(5, 37, 37, true);  // no padding, a width below the block size
}

// The GPU's greedy choice against the CPU's over fp32 logits with padding that would win, a tie
// (the lower column), a row with a NaN and one with every logit equal.
TEST_F(CudaOps, GreedyTokensMatchTheCpu) {
  for (const auto [rows, vocab, padded] : {std::array{6, 50257, 50304}, std::array{3, 37, 40}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " vocab " << vocab);
    std::vector<float> values = random_bf16_values(std::size_t(rows) * padded, 31, 3.0f);
    for (int n = 0; n < rows; ++n)
      for (int j = vocab; j < padded; ++j) values[std::size_t(n) * padded + j] = 100.0f;
    values[std::size_t(padded) + 5] = values[std::size_t(padded) + vocab - 2] = 20.0f;
    values[std::size_t(2) * padded + 11] = std::numeric_limits<float>::quiet_NaN();
    if (rows > 3) std::fill_n(values.begin() + std::ptrdiff_t(3 * padded), vocab, 0.5f);
    Pair logits = pair({rows, padded}, DType::f32, values);
    Pair chosen = ids(std::vector<std::int32_t>(std::size_t(rows), -1));
    Pair log_probs = pair({rows}, DType::f32, std::vector<float>(std::size_t(rows), 0.0f));
    Pair past = ids(std::vector<std::int32_t>{17});
    gpu_->greedy_tokens(chosen.gpu.tensor, log_probs.gpu.tensor, logits.gpu.tensor, vocab, past.gpu.tensor, 1);
    cpu_->greedy_tokens(chosen.cpu.tensor, log_probs.cpu.tensor, logits.cpu.tensor, vocab, past.cpu.tensor, 1);
    std::int32_t gpu_past = 0;
    gpu_->copy_to_host(&gpu_past, past.gpu.tensor);
    EXPECT_EQ(gpu_past, 18) << "the next call's cached length";
    std::vector<std::int32_t> gpu_ids(std::size_t(rows), 0), cpu_ids(std::size_t(rows), 0);
    gpu_->copy_to_host(gpu_ids.data(), chosen.gpu.tensor);
    cpu_->copy_to_host(cpu_ids.data(), chosen.cpu.tensor);
    EXPECT_EQ(gpu_ids, cpu_ids);
    EXPECT_EQ(gpu_ids[1], 5);
    EXPECT_EQ(gpu_ids[2], 0);
    if (rows > 3) {
      EXPECT_EQ(gpu_ids[3], 0);
    }
    const std::vector<double> got = download(*gpu_, log_probs.gpu.tensor), want = download(*cpu_, log_probs.cpu.tensor);
    for (int n = 0; n < rows; ++n) {
      if (n == 2) {
        EXPECT_TRUE(std::isnan(got[2]) && std::isnan(want[2]));
        continue;
      }
      EXPECT_NEAR(got[std::size_t(n)], want[std::size_t(n)], 1e-5) << "row " << n;
    }
  }
}

TEST_F(CudaCrossEntropy, Gpt2Vocabulary) { expect_matches_cpu(6, 50257, 50304, true); }

// Evaluation's fp32 logits: the same kernel reading fp32 rows, in 8-wide groups and singly.
TEST_F(CudaCrossEntropy, Fp32Logits) {
  expect_matches_cpu(33, 1000, 1024, false, DType::f32);
  expect_matches_cpu(33, 1000, 1024, true, DType::f32);
  expect_matches_cpu(5, 37, 37, false, DType::f32);  // odd width: one column at a time
  expect_matches_cpu(6, 50257, 50304, false, DType::f32);
}

TEST_F(CudaCrossEntropy, RejectsLogitsThatAreNeitherBf16NorF32) {
  OwnedTensor logits = allocate_tensor(*gpu_, {4, 128}, DType::f64);
  OwnedTensor targets = make_ids(*gpu_, {1, 2, 3, 4});
  OwnedTensor losses = allocate_tensor(*gpu_, {4}, DType::f32);
  expect_invalid_argument([&] { gpu_->cross_entropy(losses.tensor, logits.tensor, targets.tensor, 100, false, 1.0); },
                          "logits are f64, expected bf16 or f32");
}

TEST_F(CudaCrossEntropy, TargetBeyondVocabularyIsReported) {
  OwnedTensor logits = make_tensor(*gpu_, {4, 128}, DType::bf16, random_bf16_values(4 * 128, 28));
  OwnedTensor targets = make_ids(*gpu_, {1, 2, 1000, 3});
  OwnedTensor losses = allocate_tensor(*gpu_, {4}, DType::f32);
  gpu_->cross_entropy(losses.tensor, logits.tensor, targets.tensor, 100, true, 1.0);
  expect_invalid_argument([&] { gpu_->synchronize(); }, "targets[2] = 1000");
  expect_invalid_argument([&] { gpu_->cross_entropy(losses.tensor, logits.tensor, targets.tensor, 129, true, 1.0); },
                          "vocab_size is 129");
}

TEST_F(CudaOps, SumOfSquaresMatchesCpuAndIsBitwiseDeterministic) {
  for (std::int64_t n : {std::int64_t(5), std::int64_t(3000017)}) {
    SCOPED_TRACE(n);
    std::mt19937_64 engine(29);
    std::normal_distribution<float> normal(0.0f, 1e-2f);
    std::vector<float> values(static_cast<std::size_t>(n));
    for (float& v : values) v = normal(engine);
    Pair x = pair({n}, DType::f32, values);
    const double gpu_sum = gpu_->sum_of_squares(x.gpu.tensor);
    const double cpu_sum = cpu_->sum_of_squares(x.cpu.tensor);
    EXPECT_NEAR(gpu_sum, cpu_sum, 1e-10 * cpu_sum);  // one missed element would be ≈ 3e-7
    EXPECT_EQ(gpu_->sum_of_squares(x.gpu.tensor), gpu_sum);  // bitwise
    // Views starting 1..3 floats past a 16-byte boundary: elements before the first boundary
    // and after the last whole 16-byte group are summed apart from the vectors.
    for (std::int64_t skip = 1; skip <= 3; ++skip) {
      SCOPED_TRACE(skip);
      const double view_gpu = gpu_->sum_of_squares(x.gpu.tensor.rows(skip, n));
      const double view_cpu = cpu_->sum_of_squares(x.cpu.tensor.rows(skip, n));
      EXPECT_NEAR(view_gpu, view_cpu, 1e-10 * view_cpu);
    }
  }
}

class CudaAdamW : public CudaOps {
 protected:
  static constexpr std::int64_t kTotal = 200000;
  // Segments with padding gaps between them, an empty one, some longer than one 64Ki chunk, one
  // whose ends are not multiples of 4 (the kernel's single-element head and tail), one of 5.
  std::vector<ParamSegment> gapped_segments() const {
    return {{0, 70000, true},      {70005, 5, false},      {70021, 10, false},
            {70032, 0, true},      {70048, 100000, true},  {170048, 29000, false}};
  }

  void SetUp() override {
    CudaOps::SetUp();
    if (IsSkipped()) return;
    std::vector<float> second = random_bf16_values(kTotal, 33, 1e-2f);
    for (float& s : second) s = s * s;  // v ≥ 0
    params_ = pair({kTotal}, DType::f32, random_bf16_values(kTotal, 30));
    grads_ = pair({kTotal}, DType::f32, random_bf16_values(kTotal, 31));
    m_ = pair({kTotal}, DType::f32, random_bf16_values(kTotal, 32, 0.1f));
    v_ = pair({kTotal}, DType::f32, second);
    compute_ = allocate_tensor(*gpu_, {kTotal}, DType::bf16);
  }

  void step_both(std::span<const ParamSegment> segments, const AdamWStep& step) {
    gpu_->adamw(params_.gpu.tensor, grads_.gpu.tensor, m_.gpu.tensor, v_.gpu.tensor, segments, step, compute_.tensor);
    cpu_->adamw(params_.cpu.tensor, grads_.cpu.tensor, m_.cpu.tensor, v_.cpu.tensor, segments, step, Tensor{});
  }

  Pair params_, grads_, m_, v_;
  OwnedTensor compute_;
};

TEST_F(CudaAdamW, MatchesCpuAndLeavesPaddingAlone) {
  const std::vector<double> params_before = download(*gpu_, params_.gpu.tensor);
  const std::vector<double> m_before = download(*gpu_, m_.gpu.tensor);
  poison(*gpu_, compute_.tensor);
  AdamWStep step;
  step.lr = 1e-3;
  step.weight_decay = 0.1;
  step.step = 3;
  step.grad_scale = 0.7;
  const std::vector<ParamSegment> segments = gapped_segments();
  step_both(segments, step);
  EXPECT_LT(error_of(params_), 1e-6);
  EXPECT_LT(error_of(m_), 1e-6);
  EXPECT_LT(error_of(v_), 1e-6);

  const std::vector<double> params_after = download(*gpu_, params_.gpu.tensor);
  const std::vector<double> m_after = download(*gpu_, m_.gpu.tensor);
  const std::vector<double> compute = download(*gpu_, compute_.tensor);
  std::vector<bool> covered(kTotal, false);
  for (const ParamSegment& s : segments) std::fill_n(covered.begin() + s.offset, s.numel, true);
  for (std::int64_t i = 0; i < kTotal; ++i) {
    const std::size_t k = std::size_t(i);
    if (covered[k]) {
      ASSERT_EQ(compute[k], bf16_to_float(float_to_bf16(float(params_after[k])))) << "element " << i;
    } else {
      ASSERT_EQ(params_after[k], params_before[k]) << "padding element " << i;
      ASSERT_EQ(m_after[k], m_before[k]) << "padding element " << i;
      ASSERT_TRUE(std::isnan(compute[k])) << "padding element " << i << " of the compute copy was written";
    }
  }

  // A different segment list must not reuse the cached chunk table.
  const std::vector<ParamSegment> whole = {{0, kTotal, false}};
  step.step = 4;
  step_both(whole, step);
  EXPECT_LT(error_of(params_), 1e-6);
  EXPECT_LT(error_of(v_), 1e-6);
}

TEST_F(CudaAdamW, MatchesCpuOnArenasOffA16ByteBoundary) {
  // Arenas one float past cudaMalloc's alignment take the single-element path throughout.
  const std::int64_t n = kTotal - 1;
  AdamWStep step;
  step.lr = 1e-3;
  step.weight_decay = 0.1;
  step.step = 2;
  const std::vector<ParamSegment> segments = {{0, 65600, true}, {65603, n - 65603, false}};
  OwnedTensor compute = allocate_tensor(*gpu_, {n}, DType::bf16);
  gpu_->adamw(params_.gpu.tensor.rows(1, kTotal), grads_.gpu.tensor.rows(1, kTotal), m_.gpu.tensor.rows(1, kTotal),
              v_.gpu.tensor.rows(1, kTotal), segments, step, compute.tensor);
  cpu_->adamw(params_.cpu.tensor.rows(1, kTotal), grads_.cpu.tensor.rows(1, kTotal), m_.cpu.tensor.rows(1, kTotal),
              v_.cpu.tensor.rows(1, kTotal), segments, step, Tensor{});
  EXPECT_LT(error_of(params_), 1e-6);
  EXPECT_LT(error_of(m_), 1e-6);
  EXPECT_LT(error_of(v_), 1e-6);
  const std::vector<double> params_after = download(*gpu_, params_.gpu.tensor);
  const std::vector<double> compute_after = download(*gpu_, compute.tensor);
  for (std::int64_t i = 0; i < n; ++i) {
    if (i >= 65600 && i < 65603) continue;  // the gap between the segments
    const float updated = float(params_after[std::size_t(i) + 1]);
    ASSERT_EQ(compute_after[std::size_t(i)], bf16_to_float(float_to_bf16(updated))) << "element " << i;
  }
}

TEST_F(CudaAdamW, RejectsSegmentsOutsideTheArenaAndBadSteps) {
  AdamWStep step;
  const std::vector<ParamSegment> outside = {{kTotal - 10, 11, false}};
  expect_invalid_argument([&] { step_both(outside, step); }, "segment 0 covers");
  step.step = 0;
  const std::vector<ParamSegment> fine = {{0, 10, false}};
  expect_invalid_argument([&] { step_both(fine, step); }, "step is 0");
}

}  // namespace
