// Forward: a gather, one thread per 16-byte group of an output row (per element when rows
// are not 16-byte aligned).
//
// Backward without float atomics, whose summation order would vary from run to run:
//   1. sort (token, position) pairs by token with CUB's stable radix sort, so each token's
//      positions form one run, in increasing position order;
//   2. one block per sorted entry; only the first entry of a run works: its warps split the
//      run's entries, lanes take columns (16-byte groups of them where aligned), and the
//      warps' fp32 sums are added in a fixed order into dtable (accumulate_token_runs_kernel).
// Each table row is then written by exactly one block, and the order of every sum is fixed.
#include <cub/device/device_radix_sort.cuh>

#include "bf16_group.cuh"
#include "block_reduce.cuh"
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

// Warps of the block that sums one token's run: each takes every kRunWarps-th entry of the run.
constexpr int kRunWarps = 8;
// Entries a warp loads before adding them (their rows are independent loads in flight).
constexpr int kRunUnroll = 4;

// The block of sorted entry blockIdx.x; only the head of a run works. First the run's end, found
// blockDim entries at a time (equal tokens are a prefix of each window, the entries being
// sorted); then, for each pass of 32 column groups, warp w sums entries first + w, first + w + 8,
// ... in order (kRunUnroll rows in flight), and warp 0 adds the 8 warp sums in warp order to
// dtable. The order of every sum is fixed by the sorted entries alone, so the bits do not vary
// between runs. Real text has runs of over a thousand entries (",", " the" in 32Ki tokens): one
// thread walking them one dependent load after another took milliseconds per step.
template <int kWidth>
__global__ void __launch_bounds__(kRunWarps * kWarpSize)
    accumulate_token_runs_kernel(float* dtable, const __nv_bfloat16* dout, const int* sorted_tokens,
                                 const int* sorted_positions, int rows, int width, int vocab_rows,
                                 DeviceErrorRecord* error) {
  // [warp][k][lane]: lanes of a warp write consecutive words.
  __shared__ float warp_sums[kRunWarps * kWidth * kWarpSize];
  const int first = blockIdx.x;
  const int token = sorted_tokens[first];
  if (first > 0 && sorted_tokens[first - 1] == token) return;  // not the head of a run
  if (token < 0 || token >= vocab_rows) {
    if (threadIdx.x == 0)
      report_device_error(error, kEmbeddingBackwardToken, sorted_positions[first], token, vocab_rows);
    return;
  }
  int end = rows;
  for (int base = first + 1; base < rows; base += int(blockDim.x)) {
    const int e = base + int(threadIdx.x);
    const int equal = __syncthreads_count(e < rows && sorted_tokens[e] == token);
    if (equal < int(blockDim.x)) {  // the same count in every thread: all leave together
      end = min(rows, base + equal);
      break;
    }
  }

  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  const int groups = width / kWidth;
  auto row_group = [&](int entry, int g) {
    return load_group<kWidth>(dout + std::size_t(sorted_positions[entry]) * width, g);
  };
  for (int g0 = 0; g0 < groups; g0 += kWarpSize) {
    const int g = g0 + lane;
    float sum[kWidth] = {};
    if (g < groups) {
      int entry = first + warp;
      for (; entry + (kRunUnroll - 1) * kRunWarps < end; entry += kRunUnroll * kRunWarps) {
        Bf16Group<kWidth> values[kRunUnroll];
#pragma unroll
        for (int u = 0; u < kRunUnroll; ++u) values[u] = row_group(entry + u * kRunWarps, g);
#pragma unroll
        for (int u = 0; u < kRunUnroll; ++u)
          for (int k = 0; k < kWidth; ++k) sum[k] += values[u].get(k);
      }
      for (; entry < end; entry += kRunWarps) {
        const Bf16Group<kWidth> values = row_group(entry, g);
        for (int k = 0; k < kWidth; ++k) sum[k] += values.get(k);
      }
    }
    for (int k = 0; k < kWidth; ++k) warp_sums[(warp * kWidth + k) * kWarpSize + lane] = sum[k];
    __syncthreads();
    if (warp == 0 && g < groups) {
      float* table_row = dtable + std::size_t(token) * width + g * kWidth;
      for (int k = 0; k < kWidth; ++k) {
        float total = warp_sums[k * kWarpSize + lane];
        for (int w = 1; w < kRunWarps; ++w) total += warp_sums[(w * kWidth + k) * kWarpSize + lane];
        table_row[k] += total;
      }
    }
    __syncthreads();  // warp_sums is rewritten by the next pass
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
    accumulate_token_runs_kernel<decltype(group)::value><<<rows, kRunWarps * kWarpSize, 0, stream>>>(
        dtable, dout, parts.sorted_tokens, parts.sorted_positions, rows, width, vocab_rows, error);
    return cudaGetLastError();
  });
}

}  // namespace pope::kernels
