// Building blocks for cuDNN 9 operation graphs through its C backend API (cudnn_graph.h):
// owned descriptors, a graph builder that names every tensor and operation, and the
// execution plan that heuristics mode A picks for a finished graph. Only API present in
// cuDNN 9.14 and later is used (no cudnn-frontend; the SDPA operation descriptors of 9.13+/9.17+
// are avoided because 9.14 has no backward one and no causal mask for them).
//
// Every failing cuDNN call throws std::runtime_error with the call, the descriptor it was
// building, cudnnGetErrorString and cuDNN's last error message (cudnnGetLastErrorString),
// because a graph cuDNN rejects says why only there.
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pope::cuda::cudnn {

// Throws when `status` is not CUDNN_STATUS_SUCCESS; `what` names the call and its subject.
void check(cudnnStatus_t status, std::string_view what);

// cuDNN's own explanation of the last failure on this thread ("" when it has none).
std::string last_error_message();

// One owned cudnnBackendDescriptor_t, named for error messages.
class Descriptor {
 public:
  Descriptor(cudnnBackendDescriptorType_t type, std::string name);
  Descriptor(Descriptor&& other) noexcept;
  Descriptor& operator=(Descriptor&& other) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor();

  cudnnBackendDescriptor_t get() const { return handle_; }
  const std::string& name() const { return name_; }

  void set(cudnnBackendAttributeName_t attribute, cudnnBackendAttributeType_t type, std::int64_t count,
           const void* values);
  void set_int64(cudnnBackendAttributeName_t attribute, std::int64_t value);
  void set_int64s(cudnnBackendAttributeName_t attribute, const std::vector<std::int64_t>& values);
  void set_data_type(cudnnBackendAttributeName_t attribute, cudnnDataType_t value);
  void set_bool(cudnnBackendAttributeName_t attribute, bool value);
  void set_descriptor(cudnnBackendAttributeName_t attribute, const Descriptor& value);
  void finalize();

 private:
  cudnnBackendDescriptor_t handle_ = nullptr;
  std::string name_;
};

// A tensor of a graph under construction: its descriptor (owned by the builder) and shape.
struct TensorRef {
  const Descriptor* descriptor = nullptr;
  std::vector<std::int64_t> dims, strides;
};

// An executable graph: the plan heuristics chose, its workspace, and every descriptor the plan
// refers to (kept alive as long as the plan).
class ExecutionPlan {
 public:
  ExecutionPlan(std::vector<std::unique_ptr<Descriptor>> parts, Descriptor plan, std::int64_t workspace_bytes, std::string summary);

  std::int64_t workspace_bytes() const { return workspace_bytes_; }
  // Which graph and engine this is, for messages and logs.
  const std::string& summary() const { return summary_; }
  // Runs the plan on the handle's stream. `bindings` pairs each bound tensor's uid with its
  // device pointer (or, for tensors passed by value, a host pointer to the value).
  void execute(cudnnHandle_t handle, const std::vector<std::pair<std::int64_t, void*>>& bindings,
               void* workspace) const;

 private:
  std::vector<std::unique_ptr<Descriptor>> parts_;
  Descriptor plan_;
  std::int64_t workspace_bytes_;
  std::string summary_;
};

// Records tensors and operations, then finalizes them into an operation graph and plan.
// Data types: cuDNN's; intermediate (virtual) tensors are f32 unless said otherwise.
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string graph_name) : graph_name_(std::move(graph_name)) {}

  // A tensor bound at execution under `uid` (device memory, 16-byte aligned).
  TensorRef bound(std::string_view name, std::int64_t uid, std::vector<std::int64_t> dims,
                  std::vector<std::int64_t> strides, cudnnDataType_t type);
  // A scalar [1, 1, 1, 1] passed by value at execution under `uid` (a host pointer).
  TensorRef by_value(std::string_view name, std::int64_t uid, cudnnDataType_t type);
  // A tensor that lives only inside the fused kernels.
  TensorRef virtual_tensor(std::string_view name, std::vector<std::int64_t> dims, std::vector<std::int64_t> strides,
                           cudnnDataType_t type = CUDNN_DATA_FLOAT);
  // The same dims and strides as `like`, virtual.
  TensorRef virtual_like(std::string_view name, const TensorRef& like, cudnnDataType_t type = CUDNN_DATA_FLOAT);

  // c = a · b over the last two dims (batched over the first two), f32 accumulation.
  void matmul(std::string_view name, const TensorRef& a, const TensorRef& b, const TensorRef& c);
  // y = mode(x [, b [, t]]) elementwise with broadcasting; `math` is the compute type.
  void pointwise(std::string_view name, cudnnPointwiseMode_t mode, const TensorRef& x, const TensorRef& y,
                 const TensorRef* b = nullptr, const TensorRef* t = nullptr, cudnnDataType_t math = CUDNN_DATA_FLOAT);
  // y = the index along `axis` of each element of x (int32).
  void index(std::string_view name, const TensorRef& x, std::int64_t axis, const TensorRef& y);
  // y = x reduced by `op` over the dims where y has size 1, f32.
  void reduction(std::string_view name, cudnnReduceTensorOp_t op, const TensorRef& x, const TensorRef& y);
  // y = x viewed with y's dims and strides (a transpose for the fused kernels).
  void reshape(std::string_view name, const TensorRef& x, const TensorRef& y);

  // The operation graph, heuristics mode A, and the first engine configuration that finalizes
  // into a plan. Throws, listing what each candidate said, when none does.
  ExecutionPlan build(cudnnHandle_t handle);

 private:
  const Descriptor& keep(Descriptor descriptor);
  TensorRef tensor(std::string_view name, std::int64_t uid, std::vector<std::int64_t> dims,
                   std::vector<std::int64_t> strides, cudnnDataType_t type, bool is_virtual, bool by_value);
  void add_operation(Descriptor operation);

  std::string graph_name_;
  // Descriptors are referenced by address from operations: a vector of stable boxes.
  std::vector<std::unique_ptr<Descriptor>> owned_;
  std::vector<const Descriptor*> operations_;
  std::int64_t next_virtual_uid_ = 1 << 20;  // clear of the callers' bound uids
};

}  // namespace pope::cuda::cudnn
