#pragma once
/// @file
/// Argument checks that end the same way on every rank.
///
/// A local check that fails on one rank must not leave the other ranks in a
/// collective: every op call first runs one small MPI_Allreduce that carries
/// (any rank failed?, any rank lacks the plan?, the plans' fingerprints, the
/// op and the element type). Ranks that called different ops, or one op with
/// different element types, are told so on every rank. Only on a plan miss
/// are the per-rank sizes exchanged, and the cross-rank rules are then
/// checked on that exchange, identically on every rank. Building the plan
/// (buffers, datatypes, primitives) is agreed on too, before any transfer.

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <string>
#include <vector>

#include "overlap/context.hpp"
#include "overlap/failure.hpp"
#include "overlap/matrix.hpp"

namespace overlap::detail {

/// The ops, as the agreement and the plan keys name them.
enum class op_id : int64_t { all_gather_matmul = 1, matmul_reduce_scatter = 2 };

[[nodiscard]] inline const char* to_string(op_id op) {
  return op == op_id::all_gather_matmul ? "all_gather_matmul" : "matmul_reduce_scatter";
}

/// floor(a / b) for b > 0.
[[nodiscard]] inline int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && (a < 0)); }

/// Whether two strided row-major blocks share a byte: x and y start at byte
/// addresses bx, by and have rows of `cols` bytes every `ld` bytes. Exact,
/// and O(1) unless their address spans intersect.
[[nodiscard]] inline bool blocks_overlap(uintptr_t bx, int64_t rx, int64_t cx, int64_t ldx, uintptr_t by,
                                         int64_t ry, int64_t cy, int64_t ldy) {
  if (rx == 0 || cx == 0 || ry == 0 || cy == 0) return false;
  const auto span = [](int64_t r, int64_t c, int64_t ld) { return static_cast<uintptr_t>((r - 1) * ld + c); };
  if (bx + span(rx, cx, ldx) <= by || by + span(ry, cy, ldy) <= bx) return false;
  if (ry > rx) {  // walk the block with fewer rows
    std::swap(bx, by), std::swap(rx, ry), std::swap(cx, cy), std::swap(ldx, ldy);
  }
  for (int64_t j = 0; j < ry; ++j) {
    // Row j of y is [s, e); row i of x meets it iff bx + i ldx < e and bx + i ldx + cx > s.
    const auto s = static_cast<int64_t>(by - bx) + j * ldy, e = s + cy;
    const int64_t lo = std::max<int64_t>(0, floor_div(s - cx, ldx) + 1);
    const int64_t hi = std::min<int64_t>(rx - 1, floor_div(e - 1, ldx));
    if (lo <= hi) return true;
  }
  return false;
}

/// Collects the first failed rule of a call on this rank.
class arg_checks {
 public:
  arg_checks(op_id id, dtype type, std::string op) : id_(id), type_(type), op_(std::move(op)) {}
  /// Records msg unless cond holds or an earlier rule already failed.
  void require(bool cond, const std::string& msg) {
    if (!cond && failure_.empty()) failure_ = msg;
  }
  template <class T>
  void view(const char* name, const matrix_view<T>& v) {
    if (v.rows >= 0 && v.cols >= 0 && v.ld >= v.cols && (v.empty() || v.data != nullptr)) return;
    const std::string n(name);  // messages are built only for a view that breaks a rule
    require(v.rows >= 0, n + ".rows (" + std::to_string(v.rows) + ") must be >= 0");
    require(v.cols >= 0, n + ".cols (" + std::to_string(v.cols) + ") must be >= 0");
    require(v.ld >= v.cols, n + ".ld (" + std::to_string(v.ld) + ") must be >= " + n + ".cols (" +
                                std::to_string(v.cols) + ")");
    require(v.empty() || v.data != nullptr, n + ".data must not be null for a non-empty " +
                                                std::to_string(v.rows) + " x " + std::to_string(v.cols) +
                                                " view");
  }
  /// An output must not share memory with another view of the call (the ring
  /// writes it while the other is still read, or sent).
  template <class T, class U>
  void disjoint(const char* out_name, const matrix_view<T>& out, const char* other_name, const matrix_view<U>& other) {
    if (failed()) return;  // views may be invalid
    const auto es = static_cast<int64_t>(sizeof(std::remove_const_t<T>)), eu = static_cast<int64_t>(sizeof(U));
    if (blocks_overlap(reinterpret_cast<uintptr_t>(out.data), out.rows, out.cols * es, out.ld * es,
                       reinterpret_cast<uintptr_t>(other.data), other.rows, other.cols * eu, other.ld * eu))
      require(false, std::string(out_name) + " overlaps " + other_name +
                         " in memory; outputs must not alias the op's other arguments");
  }
  [[nodiscard]] bool failed() const noexcept { return !failure_.empty(); }
  [[nodiscard]] const std::string& failure() const noexcept { return failure_; }
  [[nodiscard]] const std::string& op() const noexcept { return op_; }
  [[nodiscard]] op_id id() const noexcept { return id_; }
  [[nodiscard]] dtype type() const noexcept { return type_; }

 private:
  op_id id_;
  dtype type_;
  std::string op_;
  std::string failure_;
};

[[nodiscard]] inline uint64_t hash_values(const std::vector<int64_t>& values, uint64_t seed = 1469598103934665603ull) {
  uint64_t h = seed;  // FNV-1a over the bytes
  for (int64_t v : values) {
    auto u = static_cast<uint64_t>(v);
    for (int b = 0; b < 8; ++b) {
      h ^= (u >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

/// Collective: every rank's op and element type, when they differ somewhere;
/// throws std::invalid_argument naming rank 0's and the first rank that differs.
[[noreturn]] inline void report_mismatched_calls(context& ctx, const arg_checks& checks) {
  agreement_scratch& s = ctx.scratch();
  s.in[0] = static_cast<int64_t>(checks.id());
  s.in[1] = static_cast<int64_t>(checks.type());
  s.table.resize(2 * static_cast<size_t>(ctx.size()));
  ctx.collective(
      "MPI_Allgather",
      [&] { return MPI_Allgather(s.in, 2, MPI_INT64_T, s.table.data(), 2, MPI_INT64_T, ctx.comm()); },
      [&](MPI_Request* r) { return MPI_Iallgather(s.in, 2, MPI_INT64_T, s.table.data(), 2, MPI_INT64_T, ctx.comm(), r); },
      [&] { return checks.op() + " (comparing the calls of the ranks)"; });
  int r = 1;
  while (r < ctx.size() && s.table[2 * static_cast<size_t>(r)] == s.table[0] &&
         s.table[2 * static_cast<size_t>(r) + 1] == s.table[1])
    ++r;
  auto call = [&](int q) {
    const auto id = static_cast<op_id>(s.table[2 * static_cast<size_t>(q)]);
    const auto t = static_cast<dtype>(s.table[2 * static_cast<size_t>(q) + 1]);
    return std::string(to_string(id)) + "<" + to_string(t) + ">";
  };
  throw std::invalid_argument("overlap: the ranks of a context made different calls: rank 0 called " + call(0) +
                              ", rank " + std::to_string(r) + " called " + call(r) +
                              "; every rank must call the same op with the same element type, in the same order");
}

/// Collective. Throws std::invalid_argument on every rank when the ranks
/// called different ops or element types, or when any rank's checks failed
/// (the message is the lowest failing rank's). Returns true when every rank
/// holds a cached plan and all those plans were built together.
inline bool agree(context& ctx, const arg_checks& checks, const plan_base* cached) {
  agreement_scratch& s = ctx.scratch();
  // Fingerprints are masked to 62 bits so that negating them cannot overflow;
  // max(x) and max(-x) give the largest and smallest value of every field.
  const int64_t fp = cached ? static_cast<int64_t>(cached->fingerprint >> 2) : -1;
  const auto id = static_cast<int64_t>(checks.id()), type = static_cast<int64_t>(checks.type());
  const int64_t in[8] = {checks.failed() ? 1 : 0, cached ? 0 : 1, fp, -fp, id, -id, type, -type};
  std::copy(in, in + 8, s.in);
  ctx.collective(
      "MPI_Allreduce", [&] { return MPI_Allreduce(s.in, s.out, 8, MPI_INT64_T, MPI_MAX, ctx.comm()); },
      [&](MPI_Request* r) { return MPI_Iallreduce(s.in, s.out, 8, MPI_INT64_T, MPI_MAX, ctx.comm(), r); },
      [&] { return checks.op() + " (argument agreement)"; });
  if (s.out[4] != -s.out[5] || s.out[6] != -s.out[7]) report_mismatched_calls(ctx, checks);
  if (s.out[0] != 0)
    ctx.broadcast_failure(checks.failed() ? failure(failure::kind::invalid_argument, checks.failure()) : failure(),
                          checks.op());
  return s.out[1] == 0 && s.out[2] == -s.out[3];
}

/// Collective: every rank's `mine` (all of the same length, which agree()
/// ensured: same op); row r of the result is rank r's values.
[[nodiscard]] inline std::vector<int64_t> allgather_values(context& ctx, const std::vector<int64_t>& mine,
                                                           const std::string& op) {
  agreement_scratch& s = ctx.scratch();
  s.mine = mine;
  s.table.resize(mine.size() * static_cast<size_t>(ctx.size()));
  const int n = static_cast<int>(mine.size());
  ctx.collective(
      "MPI_Allgather",
      [&] { return MPI_Allgather(s.mine.data(), n, MPI_INT64_T, s.table.data(), n, MPI_INT64_T, ctx.comm()); },
      [&](MPI_Request* r) {
        return MPI_Iallgather(s.mine.data(), n, MPI_INT64_T, s.table.data(), n, MPI_INT64_T, ctx.comm(), r);
      },
      [&] { return op + " (exchanging shard sizes)"; });
  return s.table;
}

/// Builds a plan on this rank and agrees on the outcome with the others
/// before any transfer: if building failed anywhere (an allocation, a
/// datatype over MPI's limits, a primitive oneDNN cannot create), every rank
/// throws that rank's error. Collective.
template <class Build>
auto build_agreed(context& ctx, const std::string& op, Build&& build) -> decltype(build()) {
  failure local;
  decltype(build()) result{};
  try {
    result = build();
  } catch (...) {
    local = failure::capture(std::current_exception());
  }
  ctx.agree_on(local, op);
  return result;
}

}  // namespace overlap::detail
