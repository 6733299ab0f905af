// How close two vectors (gradients, weight updates) are in direction and size: the measures the
// FP8 tests hold a quantised result to, against an exact one.
#pragma once

#include <cmath>
#include <vector>

namespace pope::testing {

// a · b / (|a| |b|).
template <class T> double cosine(const std::vector<T>& a, const std::vector<T>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += double(a[i]) * double(b[i]);
    aa += double(a[i]) * double(a[i]);
    bb += double(b[i]) * double(b[i]);
  }
  return ab / std::sqrt(aa * bb);
}

// |a| / |b|.
template <class T> double norm_ratio(const std::vector<T>& a, const std::vector<T>& b) {
  double aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    aa += double(a[i]) * double(a[i]);
    bb += double(b[i]) * double(b[i]);
  }
  return std::sqrt(aa / bb);
}

}  // namespace pope::testing
