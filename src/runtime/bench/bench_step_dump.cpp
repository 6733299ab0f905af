// write_step_dump: one forward/backward on a fixed batch, written with everything an
// independent implementation needs to recompute the loss and every gradient.
#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <span>

#include "pope/backend.hpp"
#include "pope/bench.hpp"
#include "pope/checkpoint.hpp"
#include "pope/model.hpp"
#include "pope/rng.hpp"
#include "runtime/bench/bench_batches.hpp"

namespace pope {

namespace {

// Std of the noise added to norm gains and positional parameters: large enough that a gain
// applied twice or a misplaced offset changes the loss far beyond bf16 rounding.
constexpr double kParameterJitter = 0.3;
// One target in this many is masked (−1), so the masked-target path is compared too.
constexpr std::uint64_t kMaskOneIn = 16;

template <class T>
std::vector<std::uint8_t> to_bytes(std::span<const T> values) {
  std::vector<std::uint8_t> bytes(values.size_bytes());
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Norm gains start at exactly 1 and PoPE's δ at 0; move them (the parameters without weight
// decay) so that the comparison sees their effect.
void jitter_unscaled_parameters(Model& model, Rng& rng) {
  std::vector<float> values = model.parameters_to_host();
  const ParameterLayout& layout = model.layout();
  for (std::size_t i = 0; i < layout.specs().size(); ++i) {
    if (layout.specs()[i].weight_decay) continue;
    float* p = values.data() + layout.offset(i);
    for (std::int64_t k = 0; k < shape_numel(layout.specs()[i].shape); ++k)
      p[k] += static_cast<float>(kParameterJitter * rng.normal());
  }
  model.parameters_from_host(values);
}

// Masks about one target in kMaskOneIn (never the first, so at least one counts); returns
// how many stay unmasked.
long mask_some_targets(std::vector<std::int32_t>& targets, Rng& rng) {
  long unmasked = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (i > 0 && rng.below(kMaskOneIn) == 0) targets[i] = -1;
    if (targets[i] >= 0) ++unmasked;
  }
  return unmasked;
}

}  // namespace

void write_step_dump(const RunConfig& config, const std::filesystem::path& path, std::uint64_t seed) {
  validate(config);
  const int B = config.train.micro_batch_size, T = config.train.seq_len;
  std::unique_ptr<Backend> backend = make_backend(config.train.device, "float", config.train.threads);
  Model model(config.model, *backend);
  model.initialize(config.train.seed);
  Rng rng(mix64(seed, 0x64756d70));  // "dump": a stream apart from the token batch's
  jitter_unscaled_parameters(model, rng);

  TokenBatch batch = make_token_batches(config, 1, /*use_data=*/false, seed).front();
  const long unmasked = mask_some_targets(batch.targets, rng);
  model.zero_gradients();
  const LossSum loss = model.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0 / double(unmasked));

  const std::vector<float> params = model.parameters_to_host();
  const std::vector<float> grads = tensor_to_host_f32(*backend, model.gradients());
  const ParameterLayout& layout = model.layout();
  auto slice = [&](const std::vector<float>& flat, std::size_t index) {
    return std::span<const float>(flat).subspan(std::size_t(layout.offset(index)),
                                                std::size_t(shape_numel(layout.specs()[index].shape)));
  };

  std::vector<SafetensorsTensor> tensors;
  for (std::size_t i = 0; i < layout.specs().size(); ++i)
    tensors.push_back({layout.specs()[i].name, DType::f32, layout.specs()[i].shape, to_bytes(slice(params, i))});
  tensors.push_back({"tokens", DType::i32, {B, T}, to_bytes(std::span<const std::int32_t>(batch.inputs))});
  tensors.push_back({"targets", DType::i32, {B, T}, to_bytes(std::span<const std::int32_t>(batch.targets))});
  const float mean_loss = static_cast<float>(loss.mean());
  tensors.push_back({"loss", DType::f32, {}, to_bytes(std::span<const float>(&mean_loss, 1))});
  for (std::size_t i = 0; i < layout.specs().size(); ++i)
    tensors.push_back(
        {"grad." + layout.specs()[i].name, DType::f32, layout.specs()[i].shape, to_bytes(slice(grads, i))});

  write_safetensors(path, tensors,
                    {{"format", "pope-step-dump"},
                     {"config", config_to_json(config).dump()},
                     {"backend", backend->description()},
                     {"activation_dtype", std::string(dtype_name(backend->dtypes().activation))}});
}

}  // namespace pope
