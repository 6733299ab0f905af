#include <gtest/gtest.h>

#include <set>

#include "pope/rng.hpp"
#include "pope/tensor.hpp"

using namespace pope;

TEST(ParameterLayout, AlignsOffsetsAndViewsByName) {
  ParameterLayout layout;
  layout.add({"a", {3, 5}, true});
  layout.add({"b", {7}, false});
  EXPECT_EQ(layout.offset(0), 0);
  EXPECT_EQ(layout.offset(1), 64);
  EXPECT_EQ(layout.total_numel(), 128);
  std::vector<float> flat(128);
  Tensor t{flat.data(), DType::f32, DeviceKind::cpu, {128}};
  Tensor b = layout.view(t, "b");
  EXPECT_EQ(b.as<float>(), flat.data() + 64);
  EXPECT_EQ(b.shape, (Shape{7}));
  EXPECT_THROW(layout.index_of("c"), std::out_of_range);
  EXPECT_THROW(layout.add({"a", {1}}), std::logic_error);
  EXPECT_THROW((void)b.as<double>(), std::logic_error);
}

TEST(Tensor, RowsAndReshape) {
  std::vector<double> v(12);
  Tensor t{v.data(), DType::f64, DeviceKind::cpu, {4, 3}};
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.as<double>(), v.data() + 3);
  EXPECT_EQ(r.shape, (Shape{2, 3}));
  EXPECT_THROW(t.rows(2, 5), std::logic_error);
  EXPECT_EQ(t.reshaped({2, 6}).shape, (Shape{2, 6}));
  EXPECT_THROW(t.reshaped({5}), std::logic_error);
}

TEST(Rng, DeterministicAndRestorable) {
  Rng a(42), b(42), c(43);
  EXPECT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(a.next_u64(), c.next_u64());
  auto saved = a.state();
  const double x = a.normal();
  a.set_state(saved);
  EXPECT_EQ(a.normal(), x);
}

TEST(Rng, MomentsOfUniformAndNormal) {
  Rng r(7);
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  std::set<std::uint64_t> below;
  for (int i = 0; i < n; ++i) {
    su += r.uniform();
    const double z = r.normal();
    sn += z;
    sn2 += z * z;
    below.insert(r.below(5));
  }
  EXPECT_NEAR(su / n, 0.5, 0.005);
  EXPECT_NEAR(sn / n, 0.0, 0.01);
  EXPECT_NEAR(sn2 / n, 1.0, 0.02);
  EXPECT_EQ(below, (std::set<std::uint64_t>{0, 1, 2, 3, 4}));
}
