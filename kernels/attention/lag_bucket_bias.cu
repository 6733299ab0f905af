// Table and gradient of a lag-bucket score bias (lag_bucket_bias.cuh). Both are O(H·T) per
// layer and call, beside the O(H·T²·d) attention they serve.
#include "attention/lag_bucket_bias.cuh"

#include "block_reduce.cuh"
#include "grid.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 256;

__global__ void table_kernel(LagBucketParams params, int seq_len, float* table) {
  const long total = long(params.n_head) * seq_len;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total; i += long(gridDim.x) * blockDim.x) {
    const int h = int(i / seq_len), lag = int(i - long(h) * seq_len);
    table[i] = params.weights[long(h) * params.buckets + params.bucket_of_lag[lag]];
  }
}

// Block (b, h): its bucket's lags strided over the threads, then one block reduction; the last
// bucket sums the lags below it instead and takes the negative.
__global__ void backward_kernel(LagBucketParams params, int seq_len, int last_bucket, const float* diag_grad,
                                float* weight_grad) {
  __shared__ float shared[kWarpSize];
  const int b = blockIdx.x, h = blockIdx.y;
  if (b > last_bucket) return;  // no lag of this call falls in it
  const bool tail = b == last_bucket;
  const int first = tail ? 0 : params.bucket_starts[b], last = params.bucket_starts[tail ? b : b + 1];
  const float* row = diag_grad + long(h) * seq_len;
  float sum = 0.0f;
  for (int lag = first + int(threadIdx.x); lag < last; lag += blockDim.x) sum += row[lag];
  sum = block_reduce(sum, shared, SumOp{}, 0.0f);
  if (threadIdx.x == 0) weight_grad[long(h) * params.buckets + b] += tail ? -sum : sum;
}

bool valid(const LagBucketParams& params, int seq_len) {
  return params.n_head > 0 && params.buckets > 0 && seq_len > 0 && params.n_head <= 65535 &&
         params.bucket_of_lag != nullptr && params.bucket_starts != nullptr && params.weights != nullptr;
}

}  // namespace

cudaError_t lag_bucket_bias_table(const LagBucketParams& params, int seq_len, float* table, cudaStream_t stream) {
  if (!valid(params, seq_len) || table == nullptr) return cudaErrorInvalidValue;
  const std::size_t total = std::size_t(params.n_head) * std::size_t(seq_len);
  table_kernel<<<grid_stride_blocks(total, kThreads), kThreads, 0, stream>>>(params, seq_len, table);
  return cudaGetLastError();
}

int lag_bucket_gradient_lags(const int* host_bucket_starts, int buckets, int last_bucket) {
  if (last_bucket < 0 || last_bucket >= buckets) return 1;
  const int start = host_bucket_starts[last_bucket];
  return start > 1 ? start : 1;
}

cudaError_t lag_bucket_bias_backward(const LagBucketParams& params, int seq_len, int last_bucket,
                                     const float* diag_grad, float* weight_grad, cudaStream_t stream) {
  if (!valid(params, seq_len) || diag_grad == nullptr || weight_grad == nullptr || last_bucket < 0 ||
      last_bucket >= params.buckets)
    return cudaErrorInvalidValue;
  backward_kernel<<<dim3(unsigned(params.buckets), unsigned(params.n_head)), kThreads, 0, stream>>>(
      params, seq_len, last_bucket, diag_grad, weight_grad);
  return cudaGetLastError();
}

}  // namespace pope::kernels
