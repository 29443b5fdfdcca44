// The version: overlap::version() agrees with the macros it is made from and
// with the CMake package's version (OVERLAP_PACKAGE_VERSION, passed by
// tests/CMakeLists.txt from project(VERSION), which CMake reads from
// version.hpp), and OVERLAP_VERSION orders as documented.
#include <gtest/gtest.h>

#include <string>

#include <overlap/core/version.hpp>

TEST(version, the_string_is_the_macros) {
  const std::string want = std::to_string(OVERLAP_VERSION_MAJOR) + "." + std::to_string(OVERLAP_VERSION_MINOR) + "." +
                           std::to_string(OVERLAP_VERSION_PATCH);
  EXPECT_EQ(std::string(overlap::version()), want);
  EXPECT_EQ(OVERLAP_VERSION, OVERLAP_VERSION_MAJOR * 10000 + OVERLAP_VERSION_MINOR * 100 + OVERLAP_VERSION_PATCH);
  static_assert(OVERLAP_VERSION_MINOR < 100 && OVERLAP_VERSION_PATCH < 100, "OVERLAP_VERSION's packing");
}

TEST(version, the_package_has_the_same_version) { EXPECT_EQ(std::string(overlap::version()), OVERLAP_PACKAGE_VERSION); }
