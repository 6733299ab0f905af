// Bad values that only the GPU sees (token ids, targets living in device memory) cannot be
// reported by an exception at the launch without a host synchronisation in the middle of a
// step. Kernels instead record the first offence in a DeviceErrorRecord; the backend reads
// it at its next synchronisation point and throws there, naming the op, index and value.
#pragma once

#include <cuda_runtime.h>

namespace pope::kernels {

enum DeviceErrorOp : int {
  kNoDeviceError = 0,
  kEmbeddingForwardToken = 1,   // tokens[index] = value outside [0, limit)
  kEmbeddingBackwardToken = 2,  // tokens[index] = value outside [0, limit)
  kCrossEntropyTarget = 3,      // targets[index] = value not below limit
};

struct DeviceErrorRecord {
  int op;  // a DeviceErrorOp; 0 while nothing went wrong
  int unused_padding;
  long long index;
  long long value;
  long long limit;
};

#ifdef __CUDACC__
// The first reporter wins; later ones leave the record as it is.
__device__ inline void report_device_error(DeviceErrorRecord* record, DeviceErrorOp op, long long index,
                                           long long value, long long limit) {
  if (atomicCAS(&record->op, int(kNoDeviceError), int(op)) == int(kNoDeviceError)) {
    record->index = index;
    record->value = value;
    record->limit = limit;
  }
}
#endif

}  // namespace pope::kernels
