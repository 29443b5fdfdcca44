#pragma once
/// @file
/// What ring attention's passes share (layers/ring_attention.hpp): the
/// problem the ranks agreed on, the checks and the agreement, the tiles of
/// a step, and how blocks are laid out as they travel.

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "overlap/agreement.hpp"
#include "overlap/context.hpp"
#include "overlap/failure.hpp"
#include "overlap/layers/attention_options.hpp"
#include "overlap/layers/attention_tiles.hpp"
#include "overlap/layers/causal_split.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/ops/run.hpp"
#include "overlap/watchdog.hpp"

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
kv_block<A> as_acc(const void* block, int64_t rows, int64_t width, std::vector<A>& wide) {
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
void dense_copy(matrix_view<const T> m, std::vector<A>& out) {
  out.resize(size_t(m.rows * m.cols));
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) out[size_t(i * m.cols + j)] = widen<A>(m(i, j));
}

/// Bytes of storage for the travelling blocks (64-byte aligned).
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
  std::vector<line> v_;
};

/// What one rank states about its call; every rank checks every rank's.
struct call_row {
  ///@{
  /// This rank's tokens and width, and the options that must agree.
  int64_t rows = 0, width = 0, heads = 0, causal = 0, strategy = 0;
  ///@}
  static constexpr int count = 5;  ///< int64_t fields, exchanged in this order
};
/// Field f of rank r's row in the gathered table.
inline int64_t cell(const std::vector<int64_t>& table, int r, int f) {
  return table[size_t(r) * call_row::count + size_t(f)];
}

/// Checks a view against the shape it must have; sets the complaint (once).
template <class V>
void expect_view(std::string& why, const char* what, const V& v, int64_t rows, int64_t cols) {
  const bool fits = v.rows == rows && v.cols == cols && v.ld >= v.cols && (v.rows * v.cols == 0 || v.data != nullptr);
  if (!why.empty() || fits) return;
  why = std::string(what) + " must be " + std::to_string(rows) + " x " + std::to_string(cols) +
        " (ld >= cols, not null); got " + std::to_string(v.rows) + " x " + std::to_string(v.cols) + " (ld " +
        std::to_string(v.ld) + ")";
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

/// The checks of every rank's row, the same on every rank.
inline std::string global_errors(const std::vector<int64_t>& table, int ranks, int64_t& seq) {
  seq = 0;
  for (int r = 0; r < ranks; ++r) seq += cell(table, r, 0);
  for (int r = 1; r < ranks; ++r)
    for (int f = 1; f < call_row::count; ++f)
      if (cell(table, r, f) != cell(table, 0, f))
        return std::string("the ranks disagree on the ") +
               (f == 1   ? "width"
                : f == 2 ? "heads"
                : f == 3 ? "causal mask"
                         : "strategy") +
               " (rank 0 and rank " + std::to_string(r) + " differ); every rank must pass the same";
  const causal_split split(seq, ranks);
  for (int r = 0; r < ranks; ++r)
    if (cell(table, r, 0) != split.rows(r))
      return "rank " + std::to_string(r) + " holds " + std::to_string(cell(table, r, 0)) +
             " tokens, but the causal split of the " + std::to_string(seq) + "-token sequence over " +
             std::to_string(ranks) + " ranks gives it " + std::to_string(split.rows(r)) + " (chunks " +
             std::to_string(r) + " and " + std::to_string(2 * ranks - 1 - r) + " of " + std::to_string(2 * ranks) +
             "; see overlap::causal_split)";
  return {};
}

/// Collective: gathers every rank's call, runs the local checks (`local`
/// returns a complaint or ""), the checks across ranks and `allocate`
/// (given the agreed problem), and agrees: on any failure, every rank
/// throws the lowest failing rank's error before any transfer.
template <class Local, class Allocate>
problem agree(context& ctx, const char* name, const call_row& mine, const attention_options& opt, Local&& local,
              Allocate&& allocate) {
  ctx.check_usable(name);
  overlap::detail::agreement_scratch& s = ctx.scratch();
  const int P = ctx.size();
  s.mine.assign({mine.rows, mine.width, mine.heads, mine.causal, mine.strategy});
  s.table.assign(size_t(P) * call_row::count, 0);
  const MPI_Comm comm = ctx.comm();
  overlap::detail::watched_collective(
      ctx, "MPI_Allgather",
      [&] {
        return MPI_Allgather(s.mine.data(), call_row::count, MPI_INT64_T, s.table.data(), call_row::count, MPI_INT64_T,
                             comm);
      },
      [&](MPI_Request* r) {
        return MPI_Iallgather(s.mine.data(), call_row::count, MPI_INT64_T, s.table.data(), call_row::count, MPI_INT64_T,
                              comm, r);
      },
      [&] { return std::string("overlap::") + name + ": exchanging the ranks' shapes"; });
  problem pb;
  overlap::detail::failure failed;
  try {
    std::string why = local_errors(opt, mine);
    if (why.empty()) why = local();
    int64_t seq = 0;
    if (why.empty()) why = global_errors(s.table, P, seq);
    if (!why.empty()) throw std::invalid_argument(why);
    pb.split = causal_split(seq, P);
    pb.d = dims{opt.heads, mine.width / opt.heads, opt.block};
    pb.causal = opt.causal;
    pb.ring = opt.strategy == strategy::ring || (opt.strategy == strategy::automatic && P >= 2);
    pb.ranks = P, pb.rank = ctx.rank(), pb.order = ctx.ring();
    pb.pos = int(std::find(pb.order.begin(), pb.order.end(), pb.rank) - pb.order.begin());
    allocate(pb);
  } catch (...) {
    failed = overlap::detail::failure::capture(std::current_exception());
  }
  overlap::detail::agree_on(ctx, failed, std::string("overlap::") + name);
  return pb;
}

/// Under progress_policy::poll, the tiles test the ring's transfers
/// between blocks of queries (the other policies progress them without the
/// computing thread's help).
template <class A>
void poll_while_computing(context& ctx, const problem& pb, tile_math<A>& math) {
  if (pb.ring && ctx.config().progress == progress_policy::poll)
    math.on_block([&ctx] { (void)ctx.requests().test_all(); });
}

/// A summary for error reports and traces.
template <class T>
overlap::detail::plan_base summary(const char* pass, const problem& pb) {
  overlap::detail::plan_base b;
  b.summary = std::string("ring_attention ") + pass + " <" + overlap::to_string(dtype_of<T>()) + ">, " +
              (pb.ring ? "ring" : "bulk") + ", seq " + std::to_string(pb.split.seq()) + ", " +
              std::to_string(pb.d.heads) + " heads x " + std::to_string(pb.d.dh) + (pb.causal ? ", causal" : "") +
              ", " + std::to_string(pb.ranks) + " ranks";
  return b;
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
