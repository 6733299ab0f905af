// The median of a benchmark's timings (the mean of the two middle ones for an even count; 0 for
// none): every pope-bench mode reports medians, robust to the odd slow call.
#pragma once

#include <algorithm>
#include <vector>

namespace pope {

inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace pope
