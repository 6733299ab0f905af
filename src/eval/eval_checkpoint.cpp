// Opening a checkpoint for evaluation: find the step directory and the run's config.json,
// apply the evaluation overrides (RoPE scaling, --set model.…), load the weights.
#include <fmt/format.h>
#include <fmt/std.h>

#include "pope/checkpoint.hpp"
#include "pope/eval.hpp"
#include "pope/position.hpp"

namespace pope {

namespace fs = std::filesystem;

namespace {

constexpr const char* kScalingPrefix = "model.position.rope.scaling.";

std::string run_name(const CheckpointLocation& paths) { return paths.config_file.parent_path().filename().string(); }

std::string shortest(double value) { return fmt::format("{}", value); }

}  // namespace

std::vector<std::string> RopeScalingOverride::assignments() const {
  std::vector<std::string> out;
  if (kind) out.push_back(std::string(kScalingPrefix) + "kind=" + (*kind == "dynamic-ntk" ? "dynamic_ntk" : *kind));
  if (factor) out.push_back(std::string(kScalingPrefix) + "factor=" + shortest(*factor));
  if (yarn_alpha) out.push_back(std::string(kScalingPrefix) + "yarn_alpha=" + shortest(*yarn_alpha));
  if (yarn_beta) out.push_back(std::string(kScalingPrefix) + "yarn_beta=" + shortest(*yarn_beta));
  if (yarn_temperature) out.push_back(std::string(kScalingPrefix) + "yarn_temperature=" + shortest(*yarn_temperature));
  return out;
}

EvalCheckpoint open_eval_checkpoint(const fs::path& path, const std::vector<std::string>& overrides,
                                    const RopeScalingOverride& rope_scaling) {
  for (const std::string& assignment : overrides)
    if (assignment.rfind("model.", 0) != 0)
      throw ConfigError(assignment.substr(0, assignment.find('=')),
                        fmt::format("--set '{}': evaluation takes only model.* keys (the other sections describe "
                                    "training and do not change an evaluation)",
                                    assignment));
  const CheckpointLocation paths = locate_checkpoint(path);
  std::vector<std::string> all = overrides;
  for (std::string& assignment : rope_scaling.assignments()) all.push_back(std::move(assignment));

  EvalCheckpoint checkpoint;
  checkpoint.given = path;
  checkpoint.step_dir = paths.step_dir;
  checkpoint.config_file = paths.config_file;
  checkpoint.config = load_config(paths.config_file, all);
  if (rope_scaling.any() && checkpoint.config.model.position.kind != "rope")
    throw ConfigError("--rope-scaling",
                      fmt::format("checkpoint {} uses position encoding '{}'; RoPE scaling applies only to 'rope'",
                                  path, checkpoint.config.model.position.kind));
  checkpoint.step = read_trainer_state(paths.step_dir).step;
  checkpoint.label = run_name(paths);
  return checkpoint;
}

std::unique_ptr<Model> load_eval_model(const EvalCheckpoint& checkpoint, Backend& backend) {
  auto model = std::make_unique<Model>(checkpoint.config.model, backend);
  const CheckpointData data = load_checkpoint(checkpoint.step_dir, model->layout(), /*weights_only=*/true);
  model->parameters_from_host(data.params);
  return model;
}

std::string describe_position(const PositionConfig& position) {
  if (position.kind != "rope" || position.rope.scaling.kind == RopeScalingKind::none) return position.kind;
  const RopeScalingConfig& s = position.rope.scaling;
  if (s.kind == RopeScalingKind::dynamic_ntk) return "rope+dynamic_ntk";
  if (s.kind != RopeScalingKind::yarn) return fmt::format("rope+{}(s={})", name_of(s.kind), s.factor);
  std::string text = fmt::format("rope+yarn(s={} a={} b={}", s.factor, s.yarn_alpha, s.yarn_beta);
  if (s.yarn_temperature > 0.0) text += fmt::format(" t={}", s.yarn_temperature);
  return text + ")";
}

}  // namespace pope
