// The FP8 building blocks of train.precision = "fp8": the scaled casts (kernels/fp8_cast.cuh) bit
// for bit against the host's conversion of cuda_fp8.h, their amax with zeros, an outlier and
// non-finite values, their GELU prologues against the GELU kernels then the cast, and cuBLASLt's
// FP8 products (e4m3 · e4m3, e5m2 · e4m3, into bf16 and accumulated into f32) against an f32
// product of the same dequantised operands; then the CUDA
// backend's FP8 ops (the scale update among them) against the CPU backend's. Reports SKIPPED
// (visibly) without a GPU or on one without FP8 tensor cores (before sm_89), except the first
// test, which holds the CPU reference's conversion (model/fp8.hpp) to cuda_fp8.h's on the host.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cuda/cublaslt_matmul.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda_op_test_support.hpp"
#include "cuda/cuda_device.hpp"
#include "elementwise.cuh"
#include "fp8_cast.cuh"
#include "model/bf16.hpp"
#include "model/fp8.hpp"

namespace {

using pope::kernels::Fp8Format;

std::string why_no_fp8() {
  if (pope::cuda_device_count() == 0) return "no CUDA device";
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, 0) != cudaSuccess) throw std::runtime_error("cudaGetDeviceProperties failed");
  if (properties.major * 10 + properties.minor >= 89) return {};
  return "FP8 tensor cores need sm_89 or later, this is sm_" + std::to_string(properties.major) +
         std::to_string(properties.minor);
}

#define SKIP_WITHOUT_FP8()                                  \
  if (const std::string why = why_no_fp8(); !why.empty()) { \
    GTEST_SKIP() << why;                                    \
  }

// Device memory for `count` elements of T, freed on scope exit.
template <class T> class DeviceArray {
 public:
  explicit DeviceArray(std::size_t count) : count_(count) {
    if (cudaMalloc(&data_, count * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  DeviceArray(const std::vector<T>& values) : DeviceArray(values.size()) { upload(values); }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return data_; }
  void upload(const std::vector<T>& values) {
    EXPECT_EQ(cudaMemcpy(data_, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> values(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(values.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return values;
  }

 private:
  T* data_ = nullptr;
  std::size_t count_;
};

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& values) {
  std::vector<__nv_bfloat16> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = __float2bfloat16(values[i]);
  return out;
}

std::vector<float> normal_values(std::size_t count, std::uint64_t seed, float sigma) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> values(count);
  for (float& v : values) v = __bfloat162float(__float2bfloat16(normal(engine)));
  return values;
}

// The host conversion the kernels must match, and its inverse.
std::uint8_t host_fp8(float v, Fp8Format format) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
}
float host_fp8_value(std::uint8_t q, Fp8Format format) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(q, format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}

float amax_of(const std::vector<float>& values) {
  float m = 0;
  for (float v : values) m = std::max(m, std::fabs(v));
  return m;
}

// Every bf16 value (so every value a bf16 tensor times a power-of-two scale can hold), times a few
// scales, and the specials: the CPU's conversion is CUDA's, in both formats.
TEST(CudaFp8, HostConversionEqualsCudasOnEveryBf16Value) {
  for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const pope::DType dtype = format == Fp8Format::e4m3 ? pope::DType::e4m3 : pope::DType::e5m2;
    for (float scale : {1.0f, 3.0f, 0.7f})
      for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        const float v = pope::bf16_to_float(std::uint16_t(bits)) * scale;
        ASSERT_EQ(pope::float_to_fp8(v, dtype), host_fp8(v, format))
            << pope::dtype_name(dtype) << " value " << v << " (bf16 bits " << bits << ", scale " << scale << ")";
      }
    for (int code = 0; code < 256; ++code) {
      const float want = host_fp8_value(std::uint8_t(code), format), got = pope::fp8_to_float(std::uint8_t(code), dtype);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << code;
      } else {
        EXPECT_EQ(got, want) << pope::dtype_name(dtype) << " code " << code;
      }
    }
  }
}

struct Cast {
  std::vector<std::uint8_t> out, out_t;
  float amax;
};

Cast cast(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, Fp8Format format, float scale,
          float amax_before = 0.0f) {
  DeviceArray<__nv_bfloat16> in(to_bf16(x));
  DeviceArray<float> scale_d(std::vector<float>{scale}), amax_d(std::vector<float>{amax_before});
  DeviceArray<std::uint8_t> out(x.size()), out_t(x.size());
  EXPECT_EQ(pope::kernels::fp8_cast_transpose_bf16(in.get(), rows, cols, format, scale_d.get(), out.get(), out_t.get(),
                                                   amax_d.get(), nullptr),
            cudaSuccess);
  return {out.download(), out_t.download(), amax_d.download()[0]};
}

// Both layouts equal the host's conversion element for element, in both formats, values past the
// format's range saturating: on a shape that is not a multiple of the 32 × 32 tile (the scalar
// kernel) and on one of 64 × 64 tiles (the vectorised kernel the model's shapes take).
TEST(CudaFp8, CastTransposeEqualsTheHostConversionAndTheAmaxIsExact) {
  SKIP_WITHOUT_FP8();
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{45, 70}, {128, 192}})
    for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      std::vector<float> x = normal_values(std::size_t(rows * cols), 3, 2.0f);
      x[17] = -300.0f;  // × 4 is past e4m3's 448: saturates to −448
      const float scale = 4.0f;
      const Cast got = cast(x, rows, cols, format, scale);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) {
          const std::uint8_t want = host_fp8(x[r * cols + c] * scale, format);
          ASSERT_EQ(got.out[r * cols + c], want) << rows << " × " << cols << ", row " << r << " col " << c;
          ASSERT_EQ(got.out_t[c * rows + r], want) << rows << " × " << cols << ", transposed, row " << r << " col " << c;
        }
      EXPECT_EQ(got.amax, amax_of(x));
      if (format == Fp8Format::e4m3) {
        EXPECT_EQ(host_fp8_value(got.out[17], format), -448.0f);
      }
    }
}

// The GELU prologues equal the unfused pair on the GPU, gelu_forward (or gelu_backward) into a bf16
// tensor and then the cast, bit for bit in both layouts and in the amax, on both kernels' shapes.
TEST(CudaFp8, CastProloguesEqualTheGeluKernelsThenTheCast) {
  SKIP_WITHOUT_FP8();
  using pope::kernels::Fp8CastPrologue;
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{45, 70}, {128, 192}}) {
    const std::size_t n = std::size_t(rows * cols);
    DeviceArray<__nv_bfloat16> x(to_bf16(normal_values(n, 51, 2.0f))), pre(to_bf16(normal_values(n, 52, 1.5f))),
        staged(n);
    DeviceArray<float> scale(std::vector<float>{40.0f});
    auto cast = [&](const __nv_bfloat16* input, Fp8CastPrologue prologue, const __nv_bfloat16* with) {
      DeviceArray<std::uint8_t> out(n), out_t(n);
      DeviceArray<float> amax(std::vector<float>{0.0f});
      EXPECT_EQ(pope::kernels::fp8_cast_transpose_bf16(input, rows, cols, Fp8Format::e5m2, scale.get(), out.get(),
                                                       out_t.get(), amax.get(), nullptr, prologue, with),
                cudaSuccess);
      std::vector<std::uint8_t> all = out.download(), transposed = out_t.download();
      all.insert(all.end(), transposed.begin(), transposed.end());
      return std::make_pair(all, amax.download()[0]);
    };
    ASSERT_EQ(pope::kernels::gelu_forward(staged.get(), x.get(), n, nullptr), cudaSuccess);
    EXPECT_EQ(cast(x.get(), Fp8CastPrologue::gelu, nullptr), cast(staged.get(), Fp8CastPrologue::none, nullptr))
        << rows << " × " << cols;
    ASSERT_EQ(pope::kernels::gelu_backward(staged.get(), x.get(), pre.get(), n, nullptr), cudaSuccess);
    EXPECT_EQ(cast(x.get(), Fp8CastPrologue::gelu_backward, pre.get()),
              cast(staged.get(), Fp8CastPrologue::none, nullptr))
        << rows << " × " << cols;
  }
}

// The running amax only grows: a cast of zeros keeps the amax it was given (and writes zeros);
// a huge outlier becomes the amax; a NaN or an infinity makes it non-finite.
TEST(CudaFp8, AmaxKeepsZerosOutliersAndNonFiniteValues) {
  SKIP_WITHOUT_FP8();
  constexpr std::int64_t kRows = 33, kCols = 40;
  const Cast zeros = cast(std::vector<float>(kRows * kCols, 0.0f), kRows, kCols, Fp8Format::e4m3, 1.0f, 0.5f);
  EXPECT_EQ(zeros.amax, 0.5f);
  for (std::uint8_t q : zeros.out) ASSERT_EQ(host_fp8_value(q, Fp8Format::e4m3), 0.0f);

  std::vector<float> x = normal_values(kRows * kCols, 4, 1.0f);
  x[kRows * kCols - 1] = 1.0e30f;
  EXPECT_EQ(cast(x, kRows, kCols, Fp8Format::e5m2, 1.0f).amax, __bfloat162float(__float2bfloat16(1.0e30f)));

  x[5] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cast(x, kRows, kCols, Fp8Format::e4m3, 1.0f).amax, std::numeric_limits<float>::infinity());
  x[6] = -std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(cast(x, kRows, kCols, Fp8Format::e4m3, 1.0f).amax));
}

// out = a · bᵀ through cuBLASLt on FP8 operands equals the f32 product of the dequantised
// operands to within f32 accumulation and the output's rounding: the quantisation error itself
// is not in this comparison, since both sides use the same FP8 values.
void expect_fp8_product(Fp8Format a_format, Fp8Format b_format, bool out_f32, bool fast) {
  constexpr std::int64_t kM = 96, kN = 80, kK = 128;
  const std::vector<float> a = normal_values(kM * kK, 11, 1.0f), b = normal_values(kN * kK, 12, 0.05f);
  const float a_scale = 448.0f / amax_of(a) / 2.0f, b_scale = 448.0f / amax_of(b) / 2.0f;
  const Cast qa = cast(a, kM, kK, a_format, a_scale), qb = cast(b, kN, kK, b_format, b_scale);
  DeviceArray<std::uint8_t> a_d(qa.out), b_d(qb.out);
  DeviceArray<float> a_inv(std::vector<float>{1.0f / a_scale}), b_inv(std::vector<float>{1.0f / b_scale});
  const std::vector<float> prior = normal_values(kM * kN, 13, 1.0f);
  std::vector<double> want(kM * kN);
  for (std::int64_t i = 0; i < kM; ++i)
    for (std::int64_t j = 0; j < kN; ++j) {
      double sum = 0;
      for (std::int64_t k = 0; k < kK; ++k)
        sum += double(host_fp8_value(qa.out[i * kK + k], a_format)) / a_scale *
               double(host_fp8_value(qb.out[j * kK + k], b_format)) / b_scale;
      want[i * kN + j] = sum + (out_f32 ? prior[i * kN + j] : 0.0);
    }
  std::vector<float> got;
  pope::cuda::CublasLtMatmul matmul;
  pope::cuda::GemmCall call;
  call.m = kM, call.n = kN, call.k = kK, call.transpose_b = true;
  call.a = a_d.get(), call.b = b_d.get();
  call.a_type = a_format == Fp8Format::e4m3 ? pope::cuda::GemmOperand::e4m3 : pope::cuda::GemmOperand::e5m2;
  call.b_type = b_format == Fp8Format::e4m3 ? pope::cuda::GemmOperand::e4m3 : pope::cuda::GemmOperand::e5m2;
  call.a_scale_inv = a_inv.get(), call.b_scale_inv = b_inv.get(), call.fast_accumulation = fast;
  if (out_f32) {
    DeviceArray<float> out(prior);
    call.out = out.get(), call.out_is_f32 = true, call.beta = 1.0f;  // accumulates, as weight gradients do
    matmul.run(call, nullptr);
    got = out.download();
  } else {
    DeviceArray<__nv_bfloat16> out(kM * kN);
    call.out = out.get();
    matmul.run(call, nullptr);
    for (__nv_bfloat16 v : out.download()) got.push_back(__bfloat162float(v));
  }
  double error = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    error += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  // bf16 output rounds each element by up to 2^-9 relative; Hopper's FP8 tensor cores keep about
  // 14 bits between promotions to f32, so the f32 output is held to 1e-3, not to f32 rounding.
  EXPECT_LT(std::sqrt(error / norm), out_f32 ? 1e-3 : 5e-3)
      << "a " << int(a_format) << " b " << int(b_format) << (fast ? " fast accumulation" : "");
}

TEST(CudaFp8, ProductsEqualTheDequantisedF32Product) {
  SKIP_WITHOUT_FP8();
  expect_fp8_product(Fp8Format::e4m3, Fp8Format::e4m3, false, true);   // forward: x · Wᵀ
  expect_fp8_product(Fp8Format::e5m2, Fp8Format::e4m3, false, false);  // input gradient: dy · W
  expect_fp8_product(Fp8Format::e5m2, Fp8Format::e4m3, true, false);   // weight gradient, accumulated
}

// And the FP8 product with quantisation against the exact f32 product of the bf16 operands:
// within FP8's error bound. e4m3 keeps 3 mantissa bits, so rounding leaves about 2.6% rms relative
// error per operand and 3.7% in each product term; independent terms keep that ratio in the sum.
TEST(CudaFp8, ForwardProductIsWithinFp8sErrorOfTheExactProduct) {
  SKIP_WITHOUT_FP8();
  constexpr std::int64_t kM = 64, kN = 64, kK = 256;
  const std::vector<float> a = normal_values(kM * kK, 21, 1.0f), b = normal_values(kN * kK, 22, 1.0f);
  const float a_scale = 448.0f / amax_of(a), b_scale = 448.0f / amax_of(b);
  const Cast qa = cast(a, kM, kK, Fp8Format::e4m3, a_scale), qb = cast(b, kN, kK, Fp8Format::e4m3, b_scale);
  DeviceArray<std::uint8_t> a_d(qa.out), b_d(qb.out);
  DeviceArray<float> a_inv(std::vector<float>{1.0f / a_scale}), b_inv(std::vector<float>{1.0f / b_scale});
  DeviceArray<__nv_bfloat16> out(kM * kN);
  pope::cuda::CublasLtMatmul matmul;
  pope::cuda::GemmCall call;
  call.m = kM, call.n = kN, call.k = kK, call.transpose_b = true, call.out = out.get();
  call.a = a_d.get(), call.b = b_d.get(), call.a_type = call.b_type = pope::cuda::GemmOperand::e4m3;
  call.a_scale_inv = a_inv.get(), call.b_scale_inv = b_inv.get();
  matmul.run(call, nullptr);
  const std::vector<__nv_bfloat16> got = out.download();
  double error = 0, norm = 0;
  for (std::int64_t i = 0; i < kM; ++i)
    for (std::int64_t j = 0; j < kN; ++j) {
      double want = 0;
      for (std::int64_t k = 0; k < kK; ++k) want += double(a[i * kK + k]) * b[j * kK + k];
      const double d = __bfloat162float(got[i * kN + j]) - want;
      error += d * d;
      norm += want * want;
    }
  const double relative = std::sqrt(error / norm);
  EXPECT_LT(relative, 0.06);
  EXPECT_GT(relative, 1e-3);  // it is FP8: an exact match would mean the operands were not quantised
}

// The model's calls: one matmul object reused across layers, each dequantization factor the first
// of a 16-byte row of one array (fp8_update_scales' scale_inv). Each call equals a fresh object's
// call with the same factors in allocations of their own, bit for bit. A factor off a 16-byte
// boundary, which cuBLASLt refuses when enqueued, is refused before.
TEST(CudaFp8, ProductsReadFactorsFromRowsOfOneArrayThroughAReusedPlan) {
  SKIP_WITHOUT_FP8();
  constexpr std::int64_t kM = 64, kN = 48, kK = 128, kRow = pope::kFp8FactorRow;
  const std::vector<float> a = normal_values(kM * kK, 41, 1.0f), b = normal_values(kN * kK, 42, 1.0f);
  const Cast qa = cast(a, kM, kK, Fp8Format::e4m3, 64.0f), qb = cast(b, kN, kK, Fp8Format::e4m3, 64.0f);
  DeviceArray<std::uint8_t> a_d(qa.out), b_d(qb.out);
  const std::vector<float> factors{0.5f, 0.25f, 2.0f, 0.125f};
  std::vector<float> rows(factors.size() * kRow, 1.0f);
  for (std::size_t i = 0; i < factors.size(); ++i) rows[i * kRow] = factors[i];
  DeviceArray<float> packed(rows);
  DeviceArray<__nv_bfloat16> out(kM * kN);
  pope::cuda::CublasLtMatmul reused;
  pope::cuda::GemmCall call;
  call.m = kM, call.n = kN, call.k = kK, call.transpose_b = true, call.out = out.get();
  call.a = a_d.get(), call.b = b_d.get(), call.a_type = call.b_type = pope::cuda::GemmOperand::e4m3;
  call.fast_accumulation = true;
  for (std::size_t first : {0, 2, 1}) {
    call.a_scale_inv = packed.get() + first * kRow, call.b_scale_inv = packed.get() + (first + 1) * kRow;
    reused.run(call, nullptr);
    const std::vector<__nv_bfloat16> got = out.download();
    DeviceArray<float> a_inv(std::vector<float>{factors[first]}), b_inv(std::vector<float>{factors[first + 1]});
    DeviceArray<__nv_bfloat16> fresh_out(kM * kN);
    pope::cuda::GemmCall fresh_call = call;
    fresh_call.a_scale_inv = a_inv.get(), fresh_call.b_scale_inv = b_inv.get(), fresh_call.out = fresh_out.get();
    pope::cuda::CublasLtMatmul fresh;
    fresh.run(fresh_call, nullptr);
    const std::vector<__nv_bfloat16> want = fresh_out.download();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(got[0])), 0) << "factors from row " << first;
  }
  call.b_scale_inv = packed.get() + 1;
  EXPECT_THROW(reused.run(call, nullptr), std::logic_error);
}

// Layouts cuBLASLt's FP8 kernels do not take are refused before anything is enqueued.
TEST(CudaFp8, ProductsOutsideTheKMajorLayoutAreRefused) {
  SKIP_WITHOUT_FP8();
  DeviceArray<std::uint8_t> a(64 * 64), b(64 * 64);
  DeviceArray<float> one(std::vector<float>{1.0f});
  DeviceArray<__nv_bfloat16> out(64 * 64);
  pope::cuda::CublasLtMatmul matmul;
  pope::cuda::GemmCall call;
  call.m = call.n = call.k = 64, call.out = out.get(), call.a = a.get(), call.b = b.get();
  call.a_type = call.b_type = pope::cuda::GemmOperand::e4m3, call.a_scale_inv = call.b_scale_inv = one.get();
  EXPECT_THROW(matmul.run(call, nullptr), std::logic_error);  // b not transposed
  call.transpose_b = true, call.a_type = call.b_type = pope::cuda::GemmOperand::e5m2;
  EXPECT_THROW(matmul.run(call, nullptr), std::logic_error);  // e5m2 · e5m2
  call.a_type = pope::cuda::GemmOperand::e4m3, call.b_scale_inv = nullptr;
  EXPECT_THROW(matmul.run(call, nullptr), std::logic_error);  // no dequantization factor
}

// The CUDA backend's FP8 ops against the CPU backend's on the same values: the casts (both
// layouts and the amax) and the scale update bit for bit, the products (one accumulating into f32,
// one adding a residual into bf16) within the output's rounding and the tensor cores' accumulation.
class CudaFp8Ops : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = why_no_fp8(); !why.empty()) {
      GTEST_SKIP() << why;
    }
    gpu_ = pope::make_cuda_backend(0);
    cpu_ = pope::make_cpu_backend("float", 0);
  }
  std::unique_ptr<pope::Backend> gpu_, cpu_;
};

TEST_F(CudaFp8Ops, CastsAndScalesEqualTheCpuBitwiseAndProductsWithinTolerance) {
  using pope::DType;
  using pope::test::make_tensor;
  constexpr std::int64_t M = 70, N = 48, K = 96;
  std::vector<float> a = normal_values(M * K, 31, 1.0f), b = normal_values(N * K, 32, 0.02f);
  a[5] = 3008.0f;  // a bf16 value past e4m3's range once scaled: saturates on both
  const std::vector<float> a_scale{0.2f}, b_scale{5000.0f}, zero{0.0f};
  struct Side {
    pope::OwnedTensor a, b, a8, a8_t, b8, sa, sb, amax_a, amax_b, out, addend, added;
  };
  const std::vector<float> residual = normal_values(M * N, 33, 1.0f);
  auto side = [&](pope::Backend& be, DType activation) {
    Side s{make_tensor(be, {M, K}, activation, a), make_tensor(be, {N, K}, activation, b),
           pope::allocate_tensor(be, {M, K}, DType::e4m3), pope::allocate_tensor(be, {K, M}, DType::e4m3),
           pope::allocate_tensor(be, {N, K}, DType::e4m3), make_tensor(be, {1}, DType::f32, a_scale),
           make_tensor(be, {1}, DType::f32, b_scale), make_tensor(be, {1}, DType::f32, zero),
           make_tensor(be, {1}, DType::f32, zero), make_tensor(be, {M, N}, DType::f32, std::vector<float>(M * N, 0.5f)),
           make_tensor(be, {M, N}, activation, residual), pope::allocate_tensor(be, {M, N}, activation)};
    be.fp8_cast(s.a8.tensor, s.a8_t.tensor, s.a.tensor, s.sa.tensor, s.amax_a.tensor);
    be.fp8_cast(s.b8.tensor, {}, s.b.tensor, s.sb.tensor, s.amax_b.tensor);
    const std::vector<float> inv_a{1.0f / a_scale[0]}, inv_b{1.0f / b_scale[0]};
    const pope::OwnedTensor ia = make_tensor(be, {1}, DType::f32, inv_a), ib = make_tensor(be, {1}, DType::f32, inv_b);
    be.fp8_matmul(s.out.tensor, s.a8.tensor, ia.tensor, s.b8.tensor, ib.tensor, 1.0, false);
    // The residual add of the forward: a bf16 (activation dtype) out from an addend.
    be.fp8_matmul(s.added.tensor, s.a8.tensor, ia.tensor, s.b8.tensor, ib.tensor, 1.0, true, s.addend.tensor);
    be.synchronize();
    return s;
  };
  const Side g = side(*gpu_, DType::bf16), c = side(*cpu_, DType::f32);
  auto bytes = [](pope::Backend& be, const pope::OwnedTensor& t) {
    std::vector<std::uint8_t> out(std::size_t(t.tensor.numel()));
    be.copy_to_host(out.data(), t.tensor);
    return out;
  };
  EXPECT_EQ(bytes(*gpu_, g.a8), bytes(*cpu_, c.a8));
  EXPECT_EQ(bytes(*gpu_, g.a8_t), bytes(*cpu_, c.a8_t));
  EXPECT_EQ(bytes(*gpu_, g.b8), bytes(*cpu_, c.b8));
  EXPECT_EQ(pope::test::download(*gpu_, g.amax_a.tensor), pope::test::download(*cpu_, c.amax_a.tensor));
  EXPECT_EQ(pope::test::download(*gpu_, g.amax_b.tensor), pope::test::download(*cpu_, c.amax_b.tensor));
  EXPECT_LT(pope::test::relative_error(pope::test::download(*gpu_, g.out.tensor), pope::test::download(*cpu_, c.out.tensor)),
            1e-3);
  EXPECT_LT(
      pope::test::relative_error(pope::test::download(*gpu_, g.added.tensor), pope::test::download(*cpu_, c.added.tensor)),
      5e-3);  // bf16 output, fast accumulation

  // The scale update, with a history of 2, over amax values finite and not.
  const std::vector<float> amax{3.0f, std::nanf(""), 0.0f, 1e-30f}, history(8, 0.5f), ones(4 * pope::kFp8FactorRow, 1.0f);
  auto update = [&](pope::Backend& be) {
    const pope::OwnedTensor am = make_tensor(be, {4}, DType::f32, amax), h = make_tensor(be, {4, 2}, DType::f32, history),
                            s = make_tensor(be, {4}, DType::f32, std::vector<float>(4, 1.0f)),
                            si = make_tensor(be, {4, pope::kFp8FactorRow}, DType::f32, ones);
    be.fp8_update_scales(am.tensor, h.tensor, s.tensor, si.tensor, DType::e5m2, 0);
    be.synchronize();
    std::vector<double> all = pope::test::download(be, s.tensor);
    for (const pope::OwnedTensor* t : {&si, &h, &am})
      for (double v : pope::test::download(be, t->tensor)) all.push_back(v);
    return all;
  };
  EXPECT_EQ(update(*gpu_), update(*cpu_));
}

}  // namespace
