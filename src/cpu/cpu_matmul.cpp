// out = alpha · op(a) · op(b) + beta · out through OpenBLAS's row-major GEMM. OpenBLAS's
// own threading changes how it splits the work and with it the rounding (seen in the
// thread-independence test), so OpenBLAS runs single-threaded and the output rows are cut
// into fixed blocks that our threads share: each block is one GEMM call whose result does
// not depend on how many threads there are.
#include <cblas.h>
#include <fmt/format.h>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"

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

// Output rows per GEMM call: large enough for OpenBLAS's kernels to run at speed.
constexpr std::int64_t kRowBlock = 64;

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

  openblas_set_num_threads(1);
  // Leading dimensions are the stored row lengths; an empty inner dimension still needs
  // a leading dimension of at least 1.
  const int lda = static_cast<int>(std::max<std::int64_t>(1, a.dim(1)));
  const int ldb = static_cast<int>(std::max<std::int64_t>(1, b.dim(1)));
  const CBLAS_TRANSPOSE trans_a = transpose_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE trans_b = transpose_b ? CblasTrans : CblasNoTrans;
  const Real *a_data = a.as<Real>(), *b_data = b.as<Real>();
  Real* out_data = out.as<Real>();
  const std::int64_t blocks = (m + kRowBlock - 1) / kRowBlock;
  parallel_for(threads, blocks, [&](std::int64_t block) {
    const std::int64_t first = block * kRowBlock, count = std::min(kRowBlock, m - first);
    // Row i of op(a) is row i of a, or column i of a when transposed.
    const Real* a_rows = a_data + (transpose_a ? first : first * lda);
    gemm(trans_a, trans_b, static_cast<int>(count), static_cast<int>(n), static_cast<int>(k), alpha, a_rows, lda, b_data,
         ldb, beta, out_data + first * n, static_cast<int>(n));
  });
}

template void matmul<float>(int, Tensor, Tensor, Tensor, bool, bool, double, double);
template void matmul<double>(int, Tensor, Tensor, Tensor, bool, bool, double, double);

}  // namespace pope::cpu
