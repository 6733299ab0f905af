// Picks the backend for `--device`: the CPU reference, or CUDA (auto: when built with it
// and a GPU is present).
#include <fmt/format.h>

#include <stdexcept>

#include "cpu/cpu_backend.hpp"
#include "pope/backend.hpp"
#ifdef POPE_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_device.hpp"
#endif

namespace pope {

bool cuda_available() {
#ifdef POPE_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(DeviceChoice device, const std::string& cpu_precision, int threads,
                                      int cuda_device) {
  if (device == DeviceChoice::cpu || (device == DeviceChoice::automatic && !cuda_available()))
    return make_cpu_backend(cpu_precision, threads);
#ifndef POPE_HAVE_CUDA
  (void)cuda_device;
#endif
#ifdef POPE_HAVE_CUDA
    if (!cuda_available()) throw std::runtime_error("--device cuda: no CUDA device is visible on this machine");
    // Modulo the visible devices: a rank that its launcher restricted to its own GPU
    // (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES) sees it as device 0.
    return make_cuda_backend(cuda_device % cuda_device_count());
#else
    throw std::runtime_error("--device cuda: this build has no CUDA backend (nvcc was not found at configure time)");
#endif
}

}  // namespace pope
