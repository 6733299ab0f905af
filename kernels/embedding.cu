// Forward: a gather, one thread per 16-byte group of an output row (per element when rows
// are not 16-byte aligned).
//
// Backward without float atomics, whose summation order would vary from run to run:
//   1. sort (token, position) pairs by token with CUB's stable radix sort, so each token's
//      positions form one run, in increasing position order;
//   2. one block per sorted entry; only the first entry of a run works: its threads take
//      columns (16-byte groups of them where aligned), sum the run's dout rows in order in
//      fp32 and add the sums into dtable.
// Each table row is then written by exactly one block, and the order of every sum is fixed.
// Frequent tokens make long runs, but a run costs one coalesced row read per occurrence.
#include <cub/device/device_radix_sort.cuh>

#include "bf16_group.cuh"
#include "embedding.cuh"

namespace pope::kernels {

namespace {

// Copies whole rows in groups of kWidth bf16 values.
template <int kWidth>
__global__ void embedding_forward_kernel(__nv_bfloat16* out, const int* tokens, const __nv_bfloat16* table, int rows,
                                         int width, int vocab_rows, DeviceErrorRecord* error) {
  const int groups_per_row = width / kWidth;
  const std::size_t count = std::size_t(rows) * groups_per_row;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t row = i / groups_per_row, group = i % groups_per_row;
    const int token = tokens[row];
    Bf16Group<kWidth> values;
    if (token >= 0 && token < vocab_rows) {
      values = load_group<kWidth>(table + std::size_t(token) * width, group);
    } else {
      if (group == 0) report_device_error(error, kEmbeddingForwardToken, row, token, vocab_rows);
      for (int k = 0; k < kWidth; ++k) values.set(k, NAN);
    }
    store_group(out, i, values);
  }
}

__global__ void iota_kernel(int* values, int count) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) values[i] = i;
}

template <int kWidth>
__global__ void accumulate_token_runs_kernel(float* dtable, const __nv_bfloat16* dout, const int* sorted_tokens,
                                             const int* sorted_positions, int rows, int width, int vocab_rows,
                                             DeviceErrorRecord* error) {
  const int first = blockIdx.x;
  const int token = sorted_tokens[first];
  if (first > 0 && sorted_tokens[first - 1] == token) return;  // not the head of a run
  if (token < 0 || token >= vocab_rows) {
    if (threadIdx.x == 0)
      report_device_error(error, kEmbeddingBackwardToken, sorted_positions[first], token, vocab_rows);
    return;
  }
  const int groups = width / kWidth;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float sum[kWidth] = {};
    for (int entry = first; entry < rows && sorted_tokens[entry] == token; ++entry) {
      const Bf16Group<kWidth> values = load_group<kWidth>(dout + std::size_t(sorted_positions[entry]) * width, g);
      for (int k = 0; k < kWidth; ++k) sum[k] += values.get(k);
    }
    float* table_row = dtable + std::size_t(token) * width + g * kWidth;
    for (int k = 0; k < kWidth; ++k) table_row[k] += sum[k];
  }
}

// Scratch layout: positions, sorted tokens, sorted positions (rows ints each), then CUB's
// temporary storage; every part starts on a 256-byte boundary.
struct BackwardScratch {
  int* positions;
  int* sorted_tokens;
  int* sorted_positions;
  void* sort_storage;
  std::size_t sort_bytes;
};

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

cudaError_t sort_storage_bytes(int rows, std::size_t* bytes) {
  *bytes = 0;
  return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, static_cast<const int*>(nullptr),
                                         static_cast<int*>(nullptr), static_cast<const int*>(nullptr),
                                         static_cast<int*>(nullptr), rows);
}

std::size_t scratch_total(int rows, std::size_t sort_bytes) {
  return 3 * round_up(sizeof(int) * std::size_t(rows)) + round_up(sort_bytes);
}

BackwardScratch carve(void* scratch, int rows, std::size_t sort_bytes) {
  auto* base = static_cast<char*>(scratch);
  const std::size_t ints = round_up(sizeof(int) * std::size_t(rows));
  return {reinterpret_cast<int*>(base), reinterpret_cast<int*>(base + ints), reinterpret_cast<int*>(base + 2 * ints),
          base + 3 * ints, sort_bytes};
}

}  // namespace

cudaError_t embedding_forward(__nv_bfloat16* out, const int* tokens, const __nv_bfloat16* table, int rows,
                              int width, int vocab_rows, DeviceErrorRecord* error, cudaStream_t stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  return launch_with_group_width(width, {out, table}, [&](auto group) {
    constexpr int kThreads = 256;
    const std::size_t count = std::size_t(rows) * (width / decltype(group)::value);
    embedding_forward_kernel<decltype(group)::value><<<grid_stride_blocks(count, kThreads), kThreads, 0, stream>>>(
        out, tokens, table, rows, width, vocab_rows, error);
    return cudaGetLastError();
  });
}

cudaError_t embedding_backward_scratch_bytes(int rows, std::size_t* bytes) {
  std::size_t sort_bytes = 0;
  const cudaError_t status = sort_storage_bytes(rows, &sort_bytes);
  *bytes = scratch_total(rows, sort_bytes);
  return status;
}

cudaError_t embedding_backward(float* dtable, const __nv_bfloat16* dout, const int* tokens, int rows, int width,
                               int vocab_rows, void* scratch, std::size_t scratch_bytes, DeviceErrorRecord* error,
                               cudaStream_t stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  std::size_t sort_bytes = 0;
  if (cudaError_t status = sort_storage_bytes(rows, &sort_bytes); status != cudaSuccess) return status;
  if (scratch_bytes < scratch_total(rows, sort_bytes)) return cudaErrorInvalidValue;
  BackwardScratch parts = carve(scratch, rows, sort_bytes);

  constexpr int kThreads = 256;
  iota_kernel<<<grid_stride_blocks(std::size_t(rows), kThreads), kThreads, 0, stream>>>(parts.positions, rows);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  // All 32 key bits: out-of-range tokens must still sort into runs of equal value.
  if (cudaError_t status = cub::DeviceRadixSort::SortPairs(parts.sort_storage, parts.sort_bytes, tokens,
                                                           parts.sorted_tokens, parts.positions,
                                                           parts.sorted_positions, rows, 0, 32, stream);
      status != cudaSuccess)
    return status;
  return launch_with_group_width(width, {dout}, [&](auto group) {
    constexpr int kColumnThreads = 128;
    accumulate_token_runs_kernel<decltype(group)::value><<<rows, kColumnThreads, 0, stream>>>(
        dtable, dout, parts.sorted_tokens, parts.sorted_positions, rows, width, vocab_rows, error);
    return cudaGetLastError();
  });
}

}  // namespace pope::kernels
