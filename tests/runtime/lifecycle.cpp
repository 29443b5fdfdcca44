// A context used outside MPI's lifetime must say so, not crash inside MPI:
// created before MPI_Init, an op called after MPI_Finalize, created after
// MPI_Finalize, and destroyed after MPI_Finalize. Exits 0 when every case
// gave the expected std::logic_error.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "overlap/overlap.hpp"

namespace {
int failures = 0;
template <class F>
void expect_logic_error(const char* what, const char* needle, F&& f) {
  try {
    f();
    std::fprintf(stderr, "FAIL: %s: no exception\n", what);
    ++failures;
  } catch (const std::logic_error& e) {
    if (std::string(e.what()).find(needle) == std::string::npos) {
      std::fprintf(stderr, "FAIL: %s: message '%s' lacks '%s'\n", what, e.what(), needle);
      ++failures;
    } else {
      std::printf("ok: %s: %s\n", what, e.what());
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  expect_logic_error("context before MPI_Init", "MPI is not initialised",
                     [] { overlap::context early(MPI_COMM_WORLD); });
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto* ctx = new overlap::context(MPI_COMM_WORLD);
  std::vector<float> a(2 * 3, 1.0f), b(3 * 4, 1.0f), c(2 * static_cast<size_t>(size) * 4);
  auto call = [&] {
    overlap::all_gather_matmul<float>(*ctx, {a.data(), 2, 3}, {b.data(), 3, 4}, {c.data(), 2 * int64_t{size}, 4});
  };
  call();
  if (c[0] != 3.0f) {
    std::fprintf(stderr, "FAIL: a valid call gave %g, not 3\n", double(c[0]));
    ++failures;
  }
  MPI_Finalize();
  expect_logic_error("op after MPI_Finalize", "MPI has already been finalised", call);
  expect_logic_error("context after MPI_Finalize", "MPI has already been finalised",
                     [] { overlap::context late(MPI_COMM_WORLD); });
  delete ctx;  // frees nothing in MPI (finalised), must not crash
  std::printf("rank %d: %s\n", rank, failures == 0 ? "all lifecycle checks passed" : "lifecycle checks FAILED");
  return failures == 0 ? 0 : 1;
}
