// Placeholder so the CUDA backend links while the attention kernels are being written.
#include "cuda/cuda_attention.hpp"

#include <stdexcept>

namespace pope::cuda {

struct AttentionRunner::Scratch {};

AttentionRunner::AttentionRunner() = default;
AttentionRunner::~AttentionRunner() = default;

void AttentionRunner::forward(const AttentionForward&, cudaStream_t) {
  throw std::runtime_error("cuda attention_forward: not implemented yet");
}

void AttentionRunner::backward(const AttentionBackward&, cudaStream_t) {
  throw std::runtime_error("cuda attention_backward: not implemented yet");
}

}  // namespace pope::cuda
