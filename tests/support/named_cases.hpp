#pragma once
// Registered, named test cases: every combination a suite covers is its own
// gtest case with a readable name, so one failing case can be selected with
// --gtest_filter (e.g. '*lhs_cols_ring_named_onednn_chunks3_m31n17k37_skewed*').
// Contexts are shared by the cases of a suite, one per configuration.
#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "overlap/overlap.hpp"
#include "reference.hpp"

namespace testing_support {

/// The contexts of the running suite, one per configuration, created on first
/// use. Every rank runs every case in the same order, so creation is
/// collective as it must be; free_suite_contexts() (a suite's
/// TearDownTestSuite) frees them before MPI_Finalize.
inline std::map<std::string, std::unique_ptr<overlap::context>>& suite_contexts() {
  static std::map<std::string, std::unique_ptr<overlap::context>> contexts;
  return contexts;
}
inline overlap::context& suite_context(const overlap::config& cfg) {
  auto& c = suite_contexts()[overlap::describe(cfg)];
  if (!c) c = std::make_unique<overlap::context>(MPI_COMM_WORLD, cfg);
  return *c;
}
inline void free_suite_contexts() { suite_contexts().clear(); }

/// A fixture whose contexts live as long as its suite.
template <class Param>
class suite_with_contexts : public ::testing::TestWithParam<Param> {
 public:
  static void TearDownTestSuite() { free_suite_contexts(); }
};

/// A global shape M x N x K of a registered case.
struct sweep_shape {
  int64_t m, n, k;
};
/// The reduce-scatter and all-reduce sweeps' shapes: 1x1x1; primes; a
/// sharded extent smaller than the rank count; mid sizes.
inline const std::vector<sweep_shape> sweep_shapes = {{1, 1, 1}, {7, 13, 5}, {2, 3, 2}, {31, 17, 37}, {40, 64, 48}};
/// Every way a sweep shares a dimension over the ranks (reference.hpp).
inline const std::vector<split> every_split = {split::balanced, split::skewed, split::first_empty,
                                               split::last_takes_all};

/// A gtest name from parts: anything but letters and digits becomes '_'.
inline std::string case_name(const std::string& text) {
  std::string s;
  for (char ch : text) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s;
}

}  // namespace testing_support
