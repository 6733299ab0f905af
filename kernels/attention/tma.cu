// Host side of tma.cuh: tensor maps through the driver's cuTensorMapEncodeTiled, looked up once
// through the runtime (no link against libcuda).
#include <cudaTypedefs.h>

#include <mutex>

#include "attention/tma.cuh"

namespace pope::kernels::tma {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static PFN_cuTensorMapEncodeTiled_v12000 function = nullptr;
  static std::once_flag looked_up;
  std::call_once(looked_up, [] {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pointer, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      function = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(pointer);
  });
  return function;
}

cudaError_t encode(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, const void* base,
                   const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                   CUtensorMapSwizzle swizzle) {
  const auto function = encode_function();
  if (function == nullptr) return cudaErrorNotSupported;
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = function(map, type, rank, const_cast<void*>(base), dims, strides, box, element_strides,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A 3-D tensor of `element_bytes` elements read or written in swizzled boxes 128 bytes wide.
cudaError_t encode_tiles(CUtensorMap* map, CUtensorMapDataType type, std::int64_t element_bytes, const void* base,
                         std::int64_t columns, std::int64_t rows, std::int64_t groups, std::int64_t row_stride,
                         std::int64_t group_stride, int box_rows) {
  const cuuint64_t dims[3] = {cuuint64_t(columns), cuuint64_t(rows), cuuint64_t(groups)};
  // Strides of dimensions 1 and 2, in bytes (dimension 0 is contiguous).
  const cuuint64_t strides[2] = {cuuint64_t(row_stride * element_bytes), cuuint64_t(group_stride * element_bytes)};
  const cuuint32_t box[3] = {cuuint32_t(128 / element_bytes), cuuint32_t(box_rows), 1};
  return encode(map, type, 3, base, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace

cudaError_t encode_bf16_tiles(CUtensorMap* map, const void* base, std::int64_t columns, std::int64_t rows,
                              std::int64_t groups, std::int64_t row_stride, std::int64_t group_stride, int box_rows) {
  return encode_tiles(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, columns, rows, groups, row_stride, group_stride,
                      box_rows);
}

cudaError_t encode_f32_tiles(CUtensorMap* map, const float* base, std::int64_t columns, std::int64_t rows,
                             std::int64_t groups, std::int64_t row_stride, std::int64_t group_stride, int box_rows) {
  static_assert(128 / sizeof(float) == kF32BoxColumns, "one box row is one 128-byte swizzle row");
  return encode_tiles(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, sizeof(float), base, columns, rows, groups, row_stride,
                      group_stride, box_rows);
}

cudaError_t encode_f32_vector(CUtensorMap* map, const float* base, std::int64_t count, int run, int* shift) {
  *shift = int(reinterpret_cast<std::uintptr_t>(base) % 16 / sizeof(float));
  base -= *shift;
  count += *shift;
  const cuuint64_t dims[1] = {cuuint64_t(count)};
  const cuuint64_t no_strides[1] = {0};  // a rank-1 map has none; the array is not read
  const cuuint32_t boxes[1] = {cuuint32_t(run + kVectorLead)};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, base, dims, no_strides, boxes, CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace pope::kernels::tma
