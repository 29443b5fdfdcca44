#pragma once
/// @file
/// What ring attention's passes share (attention/ring_attention.hpp): the
/// problem the ranks agreed on, the checks and the agreement, the tiles of
/// a step, and how blocks are laid out as they travel.

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "overlap/attention/attention_options.hpp"
#include "overlap/attention/attention_tiles.hpp"
#include "overlap/attention/causal_split.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/mpi/workspace_allocator.hpp"
#include "overlap/ops/call_agreement.hpp"
#include "overlap/ops/checks.hpp"
#include "overlap/ops/choose.hpp"
#include "overlap/ops/op_id.hpp"
#include "overlap/ops/run.hpp"
#include "overlap/runtime/agreement.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/failure.hpp"
#include "overlap/runtime/watchdog.hpp"

namespace overlap::detail {
/// Ring attention's names and message tags (ops/op_id.hpp): each pass runs
/// one ring lane; messages name the call by its strategy.
template <>
struct op_info<op_id::ring_attention> : owns_tags<op_id::ring_attention> {
  static constexpr entry_names names{"overlap::ring_attention",    "", "", "attention_options", "strategy",
                                     "attention_options.strategy", ""};
};
/// The backward pass's.
template <>
struct op_info<op_id::ring_attention_backward> : owns_tags<op_id::ring_attention_backward> {
  static constexpr entry_names names{"overlap::ring_attention_backward", "", "", "attention_options", "strategy",
                                     "attention_options.strategy",       ""};
};
}  // namespace overlap::detail

namespace overlap::layers::attention::detail {

/// v as the type attention computes in.
template <class A, class T>
A widen(T v) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return A(static_cast<float>(v));
  else
    return A(v);
}
/// v as the element type.
template <class T, class A>
T narrow(A v) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return bfloat16(static_cast<float>(v));
  else
    return T(v);
}

/// Bytes rounded up to whole 64-byte units: blocks are sent in such units
/// when a message would exceed MPI's int count in bytes, and every block
/// starts 64-byte aligned.
inline int64_t padded(int64_t bytes) { return (bytes + 63) / 64 * 64; }

/// The call every rank agreed on.
struct problem {
  causal_split split{0, 1};  ///< where every rank's tokens sit
  dims d;                    ///< heads, head width, query rows per block
  bool causal = true;        ///< the causal mask applies
  bool ring = true;          ///< else the gather-first baseline
  ///@{
  /// The ranks, this rank, and its position on the ring.
  int ranks = 1, rank = 0, pos = 0;
  ///@}
  std::vector<int> order;  ///< the context's ring: element k is the rank at position k

  /// The rank whose K/V block this rank holds at ring step t: the block of
  /// the rank t positions after it (lane 0 carries blocks from the next
  /// rank on the ring to the previous one).
  [[nodiscard]] int src(int t) const { return order[size_t((pos + t) % ranks)]; }
  [[nodiscard]] int64_t rows(int r) const { return split.rows(r); }  ///< rank r's tokens
  /// The most tokens any rank holds (sizes the travelling blocks).
  [[nodiscard]] int64_t max_rows() const {
    int64_t m = 0;
    for (int r = 0; r < ranks; ++r) m = std::max(m, rows(r));
    return m;
  }
};

/// Calls f(tile) for every tile of this rank's queries against rank src's
/// keys that the mask leaves anything of: its two chunks against src's two.
template <class F>
void each_tile(const problem& pb, int src, F&& f) {
  for (int qw = 0; qw < 2; ++qw) {
    const token_range qc = pb.split.chunk(pb.rank, qw);
    const int qi = pb.split.chunk_index(pb.rank, qw);
    for (int kw = 0; kw < 2; ++kw) {
      const token_range kc = pb.split.chunk(src, kw);
      const int ki = pb.split.chunk_index(src, kw);
      if ((pb.causal && ki > qi) || qc.rows == 0 || kc.rows == 0) continue;
      f(tile{qw == 0 ? 0 : pb.split.chunk(pb.rank, 0).rows, qc.rows, kw == 0 ? 0 : pb.split.chunk(src, 0).rows, kc.rows,
             pb.causal && ki == qi});
    }
  }
}

/// The GEMMs of step t (on the block of src(t)): every tile's (tile_math::products).
template <class A>
void step_products(const problem& pb, int t, bool backward, std::vector<overlap::detail::gemm_work>& out) {
  each_tile(pb, pb.src(t), [&](const tile& x) { tile_math<A>::products(pb.d, x, backward, out); });
}

/// A pass on this rank as the cost model prices it. Pattern: the pass's
/// ring pattern, whose static step_count(pb), received_bytes(pb, t) and
/// sent_bytes(pb, t) its transfers use too; the products are each_tile's,
/// at the steps that compute (the first pb.ranks). A ring lists both step
/// by step; the baseline (ring false) its products one after the other,
/// its collectives left to the caller.
template <class Pattern>
overlap::detail::work pass_work(const problem& pb, bool backward, bool ring) {
  overlap::detail::work w;
  w.ring = ring;
  for (int t = 0; t < Pattern::step_count(pb); ++t) {
    overlap::detail::ring_step_work st;
    if (t < pb.ranks) step_products<typename Pattern::A>(pb, t, backward, st.products);
    st.recv = double(Pattern::received_bytes(pb, t));
    st.moved = st.recv + double(Pattern::sent_bytes(pb, t));
    if (ring)
      w.ring_steps.push_back(std::move(st));
    else
      w.gemms.insert(w.gemms.end(), st.products.begin(), st.products.end());
  }
  return w;
}

/// The unit blocks travel in: bytes, or 64-byte runs when the largest
/// message would exceed INT_MAX bytes.
struct unit {
  mpi::datatype owned;           ///< the 64-byte type, when used
  MPI_Datatype type = MPI_BYTE;  ///< what counts count
  int64_t bytes = 1;             ///< bytes per unit

  /// The unit for messages of at most `largest` bytes.
  explicit unit(int64_t largest) {
    if (largest <= std::numeric_limits<int>::max()) return;
    owned = mpi::contiguous_type(64, MPI_BYTE);
    type = owned.get(), bytes = 64;
  }
  /// b bytes (a multiple of 64) in units.
  [[nodiscard]] int count(int64_t b) const { return mpi::detail::to_count(b / bytes, "ring attention message"); }
};

/// The K/V block of `rows` tokens as it travels: K then V, dense, in T.
template <class T>
int64_t kv_bytes(int64_t rows, int64_t width) {
  return padded(2 * rows * width * int64_t(sizeof(T)));
}

/// Packs rank's K and V (dense, K first) at dst.
template <class T>
void pack_kv(const attention_inputs<T>& in, T* dst) {
  const int64_t n = in.k.rows, w = in.k.cols;
  for (int64_t i = 0; i < n; ++i) {
    std::copy(in.k.data + i * in.k.ld, in.k.data + i * in.k.ld + w, dst + i * w);
    std::copy(in.v.data + i * in.v.ld, in.v.data + i * in.v.ld + w, dst + (n + i) * w);
  }
}

/// A received block as the type attention computes in: itself when T is A,
/// else widened into `wide`.
template <class A, class T>
kv_block<A> as_acc(const void* block, int64_t rows, int64_t width, workspace_vector<A>& wide) {
  const T* t = static_cast<const T*>(block);
  if constexpr (std::is_same_v<A, T>) {
    return {t, t + rows * width, width};
  } else {
    const size_t n = size_t(2 * rows * width);
    if (wide.size() < n) wide.resize(n);
    std::transform(t, t + n, wide.begin(), [](T x) { return widen<A>(x); });
    return {wide.data(), wide.data() + rows * width, width};
  }
}

/// m (rows x cols, ld) as a dense matrix of A.
template <class A, class T>
void dense_copy(matrix_view<const T> m, workspace_vector<A>& out) {
  out.resize(size_t(m.rows * m.cols));
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) out[size_t(i * m.cols + j)] = widen<A>(m(i, j));
}

/// Bytes of storage for the travelling blocks (64-byte aligned; shared by
/// the simulated ranks in SMPI's timing-only runs, as the ops' workspaces).
class byte_buffer {
 public:
  /// Holds `bytes` (a multiple of 64) bytes, zeroed.
  void resize(int64_t bytes) { v_.assign(size_t(bytes / 64), line{}); }
  /// The byte at `offset`.
  [[nodiscard]] char* at(int64_t offset) { return reinterpret_cast<char*>(v_.data()) + offset; }

 private:
  struct alignas(64) line {
    char b[64];
  };
  workspace_vector<line> v_;
};

/// What one rank states about its call, exchanged on a plan miss (the
/// common agreement, ops/call_agreement.hpp); every rank checks every rank's.
struct call_row {
  ///@{
  /// This rank's tokens and width, and the options that must agree.
  int64_t rows, width, heads, causal, strategy;
  ///@}
  /// The fields that must be the same on every rank, as messages name them.
  static constexpr std::array<overlap::detail::agreed_field<call_row>, 4> agreed{{
      {"the width (q.cols)", &call_row::width, overlap::detail::field_scope::plain},
      {"heads", &call_row::heads},
      {"causal", &call_row::causal},
      {"strategy", &call_row::strategy},
  }};
  static constexpr std::array<overlap::detail::agreed_field<call_row>, 0> more_agreed{};  ///< nothing beyond `agreed`
};

/// Checks a view against the shape it must have; sets the complaint (once).
template <class V>
void expect_view(std::string& why, const char* what, const V& v, int64_t rows, int64_t cols) {
  const bool fits = v.rows == rows && v.cols == cols && v.ld >= v.cols && (v.rows * v.cols == 0 || v.data != nullptr);
  if (!why.empty() || fits) return;
  why = std::string(what) + " must be " + std::to_string(rows) + " x " + std::to_string(cols) +
        " (ld >= cols, not null); got " + std::to_string(v.rows) + " x " + std::to_string(v.cols) + " (ld " +
        std::to_string(v.ld) + ")";
}

/// A view of the call as the overlap checks see it: its name and its bytes.
struct named_block {
  const char* name;
  uintptr_t at;
  int64_t rows, row_bytes, ld_bytes;
  template <class V>
  named_block(const char* n, const V& v)  // NOLINT(google-explicit-constructor): lists of (name, view)
      : name(n),
        at(reinterpret_cast<uintptr_t>(v.data)),
        rows(v.rows),
        row_bytes(v.cols * int64_t(sizeof(*v.data))),
        ld_bytes(v.ld * int64_t(sizeof(*v.data))) {}
};

/// Checks that no output shares a byte with another output or an input (the
/// passes write an output while the others are still read, or written);
/// sets the complaint (once). The ops refuse the same (ops/checks.hpp).
inline void expect_apart(std::string& why,
                         std::initializer_list<named_block> outs,  // NOLINT(bugprone-easily-swappable-parameters)
                         std::initializer_list<named_block> ins) {
  auto apart = [&](const named_block& o, const named_block& x) {
    if (!why.empty()) return;  // the views may be invalid
    if (overlap::detail::blocks_overlap(o.at, o.rows, o.row_bytes, o.ld_bytes, x.at, x.rows, x.row_bytes, x.ld_bytes))
      why = std::string(o.name) + " overlaps " + x.name +
            " in memory; outputs must not alias each other or the call's inputs";
  };
  for (auto o = outs.begin(); o != outs.end(); ++o)
    for (auto x = o + 1; x != outs.end(); ++x) apart(*o, *x);
  for (const named_block& o : outs)
    for (const named_block& x : ins) apart(o, x);
}

/// What this rank states about a call with inputs `in`.
template <class T>
call_row row_of(const attention_inputs<T>& in, const attention_options& opt) {
  return {in.q.rows, in.q.cols, opt.heads, opt.causal ? 1 : 0, int64_t(opt.strategy)};
}
/// The inputs' complaint, if any: k and v must have q's shape.
template <class T>
std::string input_errors(const attention_inputs<T>& in) {
  std::string why;
  expect_view(why, "k", in.k, in.q.rows, in.q.cols);
  expect_view(why, "v", in.v, in.q.rows, in.q.cols);
  expect_view(why, "q", in.q, in.q.rows, in.q.cols);
  return why;
}

/// The checks of this rank's options and sizes that need nothing from the other ranks.
inline std::string local_errors(const attention_options& opt, const call_row& mine) {
  const int64_t rows = mine.rows, width = mine.width;
  if (opt.heads <= 0) return "attention_options.heads must be positive; got " + std::to_string(opt.heads);
  if (opt.block <= 0) return "attention_options.block must be positive; got " + std::to_string(opt.block);
  if (opt.strategy != strategy::bulk && opt.strategy != strategy::ring && opt.strategy != strategy::automatic)
    return "attention_options.strategy must be bulk, ring or automatic";
  if (width <= 0 || width % opt.heads != 0)
    return "the width (q's columns, " + std::to_string(width) + ") must be a positive multiple of heads (" +
           std::to_string(opt.heads) + ")";
  if (rows < 0) return "negative rows";
  return {};
}

/// The rule across ranks that is ring attention's own (the common
/// agreement checked the fields that must agree): every rank's tokens are
/// the causal split's. The same on every rank; "" when it holds.
inline std::string global_errors(const std::vector<call_row>& table, int64_t& seq) {
  const int ranks = static_cast<int>(table.size());
  seq = 0;
  for (const call_row& r : table) seq += r.rows;
  const causal_split split(seq, ranks);
  for (int r = 0; r < ranks; ++r)
    if (table[size_t(r)].rows != split.rows(r))
      return "rank " + std::to_string(r) + " holds " + std::to_string(table[size_t(r)].rows) +
             " tokens, but the causal split of the " + std::to_string(seq) + "-token sequence over " +
             std::to_string(ranks) + " ranks gives it " + std::to_string(split.rows(r)) + " (chunks " +
             std::to_string(r) + " and " + std::to_string(2 * ranks - 1 - r) + " of " + std::to_string(2 * ranks) +
             "; see overlap::causal_split)";
  return {};
}

/// A pass's cached plan: the problem the ranks agreed on and the pass's
/// buffers (State), sized once; a later call of the same shape reuses both.
template <class State>
struct attention_plan final : overlap::detail::plan_base {
  problem pb;
  State s;
};

/// What prepare() returns: the plan, and whether this call built it (its
/// buffers then hold this call's inputs already).
template <class State>
struct prepared {
  attention_plan<State>& plan;
  bool built = false;
};

/// A summary for error reports and traces.
template <class T>
std::string summary(const char* pass, const problem& pb) {
  return std::string("ring_attention ") + pass + " <" + overlap::to_string(dtype_of<T>()) + ">, " +
         (pb.ring ? "ring" : "bulk") + ", seq " + std::to_string(pb.split.seq()) + ", " + std::to_string(pb.d.heads) +
         " heads x " + std::to_string(pb.d.dh) + (pb.causal ? ", causal" : "") + ", " + std::to_string(pb.ranks) +
         " ranks";
}

/// Collective on a plan miss: the schedule of a pass, bulk or ring. A forced
/// strategy is taken; automatic asks the ops' chooser (ops/choose.hpp): bulk
/// on one rank and on one node without a calibration, else the simplest of
/// bulk and ring that the cost model predicts within its margin of the
/// faster, both priced from the pass as it would run (`price(ring)`: the
/// tiles' GEMMs and the blocks' bytes). The online softmax between the GEMMs
/// is not calibrated and not priced: docs/design.md ("Ring attention's
/// choice") says what that leaves out.
template <class Price>
schedule choose_pass(context& ctx, overlap::strategy asked, dtype t, Price&& price) {
  overlap::detail::schedule_request req;
  req.strategy = asked;
  req.others_allowed = false, req.bidirectional = false;
  return overlap::detail::choose_schedule(
      ctx, req, t, [](int) { return 1; }, [&](const schedule& s) { return price(s.strategy == strategy::ring); });
}

/// Collective: prepares a pass of op `Id` (forward or backward) through the
/// ops' common path: this rank's checks (`local` returns a complaint or
/// ""), the agreement on the cached plan (a bad call on any rank throws
/// std::invalid_argument on every rank, with the lowest failing rank's
/// message, before any transfer; so do calls that differ across ranks), and
/// on a miss anywhere the exchange of every rank's row, the rules across
/// ranks, the schedule (choose_pass, pricing with `price(pb, ring)`), and
/// the plan's buffers (`allocate(pb, state)`, whose failure on any rank is
/// agreed too). Returns the plan, cached in the context.
template <overlap::detail::op_id Id, class T, class State, class Local, class Price, class Allocate>
prepared<State> prepare(context& ctx, const char* pass, const call_row& mine, const attention_options& opt,
                        Local&& local, Price&& price, Allocate&& allocate) {
  namespace od = overlap::detail;
  using info = od::op_info<Id>;
  ctx.check_usable(info::names.call);
  od::arg_checks checks(Id, info::names, dtype_of<T>(), to_string(opt.strategy));
  std::string why = local_errors(opt, mine);
  if (why.empty()) why = local();
  checks.require(why.empty(), why);
  od::plan_key& key = ctx.scratch().key;
  key.clear();
  od::append_values(key, mine);
  // The block shapes the tiles: this rank's own business.
  key.insert(key.end(), {static_cast<int64_t>(Id), static_cast<int64_t>(dtype_of<T>()), opt.block});
  const od::agreement<call_row> agreed_on = od::agree_or_exchange(ctx, checks, key, mine);
  if (agreed_on.cached != nullptr) return {static_cast<attention_plan<State>&>(*agreed_on.cached), false};

  const od::plan_key stored = key;  // the scratch is the next call's
  int64_t seq = 0;
  const std::string rule = global_errors(agreed_on.table, seq);
  if (!rule.empty()) throw std::invalid_argument(checks.op() + ": " + rule);
  auto plan = std::make_unique<attention_plan<State>>();
  problem& pb = plan->pb;
  const int P = ctx.size();
  pb.split = causal_split(seq, P);
  pb.d = dims{opt.heads, mine.width / opt.heads, opt.block};
  pb.causal = opt.causal;
  pb.ranks = P, pb.rank = ctx.rank(), pb.order = ctx.ring();
  pb.pos = int(std::find(pb.order.begin(), pb.order.end(), pb.rank) - pb.order.begin());
  const schedule sched =
      choose_pass(ctx, opt.strategy, dtype_of<attention_acc_t<T>>(), [&](bool ring) { return price(pb, ring); });
  pb.ring = sched.strategy == strategy::ring;
  plan->fingerprint = agreed_on.fingerprint(Id);
  plan->summary = summary<T>(pass, pb);
  plan->schedule_words = to_string(sched);
  plan->automatic = opt.strategy == strategy::automatic;
  od::build_agreed(ctx, checks.op(), [&] {
    allocate(plan->pb, plan->s);
    return 0;
  });
  return {static_cast<attention_plan<State>&>(*ctx.store_plan(stored, std::move(plan))), true};
}

/// Under progress_policy::poll, the tiles test the ring's transfers
/// between blocks of queries (the other policies progress them without the
/// computing thread's help).
template <class A>
void poll_while_computing(context& ctx, const problem& pb, tile_math<A>& math) {
  if (pb.ring && ctx.config().progress == progress_policy::poll)
    math.on_block([&ctx] { (void)ctx.requests().test_all(); });
}

/// The baseline's gather: every rank's K/V block, packed at offsets[r] of
/// `all` on rank r, lands at offsets[r] on every rank (MPI_Allgatherv).
inline void gather_blocks(context& ctx, const overlap::detail::plan_base& plan, const problem& pb,
                          const std::vector<int64_t>& offsets, byte_buffer& all) {
  const unit u(offsets.back());
  std::vector<int> counts(size_t(pb.ranks)), displs(size_t(pb.ranks));
  for (int r = 0; r < pb.ranks; ++r) {
    counts[size_t(r)] = u.count(offsets[size_t(r) + 1] - offsets[size_t(r)]);
    displs[size_t(r)] = u.count(offsets[size_t(r)]);
  }
  void* buf = all.at(0);
  const int mine = counts[size_t(pb.rank)];
  overlap::detail::run_collective(
      ctx, plan, "MPI_Allgatherv",
      [&] { return MPI_Allgatherv(MPI_IN_PLACE, mine, u.type, buf, counts.data(), displs.data(), u.type, ctx.comm()); },
      [&](MPI_Request* r) {
        return MPI_Iallgatherv(MPI_IN_PLACE, mine, u.type, buf, counts.data(), displs.data(), u.type, ctx.comm(), r);
      });
}

}  // namespace overlap::layers::attention::detail
