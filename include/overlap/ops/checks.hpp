#pragma once
/// @file
/// Checks every op makes on its own arguments: options with enum values,
/// dimensions that must match (messages built only on failure), and the
/// backend the context has for the element type.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "overlap/core/dtype.hpp"
#include "overlap/core/epilogue.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/ops/geometry.hpp"
#include "overlap/ops/op_id.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/runtime/context.hpp"

namespace overlap::detail {

/// floor(a / b) for b > 0.
[[nodiscard]] inline int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && (a < 0)); }

/// Whether two strided row-major blocks share a byte: x and y start at byte
/// addresses bx, by and have rows of `cols` bytes every `ld` bytes. Exact,
/// and O(1) unless their address spans intersect.
[[nodiscard]] inline bool blocks_overlap(uintptr_t bx, int64_t rx, int64_t cx, int64_t ldx, uintptr_t by, int64_t ry,
                                         int64_t cy, int64_t ldy) {
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
  /// The op (its id and names, of static storage: its op_info's), its
  /// element type, and the value of its layout option as messages name the
  /// call ("lhs_rows"); the string must outlive the checks.
  arg_checks(op_id id, const entry_names& names, dtype type, const char* layout_value)
      : id_(id), names_(&names), type_(type), layout_value_(layout_value) {}
  /// Records the message unless cond holds or an earlier rule already
  /// failed. `msg` is a string, or a callable that makes it: the cached-plan
  /// path passes callables, so a check that passes builds no text.
  template <class Msg>
  void require(bool cond, Msg&& msg) {
    if (cond || !failure_.empty()) return;
    if constexpr (std::is_invocable_v<Msg>)
      failure_ = msg();
    else
      failure_ = std::forward<Msg>(msg);
  }
  /// An option holds one of its enum's values (not a cast from a bad integer).
  template <class E>
  void valid(const char* opts, const char* field, E e) {
    require(is_valid(e), [&] {
      return std::string(opts) + field + " has an invalid value " + std::to_string(static_cast<int64_t>(e));
    });
  }
  /// The epilogue's bias is of the op's element type, and c does not overlap it.
  template <class T>
  void bias(const typed_bias& values, const matrix_view<T>& c) {
    require(values.fits<T>(), [&] {
      return std::string("the epilogue's bias holds ") + to_string(values.type()) +
             " values; this op's element type is " + to_string(dtype_of<T>());
    });
    if (values && values.fits<T>())
      disjoint("c", c, "the epilogue's bias", matrix_view<const T>(values.get<T>(), 1, c.cols));
  }
  template <class T>
  void view(const char* name, const matrix_view<T>& v) {
    if (v.rows >= 0 && v.cols >= 0 && v.ld >= v.cols && (v.empty() || v.data != nullptr)) return;
    const std::string n(name);  // messages are built only for a view that breaks a rule
    require(v.rows >= 0, n + ".rows (" + std::to_string(v.rows) + ") must be >= 0");
    require(v.cols >= 0, n + ".cols (" + std::to_string(v.cols) + ") must be >= 0");
    require(v.ld >= v.cols,
            n + ".ld (" + std::to_string(v.ld) + ") must be >= " + n + ".cols (" + std::to_string(v.cols) + ")");
    require(v.empty() || v.data != nullptr, n + ".data must not be null for a non-empty " + std::to_string(v.rows) +
                                                " x " + std::to_string(v.cols) + " view");
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
  /// A strided batch's count and strides (overlap::batch), and that the
  /// members of x.c alias neither each other nor those of x.a and x.b.
  template <class Args>
  void batch(const overlap::batch& b, const Args& x) {
    require(b.count >= 1, [&] { return "batch.count (" + std::to_string(b.count) + ") must be >= 1"; });
    for (const auto& f : {std::pair{b.a, "a"}, std::pair{b.b, "b"}, std::pair{b.c, "c"}, std::pair{b.out, "out"}})
      require(f.first >= 0,
              [&] { return "batch." + std::string(f.second) + " (" + std::to_string(f.first) + ") must be >= 0"; });
    disjoint_members("c", x.c, b.c, "c", x.c, b.c, b.count);
    disjoint_members("c", x.c, b.c, "a", x.a, b.a, b.count);
    disjoint_members("c", x.c, b.c, "b", x.b, b.b, b.count);
  }
  /// With a batch: no member of the output `out` (stride so) shares a byte
  /// with another member of it (other == out) or with any member of `other`
  /// (stride sy). Exact; pairs are walked only where the batches' address
  /// ranges meet (members interleaved).
  template <class T, class U>
  void disjoint_members(const char* out_name, const matrix_view<T>& out, int64_t so, const char* other_name,
                        const matrix_view<U>& other, int64_t sy, int64_t count) {
    if (failed() || count == 1) return;
    const bool self = static_cast<const void*>(out.data) == static_cast<const void*>(other.data) && so == sy;
    const auto es = static_cast<int64_t>(sizeof(std::remove_const_t<T>)), eu = static_cast<int64_t>(sizeof(U));
    const auto bx = reinterpret_cast<uintptr_t>(out.data), by = reinterpret_cast<uintptr_t>(other.data);
    auto member_overlap = [&](int64_t i, int64_t j) {
      return blocks_overlap(bx + static_cast<uintptr_t>(i * so * es), out.rows, out.cols * es, out.ld * es,
                            by + static_cast<uintptr_t>(j * sy * eu), other.rows, other.cols * eu, other.ld * eu);
    };
    // The whole batches as (count x 1) "blocks" of their members' spans: disjoint ranges need no pair.
    auto span = [](const auto& v, int64_t e) { return v.empty() ? 0 : ((v.rows - 1) * v.ld + v.cols) * e; };
    const auto end_x = bx + static_cast<uintptr_t>((count - 1) * so * es + span(out, es));
    const auto end_y = by + static_cast<uintptr_t>((count - 1) * sy * eu + span(other, eu));
    if (end_x <= by || end_y <= bx) return;
    for (int64_t i = 0; i < (self ? 1 : count); ++i)  // self: member 0 against j stands for every pair j apart
      for (int64_t j = self ? 1 : 0; j < count; ++j)
        if (member_overlap(i, j)) {
          require(false, std::string(out_name) + "'s batch member " + std::to_string(i) + " overlaps " + other_name +
                             "'s member " + std::to_string(j) + " in memory (its batch stride is " +
                             std::to_string(so) +
                             " elements); outputs must not alias each other or the op's other "
                             "arguments");
          return;
        }
  }
  [[nodiscard]] bool failed() const noexcept { return !failure_.empty(); }
  [[nodiscard]] const std::string& failure() const noexcept { return failure_; }
  /// The call as messages name it: "overlap::all_gather_matmul(gathered=lhs_rows)".
  [[nodiscard]] std::string op() const {
    return std::string(names_->call) + "(" + names_->layout + "=" + layout_value_ + ")";
  }
  [[nodiscard]] op_id id() const noexcept { return id_; }
  /// The op's names (its op_info's).
  [[nodiscard]] const entry_names& names() const noexcept { return *names_; }
  [[nodiscard]] dtype type() const noexcept { return type_; }

 private:
  op_id id_;
  const entry_names* names_;  ///< static storage: the op's op_info
  dtype type_;
  const char* layout_value_;
  std::string failure_;
};

/// A dimension of a call's view as messages name it: "a.cols" becomes
/// "a^T.cols" when a is stored transposed (likewise b; c is never transposed).
inline std::string dim_name(const char* dim, bool trans_a, bool trans_b) {
  const bool t = (dim[0] == 'a' && trans_a) || (dim[0] == 'b' && trans_b);
  return t ? std::string(dim, 1) + "^T" + (dim + 1) : std::string(dim);
}
/// Requires v1 == v2 of two dimensions of a call's views (names as in
/// dim_name, `what` appended); the message is built only when they differ.
inline void require_equal(arg_checks& checks, bool trans_a, bool trans_b, int64_t v1, const char* n1, int64_t v2,
                          const char* n2, const char* what = "") {
  checks.require(v1 == v2, [&] {
    return dim_name(n1, trans_a, trans_b) + " (" + std::to_string(v1) + ") must equal " +
           dim_name(n2, trans_a, trans_b) + " (" + std::to_string(v2) + ")" + what;
  });
}

/// Checks the options all ops share.
inline void check_common_options(arg_checks& checks, const char* opts, overlap::strategy s, overlap::algorithm alg,
                                 const epilogue& e) {
  checks.valid(opts, ".strategy", s);
  checks.require(s != strategy::pairwise, [&] {
    return std::string(opts) + ".strategy pairwise is a schedule of the all-to-all ops; this op runs bulk, ring, " +
           "bidirectional, hierarchical or automatic";
  });
  checks.valid(opts, ".algorithm", alg);
  checks.valid(opts, ".epilogue.activation", e.activation);
  if (alg == algorithm::others && (s == strategy::ring || s == strategy::bidirectional || s == strategy::hierarchical))
    checks.require(false, std::string(opts) + ".algorithm others is not a ring schedule; " + opts + ".strategy " +
                              to_string(s) + " cannot run it (use bulk or automatic)");
}

/// The checks of one rank that every matmul op makes, in this order: its
/// layout option (Op::layout) and the options every op has, the views a, b
/// and c, that c overlaps neither input, the bias, and the batch.
template <class Op>
void check_matmul_args(arg_checks& checks, const typename Op::options& opt, const typename Op::args& x) {
  const entry_names& names = Op::names;
  checks.valid(names.layout_option, "", opt.*Op::layout);
  check_common_options(checks, names.options, opt.strategy, opt.algorithm, opt.epilogue);
  checks.view("a", x.a);
  checks.view("b", x.b);
  checks.view("c", x.c);
  checks.disjoint("c", x.c, "a", x.a);
  checks.disjoint("c", x.c, "b", x.b);
  checks.bias(opt.epilogue.bias, x.c);
  checks.batch(opt.batch, x);
}

/// The backend for T under ctx's config as a plan-key value; a combination no
/// backend has becomes a failed check (reported on every rank by agree()).
template <class T>
int checked_backend(const context& ctx, arg_checks& checks) {
  try {
    return static_cast<int>(ctx.backend_for<T>());
  } catch (const std::invalid_argument& e) {
    checks.require(false, e.what());
    return -1;
  }
}

}  // namespace overlap::detail
