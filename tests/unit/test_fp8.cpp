// FP8 on the host: the e4m3 / e5m2 conversions (every code decodes and encodes back, rounding to
// nearest even in normals and subnormals, saturation, NaN) and the CPU backend's FP8 ops, the
// reference of the GPU's: casts and their amax, the delayed-scaling update, the products, and
// errors naming the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "model/fp8.hpp"
#include "pope/backend.hpp"

namespace {

using namespace pope;

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Fp8Format, EveryCodeDecodesAndEncodesBack) {
  for (DType format : {DType::e4m3, DType::e5m2})
    for (int code = 0; code < 256; ++code) {
      const float value = fp8_to_float(std::uint8_t(code), format);
      if (std::isnan(value)) {
        EXPECT_EQ(float_to_fp8(value, format), 0x7F) << dtype_name(format) << " code " << code;
      } else if (std::isinf(value)) {
        EXPECT_EQ(format, DType::e5m2);
        EXPECT_EQ(float_to_fp8(value, format), value > 0 ? 0x7B : 0xFB);  // saturates to ±max
      } else if (code != 0x80) {  // −0 encodes as 0x80 too, but compares equal to +0
        EXPECT_EQ(float_to_fp8(value, format), code) << dtype_name(format) << " value " << value;
      }
    }
  EXPECT_EQ(fp8_max_value(DType::e4m3), 448.0f);
  EXPECT_EQ(fp8_max_value(DType::e5m2), 57344.0f);
  EXPECT_TRUE(std::isnan(fp8_to_float(0x7F, DType::e4m3)));
  EXPECT_TRUE(std::isnan(fp8_to_float(0xFF, DType::e4m3)));
  EXPECT_EQ(fp8_to_float(0x7C, DType::e5m2), kInf);
  EXPECT_THROW(fp8_max_value(DType::bf16), std::invalid_argument);
}

TEST(Fp8Format, RoundsToNearestEvenAndSaturates) {
  const DType e4 = DType::e4m3, e5 = DType::e5m2;
  EXPECT_EQ(float_to_fp8(1.0625f, e4), float_to_fp8(1.0f, e4));    // halfway 1 | 1.125: even mantissa (1)
  EXPECT_EQ(float_to_fp8(1.1875f, e4), float_to_fp8(1.25f, e4));   // halfway 1.125 | 1.25: 1.25
  EXPECT_EQ(float_to_fp8(1.07f, e4), float_to_fp8(1.125f, e4));    // past halfway: up
  EXPECT_EQ(float_to_fp8(std::ldexp(1.0f, -9), e4), 0x01);         // the smallest subnormal
  EXPECT_EQ(float_to_fp8(std::ldexp(1.0f, -10), e4), 0x00);        // halfway 0 | 2^-9: 0
  EXPECT_EQ(float_to_fp8(std::ldexp(3.0f, -10), e4), 0x02);        // halfway 2^-9 | 2^-8: 2^-8
  EXPECT_EQ(float_to_fp8(std::ldexp(15.5f, -10), e4), 0x08);       // rounds up into the smallest normal, 2^-6
  EXPECT_EQ(fp8_to_float(0x08, e4), std::ldexp(1.0f, -6));
  EXPECT_EQ(float_to_fp8(464.0f, e4), 0x7E);                       // halfway 448 | 480 (not e4m3): 448
  EXPECT_EQ(float_to_fp8(1e9f, e4), 0x7E);
  EXPECT_EQ(float_to_fp8(-1e9f, e4), 0xFE);
  EXPECT_EQ(float_to_fp8(-kInf, e4), 0xFE);
  EXPECT_EQ(float_to_fp8(kInf, e5), 0x7B);
  EXPECT_EQ(float_to_fp8(-0.0f, e5), 0x80);
  EXPECT_EQ(float_to_fp8(std::nanf(""), e5), 0x7F);
  EXPECT_EQ(fp8_to_float(float_to_fp8(3.0f, e5), e5), 3.0f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(2.6f, e5), e5), 2.5f);  // e5m2 steps 0.5 in [2, 4)
}

class CpuFp8 : public ::testing::Test {
 protected:
  void SetUp() override { be_ = make_cpu_backend("double", 1); }
  OwnedTensor tensor(Shape shape, DType dtype, const std::vector<double>& values = {}) {
    OwnedTensor t = allocate_tensor(*be_, std::move(shape), dtype);
    if (!values.empty()) {
      if (dtype == DType::f64) be_->copy_from_host(t.tensor, values.data());
      if (dtype == DType::f32) {
        const std::vector<float> f(values.begin(), values.end());
        be_->copy_from_host(t.tensor, f.data());
      }
    }
    return t;
  }
  std::vector<float> floats(const OwnedTensor& t) {
    std::vector<float> out(std::size_t(t.tensor.numel()));
    be_->copy_to_host(out.data(), t.tensor);
    return out;
  }
  std::vector<std::uint8_t> bytes(const OwnedTensor& t) {
    std::vector<std::uint8_t> out(std::size_t(t.tensor.numel()));
    be_->copy_to_host(out.data(), t.tensor);
    return out;
  }
  std::unique_ptr<Backend> be_;
};

TEST_F(CpuFp8, CastWritesBothLayoutsAndFoldsTheAmax) {
  const std::vector<double> x{1.0, -2.0, 0.3, 500.0, -0.001, 7.0};  // [2, 3]
  const OwnedTensor xs = tensor({2, 3}, DType::f64, x), out = tensor({2, 3}, DType::e4m3),
                    out_t = tensor({3, 2}, DType::e4m3), scale = tensor({1}, DType::f32, {2.0}),
                    amax = tensor({1}, DType::f32, {600.0});
  be_->fp8_cast(out.tensor, out_t.tensor, xs.tensor, scale.tensor, amax.tensor);
  const std::vector<std::uint8_t> q = bytes(out), q_t = bytes(out_t);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(q[r * 3 + c], float_to_fp8(float(x[r * 3 + c]) * 2.0f, DType::e4m3));
      EXPECT_EQ(q_t[c * 2 + r], q[r * 3 + c]);
    }
  EXPECT_EQ(fp8_to_float(q[3], DType::e4m3), 448.0f);  // 1000 saturates
  EXPECT_EQ(floats(amax)[0], 600.0f);                   // the running amax was larger
  const OwnedTensor fresh = tensor({1}, DType::f32, {0.0});
  be_->fp8_cast(out.tensor, {}, xs.tensor, scale.tensor, fresh.tensor);
  EXPECT_EQ(floats(fresh)[0], 500.0f);
  const OwnedTensor bad = tensor({2, 3}, DType::f64, {1.0, kInf, 0.0, std::nan(""), 0.0, 0.0});
  be_->fp8_cast(out.tensor, {}, bad.tensor, scale.tensor, fresh.tensor);
  EXPECT_TRUE(std::isnan(floats(fresh)[0]));
}

// The prologues equal the unfused ops: gelu_forward (or gelu_backward) into a tensor, then the cast,
// byte for byte and in the amax; a gelu_backward cast without pre, or pre for another prologue, is
// refused.
TEST_F(CpuFp8, CastProloguesEqualTheGeluOpsThenTheCast) {
  using Prologue = Backend::Fp8Prologue;
  const std::vector<double> x{1.5, -2.0, 0.3, 4.0, -0.7, 3.0}, pre{0.2, -1.0, 2.5, -0.1, 0.8, -3.0};
  const OwnedTensor xs = tensor({2, 3}, DType::f64, x), pres = tensor({2, 3}, DType::f64, pre),
                    scale = tensor({1}, DType::f32, {50.0}), staged = tensor({2, 3}, DType::f64);
  auto cast = [&](Tensor input, Prologue prologue, Tensor with) {
    const OwnedTensor out = tensor({2, 3}, DType::e4m3), out_t = tensor({3, 2}, DType::e4m3),
                      amax = tensor({1}, DType::f32, {0.0});
    be_->fp8_cast(out.tensor, out_t.tensor, input, scale.tensor, amax.tensor, prologue, with);
    std::vector<std::uint8_t> all = bytes(out);
    for (std::uint8_t q : bytes(out_t)) all.push_back(q);
    return std::make_pair(all, floats(amax)[0]);
  };
  be_->gelu_forward(staged.tensor, xs.tensor);
  EXPECT_EQ(cast(xs.tensor, Prologue::gelu, {}), cast(staged.tensor, Prologue::none, {}));
  be_->gelu_backward(staged.tensor, xs.tensor, pres.tensor);
  EXPECT_EQ(cast(xs.tensor, Prologue::gelu_backward, pres.tensor), cast(staged.tensor, Prologue::none, {}));
  EXPECT_NE(cast(xs.tensor, Prologue::gelu, {}), cast(xs.tensor, Prologue::none, {}));

  const OwnedTensor out = tensor({2, 3}, DType::e4m3), amax = tensor({1}, DType::f32, {0.0});
  EXPECT_THROW(be_->fp8_cast(out.tensor, {}, xs.tensor, scale.tensor, amax.tensor, Prologue::gelu_backward, {}),
               std::invalid_argument);
  EXPECT_THROW(be_->fp8_cast(out.tensor, {}, xs.tensor, scale.tensor, amax.tensor, Prologue::gelu, pres.tensor),
               std::invalid_argument);
}

TEST_F(CpuFp8, DelayedScalingFollowsTheHistoryAndSkipsNonFiniteAmax) {
  const OwnedTensor amax = tensor({2}, DType::f32), history = tensor({2, 3}, DType::f32, {0, 0, 0, 0, 0, 0}),
                    scale = tensor({2}, DType::f32, {1.0, 1.0}),
                    scale_inv = tensor({2, kFp8FactorRow}, DType::f32, std::vector<double>(2 * kFp8FactorRow, 1.0));
  auto step = [&](double a0, double a1) {
    const std::vector<float> values{float(a0), float(a1)};
    be_->copy_from_host(amax.tensor, values.data());
    be_->fp8_update_scales(amax.tensor, history.tensor, scale.tensor, scale_inv.tensor, DType::e4m3, 1);
    return floats(scale);
  };
  const float top = 224.0f;  // 448 / 2^1
  EXPECT_EQ(step(4.0, 0.0), (std::vector<float>{top / 4, 1.0f}));
  EXPECT_EQ(step(2.0, std::nan("")), (std::vector<float>{top / 4, 1.0f}));
  EXPECT_EQ(step(1.0, kInf), (std::vector<float>{top / 4, 1.0f}));
  EXPECT_EQ(step(1.0, 8.0), (std::vector<float>{top / 2, top / 8}));
  EXPECT_EQ(floats(scale_inv), (std::vector<float>{2.0f / top, 1, 1, 1, 8.0f / top, 1, 1, 1}));  // column 0 only
  EXPECT_EQ(floats(amax), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(floats(history), (std::vector<float>{1, 1, 2, 8, 0, 0}));
}

TEST_F(CpuFp8, ProductIsTheExactProductOfTheDequantisedOperands) {
  std::mt19937 engine(3);
  std::normal_distribution<double> normal;
  const int M = 5, N = 4, K = 7;
  std::vector<double> a(M * K), b(N * K), prior(M * N);
  for (double& v : a) v = normal(engine);
  for (double& v : b) v = normal(engine);
  for (double& v : prior) v = normal(engine);
  const OwnedTensor at = tensor({M, K}, DType::f64, a), bt = tensor({N, K}, DType::f64, b),
                    a8 = tensor({M, K}, DType::e5m2), b8 = tensor({N, K}, DType::e4m3),
                    sa = tensor({1}, DType::f32, {16.0}), sb = tensor({1}, DType::f32, {32.0}),
                    sa_inv = tensor({1}, DType::f32, {1.0 / 16}), sb_inv = tensor({1}, DType::f32, {1.0 / 32}),
                    amax = tensor({1}, DType::f32, {0.0}), out = tensor({M, N}, DType::f64, prior);
  be_->fp8_cast(a8.tensor, {}, at.tensor, sa.tensor, amax.tensor);
  be_->fp8_cast(b8.tensor, {}, bt.tensor, sb.tensor, amax.tensor);
  be_->fp8_matmul(out.tensor, a8.tensor, sa_inv.tensor, b8.tensor, sb_inv.tensor, 1.0, false);
  // The same sum with the prior read from an addend: out's own values are not read.
  const OwnedTensor addend = tensor({M, N}, DType::f64, prior),
                    fresh = tensor({M, N}, DType::f64, std::vector<double>(M * N, 1e6));
  be_->fp8_matmul(fresh.tensor, a8.tensor, sa_inv.tensor, b8.tensor, sb_inv.tensor, 1.0, false, addend.tensor);
  std::vector<double> got(M * N), got_addend(M * N);
  be_->copy_to_host(got.data(), out.tensor);
  be_->copy_to_host(got_addend.data(), fresh.tensor);
  const std::vector<std::uint8_t> qa = bytes(a8), qb = bytes(b8);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double want = 0;
      for (int k = 0; k < K; ++k)
        want += double(fp8_to_float(qa[i * K + k], DType::e5m2)) * fp8_to_float(qb[j * K + k], DType::e4m3);
      EXPECT_NEAR(got[i * N + j], want / 512 + prior[i * N + j], 1e-12);
      EXPECT_EQ(got_addend[i * N + j], got[i * N + j]);
    }
}

TEST_F(CpuFp8, BadArgumentsAreNamed) {
  const OwnedTensor x = tensor({2, 3}, DType::f64, {1, 2, 3, 4, 5, 6}), q = tensor({2, 3}, DType::e4m3),
                    q_wrong = tensor({2, 3}, DType::e4m3), e5 = tensor({2, 3}, DType::e5m2),
                    one = tensor({1}, DType::f32, {1.0}), out = tensor({2, 2}, DType::f64);
  auto message_of = [](auto&& call) {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of([&] { be_->fp8_cast({}, {}, x.tensor, one.tensor, one.tensor); }).find("expected out, out_t"),
            std::string::npos);
  EXPECT_NE(message_of([&] { be_->fp8_cast(q.tensor, q_wrong.tensor, x.tensor, one.tensor, one.tensor); }).find("out_t"),
            std::string::npos);
  EXPECT_NE(message_of([&] { be_->fp8_cast(x.tensor, {}, x.tensor, one.tensor, one.tensor); }).find("expected e4m3 or e5m2"),
            std::string::npos);
  EXPECT_NE(message_of([&] { be_->fp8_matmul(out.tensor, e5.tensor, one.tensor, e5.tensor, one.tensor, 0, false); })
                .find("both e5m2"),
            std::string::npos);
  EXPECT_NE(message_of([&] { be_->fp8_matmul(x.tensor, q.tensor, one.tensor, e5.tensor, one.tensor, 0, false); })
                .find("out"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              be_->fp8_update_scales(one.tensor, x.tensor, one.tensor, one.tensor, DType::bf16, 0);
            }).find("format"),
            std::string::npos);
  EXPECT_FALSE(be_->has_fp8_tensor_cores());
}

}  // namespace
