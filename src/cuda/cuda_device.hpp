// GPU discovery for the CUDA backend (host side).
#pragma once

#include <string>

namespace pope {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int cuda_device_count();
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" for device `index`.
std::string cuda_device_summary(int index);

}  // namespace pope
