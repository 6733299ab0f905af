// The registry of positional encodings: every value of model.position.kind, with the factory
// that builds it from a ModelConfig and the config keys it reads. The built-in methods (spec
// of the PoPE and PJ-RoPE papers, section 5.3 for the compositions) are rows of
// builtin_methods.cpp; an encoding in a file of its own registers itself there with a
// PositionMethodRegistration, so adding one edits no table elsewhere
// (docs/adding-an-encoding.md). The config schema, the factory, the bench and the generic
// test suites all read this one list.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/config_schema.hpp"
#include "pope/config.hpp"
#include "pope/position.hpp"

namespace pope {

// Which sectors of the PJ-bias are enabled (spec 5.1): Fourier–jet, affine, light-cone.
enum PjSector : int { kPjFourierJet = 0, kPjAffine = 1, kPjLightCone = 2, kPjSectorCount = 3 };
using PjSectorMask = std::array<bool, kPjSectorCount>;

// Largest jet order K of the PJ-bias and PJ-rotary (model.position.pj.order, rotary_order):
// per-order arrays are fixed-size so that evaluating a lag allocates nothing, and the CUDA
// kernels hold one head's orders in registers.
inline constexpr int kMaxPjOrder = 15;

// Builds the encoding from the model config; throws ConfigError naming the offending key.
using EncodingFactory = std::unique_ptr<PositionEncoding> (*)(const ModelConfig&);

struct PositionMethod {
  std::string_view name;      // the value of model.position.kind
  EncodingFactory make = nullptr;
  std::string_view summary;   // one line: what it is, for --help and the docs' tables
  // Another name of the same method (none = nope, pjrope = full): left out of the lists that
  // run every method once (the generic tests, pope-bench attention).
  bool alias = false;
};

// Registers a method (and the config keys its factory reads, model.position.<name>.*) while
// the program starts. Declare one at namespace scope in the encoding's own .cpp.
struct PositionMethodRegistration {
  explicit PositionMethodRegistration(PositionMethod method, std::vector<config_schema::Field> keys = {});
};

// Every method: the built-in ones in the docs' order, then the registered ones by name.
const std::vector<PositionMethod>& position_methods();
// The method called `name`, or nullptr.
const PositionMethod* find_position_method(std::string_view name);
// "nope, rope, …" for error messages.
std::string position_method_names();
// The config keys of the registered methods, in registration-name order.
std::vector<config_schema::Field> registered_position_keys();

}  // namespace pope
