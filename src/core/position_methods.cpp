#include "position_methods.hpp"

namespace pope {

namespace {

constexpr PjSectorMask kAffineOnly{false, true, false};
constexpr PjSectorMask kAllSectors{true, true, true};

std::vector<PositionMethod> make_methods() {
  using T = MethodTransform;
  return {
      {"nope", T::none, "", std::nullopt},
      {"none", T::none, "", std::nullopt},
      {"rope", T::rope, "", std::nullopt},
      {"pope", T::pope, "", std::nullopt},
      {"alibi", T::none, "", std::nullopt, /*alibi=*/true},
      {"rope_pi", T::rope, "pi", std::nullopt},
      {"rope_ntk", T::rope, "ntk", std::nullopt},
      {"rope_yarn", T::rope, "yarn", std::nullopt},
      {"rope_ntk_affine", T::rope, "ntk", kAffineOnly},
      {"rope_yarn_affine", T::rope, "yarn", kAffineOnly},
      {"pj_rotary", T::pj_rotary, "", std::nullopt},
      {"affine", T::none, "", kAffineOnly},
      {"fj_affine", T::none, "", PjSectorMask{true, true, false}},
      {"fj_lc", T::none, "", PjSectorMask{true, false, true}},
      {"rope_affine", T::rope, "", kAffineOnly},
      {"full", T::none, "", kAllSectors},
      {"lc_affine", T::none, "", PjSectorMask{false, true, true}},
      {"pjrope", T::none, "", kAllSectors},  // the configs' name for `full`
  };
}

}  // namespace

const std::vector<PositionMethod>& position_methods() {
  static const std::vector<PositionMethod> methods = make_methods();
  return methods;
}

const PositionMethod* find_position_method(std::string_view name) {
  for (const PositionMethod& method : position_methods())
    if (method.name == name) return &method;
  return nullptr;
}

std::string position_method_names() {
  std::string names;
  for (const PositionMethod& method : position_methods()) {
    if (!names.empty()) names += ", ";
    names += method.name;
  }
  return names;
}

}  // namespace pope
