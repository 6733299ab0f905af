// NoPE (docs/encodings.md, section 1): it keeps every default of
// PositionEncoding (no transform, no bias, no parameters, scale 1/√d); only its name is
// defined here, out of line, so that its vtable has one home.
#include "position/encodings.hpp"

namespace pope {

std::string NopeEncoding::kind() const { return "nope"; }

}  // namespace pope
