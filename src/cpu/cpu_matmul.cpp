// out = alpha · op(a) · op(b) + beta · out through OpenBLAS's row-major GEMM. OpenBLAS
// splits the work over output rows and columns, never over the inner dimension, so the
// result does not depend on its thread count.
#include <cblas.h>
#include <fmt/format.h>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"

namespace pope::cpu {

namespace {

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const float* a, int lda,
          const float* b, int ldb, double beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(alpha), a, lda, b, ldb, static_cast<float>(beta), c,
              ldc);
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* a, int lda,
          const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

template <class Real>
void matmul(int threads, Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b, double alpha,
            double beta) {
  constexpr std::string_view op = "matmul";
  constexpr DType real = dtype_of<Real>();
  check_2d(op, "a", a, real);
  check_2d(op, "b", b, real);
  check_2d(op, "out", out, real);
  const std::int64_t m = a.dim(transpose_a ? 1 : 0), k = a.dim(transpose_a ? 0 : 1);
  const std::int64_t k_b = b.dim(transpose_b ? 1 : 0), n = b.dim(transpose_b ? 0 : 1);
  require(k == k_b && out.dim(0) == m && out.dim(1) == n, op,
          fmt::format("op(a) is [{}, {}] (a {}{}), op(b) is [{}, {}] (b {}{}), out {}; expected [M, K]·[K, N] = [M, N]",
                      m, k, shape_string(a.shape), transpose_a ? "ᵀ" : "", k_b, n, shape_string(b.shape),
                      transpose_b ? "ᵀ" : "", shape_string(out.shape)));
  if (m == 0 || n == 0) return;

  openblas_set_num_threads(threads);
  // Leading dimensions are the stored row lengths; an empty inner dimension still needs
  // a leading dimension of at least 1.
  const int lda = static_cast<int>(std::max<std::int64_t>(1, a.dim(1)));
  const int ldb = static_cast<int>(std::max<std::int64_t>(1, b.dim(1)));
  gemm(transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
       static_cast<int>(n), static_cast<int>(k), alpha, a.as<Real>(), lda, b.as<Real>(), ldb, beta, out.as<Real>(),
       static_cast<int>(n));
}

template void matmul<float>(int, Tensor, Tensor, Tensor, bool, bool, double, double);
template void matmul<double>(int, Tensor, Tensor, Tensor, bool, bool, double, double);

}  // namespace pope::cpu
