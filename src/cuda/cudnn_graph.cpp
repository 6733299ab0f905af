#include "cuda/cudnn_graph.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace pope::cuda::cudnn {

std::string last_error_message() {
  char message[2048] = {};
  cudnnGetLastErrorString(message, sizeof(message));
  return message;
}

void check(cudnnStatus_t status, std::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const std::string detail = last_error_message();
  throw std::runtime_error(fmt::format("cuDNN {} (runtime {}): {} failed: {}{}{}", CUDNN_VERSION, cudnnGetVersion(),
                                       what, cudnnGetErrorString(status), detail.empty() ? "" : "; cuDNN says: ",
                                       detail));
}

// ---------------------------------------------------------------- Descriptor

Descriptor::Descriptor(cudnnBackendDescriptorType_t type, std::string name) : name_(std::move(name)) {
  check(cudnnBackendCreateDescriptor(type, &handle_), fmt::format("creating the descriptor of {}", name_));
}

Descriptor::Descriptor(Descriptor&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), name_(std::move(other.name_)) {}

Descriptor& Descriptor::operator=(Descriptor&& other) noexcept {
  if (this != &other) {
    if (handle_) cudnnBackendDestroyDescriptor(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    name_ = std::move(other.name_);
  }
  return *this;
}

Descriptor::~Descriptor() {
  if (handle_) cudnnBackendDestroyDescriptor(handle_);
}

void Descriptor::set(cudnnBackendAttributeName_t attribute, cudnnBackendAttributeType_t type, std::int64_t count,
                     const void* values) {
  check(cudnnBackendSetAttribute(handle_, attribute, type, count, values),
        fmt::format("setting attribute {} of {}", int(attribute), name_));
}

void Descriptor::set_int64(cudnnBackendAttributeName_t attribute, std::int64_t value) {
  set(attribute, CUDNN_TYPE_INT64, 1, &value);
}

void Descriptor::set_int64s(cudnnBackendAttributeName_t attribute, const std::vector<std::int64_t>& values) {
  set(attribute, CUDNN_TYPE_INT64, std::int64_t(values.size()), values.data());
}

void Descriptor::set_data_type(cudnnBackendAttributeName_t attribute, cudnnDataType_t value) {
  set(attribute, CUDNN_TYPE_DATA_TYPE, 1, &value);
}

void Descriptor::set_bool(cudnnBackendAttributeName_t attribute, bool value) {
  set(attribute, CUDNN_TYPE_BOOLEAN, 1, &value);
}

void Descriptor::set_descriptor(cudnnBackendAttributeName_t attribute, const Descriptor& value) {
  cudnnBackendDescriptor_t handle = value.get();
  set(attribute, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &handle);
}

void Descriptor::finalize() { check(cudnnBackendFinalize(handle_), fmt::format("finalizing {}", name_)); }

// ---------------------------------------------------------------- ExecutionPlan

ExecutionPlan::ExecutionPlan(std::vector<std::unique_ptr<Descriptor>> parts, Descriptor plan,
                             std::int64_t workspace_bytes, std::string summary)
    : parts_(std::move(parts)), plan_(std::move(plan)), workspace_bytes_(workspace_bytes), summary_(std::move(summary)) {}

void ExecutionPlan::execute(cudnnHandle_t handle, const std::vector<std::pair<std::int64_t, void*>>& bindings,
                            void* workspace) const {
  std::vector<std::int64_t> uids;
  std::vector<void*> pointers;
  for (const auto& [uid, pointer] : bindings) {
    uids.push_back(uid);
    pointers.push_back(pointer);
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "the variant pack of " + summary_);
  pack.set_int64s(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, std::int64_t(pointers.size()), pointers.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  check(cudnnBackendExecute(handle, plan_.get(), pack.get()), "executing " + summary_);
}

// ---------------------------------------------------------------- GraphBuilder

const Descriptor& GraphBuilder::keep(Descriptor descriptor) {
  owned_.push_back(std::make_unique<Descriptor>(std::move(descriptor)));
  return *owned_.back();
}

TensorRef GraphBuilder::tensor(std::string_view name, std::int64_t uid, std::vector<std::int64_t> dims,
                               std::vector<std::int64_t> strides, cudnnDataType_t type, bool is_virtual,
                               bool by_value) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, fmt::format("tensor {} of {}", name, graph_name_));
  t.set_data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
  t.set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims);
  t.set_int64s(CUDNN_ATTR_TENSOR_STRIDES, strides);
  t.set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t.set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
  t.set_bool(CUDNN_ATTR_TENSOR_IS_VIRTUAL, is_virtual);
  if (by_value) t.set_bool(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
  t.finalize();
  return TensorRef{&keep(std::move(t)), std::move(dims), std::move(strides)};
}

TensorRef GraphBuilder::bound(std::string_view name, std::int64_t uid, std::vector<std::int64_t> dims,
                              std::vector<std::int64_t> strides, cudnnDataType_t type) {
  return tensor(name, uid, std::move(dims), std::move(strides), type, false, false);
}

TensorRef GraphBuilder::by_value(std::string_view name, std::int64_t uid, cudnnDataType_t type) {
  return tensor(name, uid, {1, 1, 1, 1}, {1, 1, 1, 1}, type, false, true);
}

TensorRef GraphBuilder::virtual_tensor(std::string_view name, std::vector<std::int64_t> dims,
                                       std::vector<std::int64_t> strides, cudnnDataType_t type) {
  return tensor(name, next_virtual_uid_++, std::move(dims), std::move(strides), type, true, false);
}

TensorRef GraphBuilder::virtual_like(std::string_view name, const TensorRef& like, cudnnDataType_t type) {
  return virtual_tensor(name, like.dims, like.strides, type);
}

void GraphBuilder::add_operation(Descriptor operation) {
  operation.finalize();
  operations_.push_back(&keep(std::move(operation)));
}

void GraphBuilder::matmul(std::string_view name, const TensorRef& a, const TensorRef& b, const TensorRef& c) {
  Descriptor product(CUDNN_BACKEND_MATMUL_DESCRIPTOR, fmt::format("matmul {} of {}", name, graph_name_));
  product.set_data_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
  product.finalize();
  Descriptor operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, fmt::format("operation {} of {}", name, graph_name_));
  operation.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_ADESC, *a.descriptor);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_BDESC, *b.descriptor);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_CDESC, *c.descriptor);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_DESC, keep(std::move(product)));
  add_operation(std::move(operation));
}

namespace {

Descriptor pointwise_descriptor(std::string name, cudnnPointwiseMode_t mode, cudnnDataType_t math) {
  Descriptor descriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, std::move(name));
  descriptor.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  descriptor.set_data_type(CUDNN_ATTR_POINTWISE_MATH_PREC, math);
  return descriptor;
}

}  // namespace

void GraphBuilder::pointwise(std::string_view name, cudnnPointwiseMode_t mode, const TensorRef& x, const TensorRef& y,
                             const TensorRef* b, const TensorRef* t, cudnnDataType_t math) {
  Descriptor descriptor = pointwise_descriptor(fmt::format("pointwise {} of {}", name, graph_name_), mode, math);
  descriptor.finalize();
  Descriptor operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                       fmt::format("operation {} of {}", name, graph_name_));
  operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, keep(std::move(descriptor)));
  operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x.descriptor);
  if (b) operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b->descriptor);
  if (t) operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t->descriptor);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *y.descriptor);
  add_operation(std::move(operation));
}

void GraphBuilder::index(std::string_view name, const TensorRef& x, std::int64_t axis, const TensorRef& y) {
  Descriptor descriptor =
      pointwise_descriptor(fmt::format("pointwise {} of {}", name, graph_name_), CUDNN_POINTWISE_GEN_INDEX,
                           CUDNN_DATA_INT32);
  descriptor.set_int64(CUDNN_ATTR_POINTWISE_AXIS, axis);
  descriptor.finalize();
  Descriptor operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                       fmt::format("operation {} of {}", name, graph_name_));
  operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, keep(std::move(descriptor)));
  operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x.descriptor);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *y.descriptor);
  add_operation(std::move(operation));
}

void GraphBuilder::reduction(std::string_view name, cudnnReduceTensorOp_t op, const TensorRef& x, const TensorRef& y) {
  Descriptor descriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, fmt::format("reduction {} of {}", name, graph_name_));
  descriptor.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op);
  descriptor.set_data_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
  descriptor.finalize();
  Descriptor operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                       fmt::format("operation {} of {}", name, graph_name_));
  operation.set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_DESC, keep(std::move(descriptor)));
  operation.set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, *x.descriptor);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, *y.descriptor);
  add_operation(std::move(operation));
}

void GraphBuilder::reshape(std::string_view name, const TensorRef& x, const TensorRef& y) {
  Descriptor operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
                       fmt::format("operation {} of {}", name, graph_name_));
  operation.set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, *x.descriptor);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, *y.descriptor);
  add_operation(std::move(operation));
}

namespace {

// The global index of the engine an engine configuration uses, or −1 if cuDNN does not say.
std::int64_t engine_index(const Descriptor& config) {
  cudnnBackendDescriptor_t engine = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return -1;
  std::int64_t count = 0, index = -1;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                               &engine) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index) !=
          CUDNN_STATUS_SUCCESS)
    index = -1;
  cudnnBackendDestroyDescriptor(engine);
  return index;
}

}  // namespace

ExecutionPlan GraphBuilder::build(cudnnHandle_t handle) {
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the operation graph of " + graph_name_);
  std::vector<cudnnBackendDescriptor_t> operations;
  for (const Descriptor* operation : operations_) operations.push_back(operation->get());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, std::int64_t(operations.size()),
            operations.data());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  graph.finalize();

  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "the engine heuristics (mode A) of " + graph_name_);
  heuristics.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  heuristics.finalize();
  std::int64_t count = 0;
  check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                 &count, nullptr),
        "counting the engine configurations heuristics offer for " + graph_name_);
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> config_handles;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, fmt::format("engine configuration {} of {}", i, graph_name_));
    config_handles.push_back(configs.back().get());
  }
  check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                 &count, config_handles.data()),
        "reading the engine configurations heuristics offer for " + graph_name_);

  // The first configuration that finalizes is heuristics' best one that supports this graph.
  std::string refusals;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t engine = engine_index(configs[std::size_t(i)]);
    Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, fmt::format("the execution plan of {}", graph_name_));
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    plan.set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[std::size_t(i)]);
    const cudnnStatus_t status = cudnnBackendFinalize(plan.get());
    if (status != CUDNN_STATUS_SUCCESS) {
      refusals += fmt::format("\n  engine {} (candidate {}): {}: {}", engine, i, cudnnGetErrorString(status),
                              last_error_message());
      continue;
    }
    std::int64_t workspace = 0, values = 0;
    check(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &values,
                                   &workspace),
          "reading the workspace size of " + graph_name_);
    std::vector<std::unique_ptr<Descriptor>> parts = std::move(owned_);
    for (Descriptor& part : configs) parts.push_back(std::make_unique<Descriptor>(std::move(part)));
    parts.push_back(std::make_unique<Descriptor>(std::move(heuristics)));
    parts.push_back(std::make_unique<Descriptor>(std::move(graph)));
    return ExecutionPlan(std::move(parts), std::move(plan), workspace,
                         fmt::format("{} (cuDNN engine {}, heuristics candidate {} of {}, workspace {} bytes)",
                                     graph_name_, engine, i, count, workspace));
  }
  throw std::runtime_error(fmt::format("cuDNN {} (runtime {}): no engine supports {}: heuristics offered {} "
                                       "configuration{}{}",
                                       CUDNN_VERSION, cudnnGetVersion(), graph_name_, count, count == 1 ? "" : "s",
                                       refusals.empty() ? std::string(" (none)") : refusals));
}

}  // namespace pope::cuda::cudnn
