// The FP8 ops on the host, exactly (Backend::fp8_cast, fp8_update_scales, fp8_matmul): the
// reference the CUDA backend's are tested against. The cast multiplies in f32 as the GPU does,
// so both round the same f32 value; products accumulate in Real.
#include <cmath>
#include <vector>

#include "cpu/cpu_gelu.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"
#include "model/fp8.hpp"
#include "model/fp8_checks.hpp"

namespace pope::cpu {

namespace {

// max |x| ordered as the GPU's atomicMax on bit patterns: NaN above +inf above every finite value.
float fold_amax(float running, float value) {
  if (std::isnan(running) || std::isnan(value)) return std::nanf("");
  return std::fmax(running, std::fabs(value));
}

}  // namespace

template <class Real>
void fp8_cast(int threads, Tensor out, Tensor out_t, Tensor x, Tensor scale, Tensor amax, Backend::Fp8Prologue prologue,
              Tensor pre) {
  using Prologue = Backend::Fp8Prologue;
  const checks::Fp8CastShape shape = checks::check_fp8_cast(DeviceKind::cpu, out, out_t, x, dtype_of<Real>(), scale,
                                                            amax, pre, prologue == Prologue::gelu_backward);
  const std::int64_t R = shape.rows, C = shape.cols;
  const DType format = shape.format;
  const float s = *scale.as<float>();
  // The prologue's values, as gelu_forward / gelu_backward would store them.
  std::vector<Real> values;
  const Real* xs = x.as<Real>();
  if (prologue != Prologue::none) {
    values.resize(std::size_t(R * C));
    const Real* pres = prologue == Prologue::gelu_backward ? pre.as<Real>() : nullptr;
    parallel_for(threads, R * C, [&](std::int64_t i) {
      values[std::size_t(i)] = prologue == Prologue::gelu ? gelu(xs[i]) : xs[i] * gelu_derivative(pres[i]);
    });
    xs = values.data();
  }
  auto* q = static_cast<std::uint8_t*>(out.data);
  auto* q_t = static_cast<std::uint8_t*>(out_t.data);
  parallel_for(threads, R, [&](std::int64_t r) {
    for (std::int64_t c = 0; c < C; ++c) {
      const std::uint8_t bits = float_to_fp8(float(xs[r * C + c]) * s, format);
      if (q) q[r * C + c] = bits;
      if (q_t) q_t[c * R + r] = bits;
    }
  });
  float& m = *amax.as<float>();
  for (std::int64_t i = 0; i < R * C; ++i) m = fold_amax(m, float(xs[i]));
}

void fp8_update_scales(Tensor amax, Tensor history, Tensor scale, Tensor scale_inv, DType format, int margin) {
  const std::int64_t k = checks::check_fp8_update(DeviceKind::cpu, amax, history, scale, scale_inv, format);
  const std::int64_t length = history.dim(1);
  const float top = fp8_max_value(format), factor = std::ldexp(1.0f, -margin);
  for (std::int64_t i = 0; i < k; ++i) {
    float& a = amax.as<float>()[i];
    const float value = a;
    a = 0.0f;
    if (!std::isfinite(value)) continue;
    float* h = history.as<float>() + i * length;
    float m = value;
    for (std::int64_t j = length - 1; j > 0; --j) {
      h[j] = h[j - 1];
      m = std::fmax(m, h[j]);
    }
    h[0] = value;
    const float s = top / m * factor;
    if (m > 0.0f && std::isfinite(s)) {
      scale.as<float>()[i] = s;
      scale_inv.as<float>()[i * kFp8FactorRow] = 1.0f / s;
    }
  }
}

template <class Real>
void fp8_matmul(int threads, Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, double beta,
                Tensor addend) {
  const checks::Fp8MatmulShape shape =
      checks::check_fp8_matmul(DeviceKind::cpu, out, a, a_scale_inv, b, b_scale_inv, dtype_of<Real>(), addend);
  const Tensor c = addend.empty() ? out : addend;
  const std::int64_t M = shape.m, N = shape.n, K = shape.k;
  const Real factor = Real(*a_scale_inv.as<float>()) * Real(*b_scale_inv.as<float>());
  const auto* qa = static_cast<const std::uint8_t*>(a.data);
  const auto* qb = static_cast<const std::uint8_t*>(b.data);
  parallel_for(threads, M, [&](std::int64_t i) {
    std::vector<Real> row(static_cast<std::size_t>(K));
    for (std::int64_t k = 0; k < K; ++k) row[std::size_t(k)] = Real(fp8_to_float(qa[i * K + k], a.dtype));
    for (std::int64_t j = 0; j < N; ++j) {
      Real sum = 0;
      for (std::int64_t k = 0; k < K; ++k) sum += row[std::size_t(k)] * Real(fp8_to_float(qb[j * K + k], b.dtype));
      const Real value = sum * factor;
      if (out.dtype == DType::f32) {
        const Real prior = beta != 0.0 ? Real(beta) * Real(c.as<float>()[i * N + j]) : Real(0);
        out.as<float>()[i * N + j] = float(value + prior);
      } else {
        const Real prior = beta != 0.0 ? Real(beta) * c.as<Real>()[i * N + j] : Real(0);
        out.as<Real>()[i * N + j] = value + prior;
      }
    }
  });
}

template void fp8_cast<float>(int, Tensor, Tensor, Tensor, Tensor, Tensor, Backend::Fp8Prologue, Tensor);
template void fp8_cast<double>(int, Tensor, Tensor, Tensor, Tensor, Tensor, Backend::Fp8Prologue, Tensor);
template void fp8_matmul<float>(int, Tensor, Tensor, Tensor, Tensor, Tensor, double, Tensor);
template void fp8_matmul<double>(int, Tensor, Tensor, Tensor, Tensor, Tensor, double, Tensor);

}  // namespace pope::cpu
