// The method names of model.position.kind (spec positional-encodings.md, section 5.3) and
// what each is made of: a q/k transform from one encoding plus, optionally, a PJ-bias with
// some of its sectors enabled. The factory builds encodings from this table and the config
// checks use it, so a method's composition is written down exactly once.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pope {

// Which sectors of the PJ-bias are enabled (spec 5.1): Fourier–jet, affine, light-cone.
enum PjSector : int { kPjFourierJet = 0, kPjAffine = 1, kPjLightCone = 2, kPjSectorCount = 3 };
using PjSectorMask = std::array<bool, kPjSectorCount>;

// Largest jet order K of the PJ-bias and PJ-rotary (model.position.pj.order, rotary_order):
// per-order arrays are fixed-size so that evaluating a lag allocates nothing, and the CUDA
// kernels hold one head's orders in registers.
inline constexpr int kMaxPjOrder = 15;

enum class MethodTransform { none, rope, pope, pj_rotary };

struct PositionMethod {
  std::string_view name;
  MethodTransform transform = MethodTransform::none;
  // rope methods that fix the scaling (rope_pi → "pi"); empty: model.position.rope.scaling.kind.
  std::string_view rope_scaling;
  // Sectors of the PJ-bias this method adds; no value: no PJ-bias.
  std::optional<PjSectorMask> pj_bias;
  // ALiBi's fixed bias (the one method with a non-PJ bias).
  bool alibi = false;

  bool adds_score_bias() const { return alibi || pj_bias.has_value(); }
};

// Every method, in the order the docs list them.
const std::vector<PositionMethod>& position_methods();
// The method called `name`, or nullptr.
const PositionMethod* find_position_method(std::string_view name);
// "nope, rope, …" for error messages.
std::string position_method_names();

}  // namespace pope
