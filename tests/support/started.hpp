#pragma once
// What a test caller does between starting an op and waiting for it.
#include <gtest/gtest.h>

#include "overlap/runtime/context.hpp"
#include "reference.hpp"

namespace testing_support {

/// What a caller does while a started op runs: a product of its own (checked
/// exactly: small integers), while the context refuses other ops.
inline void independent_work(overlap::context& ctx) {
  EXPECT_TRUE(ctx.busy());
  matrix<float> a(24, 16), b(16, 20);
  for (int64_t i = 0; i < 24; ++i)
    for (int64_t j = 0; j < 16; ++j) a(i, j) = float((i + j) % 5);
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t j = 0; j < 20; ++j) b(i, j) = float((i * j) % 3);
  const reference r = naive_matmul(a, b);
  double sum = 0;
  for (int64_t i = 0; i < 24; ++i) sum += r.value(i, i % 20);
  EXPECT_GT(sum, 0.0);
}

}  // namespace testing_support
