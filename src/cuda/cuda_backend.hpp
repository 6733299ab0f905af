// Factory of the CUDA backend (private to the library; make_backend() in backend.hpp is the
// public entry point). Dtypes: activations and compute weights bf16; master weights,
// gradients and optimizer state f32; statistics (rstd, lse, losses) f32.
//
// Per-op dtypes: embedding table bf16, its gradient f32; rmsnorm gain bf16, dgain f32;
// matmul a, b bf16 and out bf16 or f32; gelu, add bf16; cross_entropy logits bf16, losses
// f32; sum_of_squares f32; adamw params, grads, m, v f32 and compute_copy bf16 (written for
// segment elements only); sum_of_squares_into, accumulate_sum (values f32), adamw_guarded
// (schedule and stats) use f64 scalars. Ops are queued on the backend's stream; host copies
// synchronise, except the *_async ones, which need page-locked memory from allocate_host().
// Work can be recorded into a CUDA graph (make_graph_capture).
// Bad token ids and targets, which only the GPU sees, are reported by the next call that
// synchronises (synchronize, copy_to_host, sum_of_squares) as std::invalid_argument.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "pope/backend.hpp"

namespace pope {

// Makes `device_index` the calling thread's current device and keeps all of the backend's
// memory and work there; use one backend (one device) per process, as data-parallel ranks
// do. Throws std::runtime_error when `device_index` names no visible CUDA device.
std::unique_ptr<Backend> make_cuda_backend(int device_index);

// The stream a CUDA backend queues its work on, for work that must run in order with it (a
// communicator's collectives). Throws std::invalid_argument for any other backend.
cudaStream_t cuda_backend_stream(Backend& backend);

}  // namespace pope
