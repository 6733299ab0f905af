// Greedy decoding's choice over fp32 logits rows [rows, padded_width], of which the first
// vocab_size columns are real: ids[r] = the first column of the row's largest logit and
// log_probs[r] = its log-softmax, −log Σ_j exp(z_j − max) (the chosen logit is the max). A row
// holding a non-finite logit gets id 0 and log-probability NaN. With `past` set, *past += advance
// (the next decode call's cached length). Tested against the CPU by
// tests/gpu/test_cuda_ops.cpp (`pope_gpu_tests --gtest_filter='CudaGreedyTokens*'`).
#pragma once

#include <cuda_runtime.h>

namespace pope::kernels {

cudaError_t greedy_tokens(int* ids, float* log_probs, const float* logits, int rows, int padded_width, int vocab_size,
                          int* past, int advance, cudaStream_t stream);

}  // namespace pope::kernels
