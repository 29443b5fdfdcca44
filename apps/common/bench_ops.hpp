// The ops overlap-bench measures, each described once: its --op flag, its
// library name, its variants (the names of its layout option) with the
// blocks of A, B and C each rank holds, its calls, and the hand-written
// pipeline peer where one exists. overlap-bench's code goes through this
// table: a new op is a new entry here, not a branch in the app. `call` and
// `schedule_of` forward to the library's call (context, a, b, c, options),
// whose element type the views give.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "overlap/overlap.hpp"
#include "pipeline_peer.hpp"

namespace overlap::apps::bench_ops {

/// How a rank holds one of A, B, C: a balanced block of its rows (A: of M,
/// B: of K, C: of M), of its columns (A: of K, B: of N, C: of N), or whole.
enum class cut { rows, cols, whole };

/// A variant of an op: its layout option's value and each operand's cut.
struct variant {
  const char* name;
  cut a, b, c;
  const char* what;  ///< for --help's footer
};

/// The arguments of a hand-written pipeline peer (f32).
struct peer_args {
  int chunks;
  int64_t m;
  matrix_view<const float> a, b;
  matrix_view<float> c;
};

struct all_gather_matmul {
  using options = ag_options;
  static constexpr const char* flag = "ag";
  static constexpr const char* name = "all_gather_matmul";
  static constexpr auto layout = &ag_options::gathered;
  static std::vector<variant> variants() {
    return {{"lhs_rows", cut::rows, cut::cols, cut::cols, "A's rows gathered"},
            {"lhs_cols", cut::cols, cut::cols, cut::cols, "A's columns gathered"},
            {"rhs_rows", cut::rows, cut::rows, cut::rows, "B's rows gathered"},
            {"rhs_cols", cut::rows, cut::cols, cut::rows, "B's columns gathered"}};
  }
  static constexpr auto call = [](auto&&... x) { overlap::all_gather_matmul(std::forward<decltype(x)>(x)...); };
  static constexpr auto schedule_of = [](auto&&... x) {
    return overlap::all_gather_matmul_schedule(std::forward<decltype(x)>(x)...);
  };
  static std::optional<peer> pipeline(const std::string& v, const peer_args& x) {
    if (v != "lhs_rows") return std::nullopt;
    return ag_rows_pipeline(x.chunks, x.m, x.a, x.b, x.c);
  }
};

struct matmul_reduce_scatter {
  using options = rs_options;
  static constexpr const char* flag = "rs";
  static constexpr const char* name = "matmul_reduce_scatter";
  static constexpr auto layout = &rs_options::scattered;
  static std::vector<variant> variants() {
    return {{"rows", cut::cols, cut::rows, cut::rows, "partial sums scattered by rows"},
            {"cols", cut::cols, cut::rows, cut::cols, "partial sums scattered by columns"}};
  }
  static constexpr auto call = [](auto&&... x) { overlap::matmul_reduce_scatter(std::forward<decltype(x)>(x)...); };
  static constexpr auto schedule_of = [](auto&&... x) {
    return overlap::matmul_reduce_scatter_schedule(std::forward<decltype(x)>(x)...);
  };
  static std::optional<peer> pipeline(const std::string& v, const peer_args& x) {
    if (v != "rows") return std::nullopt;
    return rs_rows_pipeline(x.chunks, x.m, x.a, x.b, x.c);
  }
};

struct matmul_all_reduce {
  using options = ar_options;
  static constexpr const char* flag = "ar";
  static constexpr const char* name = "matmul_all_reduce";
  static constexpr auto layout = &ar_options::reduced;
  static std::vector<variant> variants() {
    return {{"rows", cut::cols, cut::rows, cut::whole, "partial sums reduced in row groups"},
            {"cols", cut::cols, cut::rows, cut::whole, "... in column groups"}};
  }
  static constexpr auto call = [](auto&&... x) { overlap::matmul_all_reduce(std::forward<decltype(x)>(x)...); };
  static constexpr auto schedule_of = [](auto&&... x) {
    return overlap::matmul_all_reduce_schedule(std::forward<decltype(x)>(x)...);
  };
  static std::optional<peer> pipeline(const std::string& /*v*/, const peer_args& /*x*/) { return std::nullopt; }
};

/// Every op, the first being --op's default.
using all = std::tuple<all_gather_matmul, matmul_reduce_scatter, matmul_all_reduce>;

/// Calls f(Op{}) for every op of the table, in order.
template <class F>
void for_each(F&& f) {
  std::apply([&](auto... op) { (f(op), ...); }, all{});
}

/// The variant named `v` of the op flagged `flag`, if it has one.
inline std::optional<variant> find_variant(const std::string& flag, const std::string& v) {
  std::optional<variant> found;
  for_each([&](auto op) {
    if (flag != decltype(op)::flag) return;
    for (const variant& x : decltype(op)::variants())
      if (v == x.name) found = x;
  });
  return found;
}

}  // namespace overlap::apps::bench_ops
