#pragma once
/// @file
/// The library's version. CMake reads the three macros below for the package
/// version (CMakeLists.txt), so they are the one place a release changes.
/// Releases follow semantic versioning: an API or ABI change that breaks
/// callers raises MAJOR, which is also what the CMake package's
/// SameMajorVersion compatibility checks.

#define OVERLAP_VERSION_MAJOR 0  ///< raised by changes that break callers
#define OVERLAP_VERSION_MINOR 2  ///< raised by additions
#define OVERLAP_VERSION_PATCH 0  ///< raised by fixes

/// MAJOR * 10000 + MINOR * 100 + PATCH, for `#if OVERLAP_VERSION >= 200`.
#define OVERLAP_VERSION (OVERLAP_VERSION_MAJOR * 10000 + OVERLAP_VERSION_MINOR * 100 + OVERLAP_VERSION_PATCH)

/// Makes a string literal of a macro's value (OVERLAP_VERSION_STRING).
#define OVERLAP_STRINGIZE(x) OVERLAP_STRINGIZE_VALUE_(x)
#define OVERLAP_STRINGIZE_VALUE_(x) #x  ///< OVERLAP_STRINGIZE's second step (x is expanded first)
/// "MAJOR.MINOR.PATCH" as a string literal.
#define OVERLAP_VERSION_STRING             \
  OVERLAP_STRINGIZE(OVERLAP_VERSION_MAJOR) \
  "." OVERLAP_STRINGIZE(OVERLAP_VERSION_MINOR) "." OVERLAP_STRINGIZE(OVERLAP_VERSION_PATCH)

namespace overlap {

/// The version of the headers a program was built with, "MAJOR.MINOR.PATCH"
/// (OVERLAP_VERSION_STRING). Local; needs no MPI.
constexpr const char* version() noexcept { return OVERLAP_VERSION_STRING; }

}  // namespace overlap
