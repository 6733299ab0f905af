// RMSNorm over the last dimension: y = x · rstd · gain with rstd = 1/sqrt(mean(x²) + eps).
// Statistics are computed in Real. Backward, with x̂ = x · rstd and g = dy · gain:
//   dx    += rstd · (g − x̂ · mean(g · x̂))
//   dgain += Σ_rows dy · x̂     (column-parallel so each gain entry sums rows in order)
#include <cmath>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"

namespace pope::cpu {

template <class Real> void rmsnorm_forward(int threads, Tensor out, Tensor rstd, Tensor x, Tensor gain, double eps) {
  constexpr std::string_view op = "rmsnorm_forward";
  constexpr DType real = dtype_of<Real>();
  require(!x.shape.empty(), op, "x has no dimensions, expected [rows, channels]");
  const std::int64_t width = x.shape.back(), rows = width == 0 ? 0 : x.numel() / width;
  check_matrix(op, "x", x, real, rows, width);
  check_vector(op, "gain", gain, real, width);
  check_matrix(op, "out", out, real, rows, width);
  check_vector(op, "rstd", rstd, real, rows);
  require(eps >= 0.0, op, "eps must be >= 0");

  const Real *xs = x.as<Real>(), *g = gain.as<Real>();
  Real *y = out.as<Real>(), *r = rstd.as<Real>();
  parallel_for(threads, rows, [&](std::int64_t n) {
    const Real* row = xs + n * width;
    Real sum_squares = 0;
    for (std::int64_t c = 0; c < width; ++c) sum_squares += row[c] * row[c];
    const Real inv_rms = Real(1) / std::sqrt(sum_squares / Real(width) + Real(eps));
    r[n] = inv_rms;
    for (std::int64_t c = 0; c < width; ++c) y[n * width + c] = row[c] * inv_rms * g[c];
  });
}

template <class Real>
void rmsnorm_backward(int threads, Tensor dx, Tensor dgain, Tensor dout, Tensor x, Tensor gain, Tensor rstd) {
  constexpr std::string_view op = "rmsnorm_backward";
  constexpr DType real = dtype_of<Real>();
  require(!x.shape.empty(), op, "x has no dimensions, expected [rows, channels]");
  const std::int64_t width = x.shape.back(), rows = width == 0 ? 0 : x.numel() / width;
  check_matrix(op, "x", x, real, rows, width);
  check_matrix(op, "dout", dout, real, rows, width);
  check_matrix(op, "dx", dx, real, rows, width);
  check_vector(op, "gain", gain, real, width);
  check_vector(op, "dgain", dgain, real, width);
  check_vector(op, "rstd", rstd, real, rows);

  const Real *xs = x.as<Real>(), *dy = dout.as<Real>(), *g = gain.as<Real>(), *r = rstd.as<Real>();
  Real *dxs = dx.as<Real>(), *dg = dgain.as<Real>();
  parallel_for(threads, rows, [&](std::int64_t n) {
    const Real *row = xs + n * width, *drow = dy + n * width;
    Real mean_gx = 0;  // mean over channels of (dy · gain) · x̂
    for (std::int64_t c = 0; c < width; ++c) mean_gx += drow[c] * g[c] * row[c] * r[n];
    mean_gx /= Real(width);
    for (std::int64_t c = 0; c < width; ++c)
      dxs[n * width + c] += r[n] * (drow[c] * g[c] - row[c] * r[n] * mean_gx);
  });
  parallel_for(threads, column_block_count(width), [&](std::int64_t block_index) {
    const ColumnBlock block = column_block(block_index, width);
    for (std::int64_t n = 0; n < rows; ++n)
      for (std::int64_t c = block.begin; c < block.end; ++c) dg[c] += dy[n * width + c] * xs[n * width + c] * r[n];
  });
}

template void rmsnorm_forward<float>(int, Tensor, Tensor, Tensor, Tensor, double);
template void rmsnorm_forward<double>(int, Tensor, Tensor, Tensor, Tensor, double);
template void rmsnorm_backward<float>(int, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor);
template void rmsnorm_backward<double>(int, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor);

}  // namespace pope::cpu
