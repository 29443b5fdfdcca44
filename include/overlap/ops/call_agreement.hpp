#pragma once
/// @file
/// The agreement on an op call (built on overlap/runtime/agreement.hpp's collective
/// agreement): argument checks that end the same way on every rank.
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
#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "overlap/core/matrix.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/ops/checks.hpp"
#include "overlap/ops/op_id.hpp"
#include "overlap/runtime/agreement.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/failure.hpp"
#include "overlap/runtime/watchdog.hpp"

namespace overlap::detail {

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
  s.mine = {static_cast<int64_t>(checks.id()), static_cast<int64_t>(checks.type())};
  s.table.resize(2 * static_cast<size_t>(ctx.size()));
  watched_collective(
      ctx, "MPI_Allgather",
      [&] { return MPI_Allgather(s.mine.data(), 2, MPI_INT64_T, s.table.data(), 2, MPI_INT64_T, ctx.comm()); },
      [&](MPI_Request* r) {
        return MPI_Iallgather(s.mine.data(), 2, MPI_INT64_T, s.table.data(), 2, MPI_INT64_T, ctx.comm(), r);
      },
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
  throw std::invalid_argument("overlap: the ranks of a context made different calls: " + ctx.rank_name(0) + " called " +
                              call(0) + ", " + ctx.rank_name(r) + " called " + call(r) +
                              "; every rank must call the same op with the same element type, in the same order");
}

/// Collective: the agreement on an op call (call_vote). Throws
/// std::invalid_argument on every rank when the ranks called different ops
/// or element types, or when any rank's checks failed (the message is the
/// lowest failing rank's). Returns true when every rank holds a cached plan
/// and all those plans were built together.
inline bool agree(context& ctx, const arg_checks& checks, const plan_base* cached) {
  agreement_scratch& s = ctx.scratch();
  // Fingerprints are masked to 62 bits so that negating them cannot overflow.
  const int64_t fp = cached ? static_cast<int64_t>(cached->fingerprint >> 2) : -1;
  s.in = call_vote::of(checks.failed(), cached == nullptr, fp, static_cast<int64_t>(checks.id()),
                       static_cast<int64_t>(checks.type()));
  const int n = call_vote::count;
  watched_collective(
      ctx, "MPI_Allreduce", [&] { return MPI_Allreduce(&s.in, &s.out, n, MPI_INT64_T, MPI_MAX, ctx.comm()); },
      [&](MPI_Request* r) { return MPI_Iallreduce(&s.in, &s.out, n, MPI_INT64_T, MPI_MAX, ctx.comm(), r); },
      [&] { return checks.op() + " (argument agreement)"; });
  const call_vote& all = s.out;
  if (!call_vote::same(all.op, all.neg_op) || !call_vote::same(all.type, all.neg_type))
    report_mismatched_calls(ctx, checks);
  if (all.failed != 0)
    broadcast_failure(ctx, checks.failed() ? failure(failure::kind::invalid_argument, checks.failure()) : failure(),
                      checks.op());
  return all.missing == 0 && call_vote::same(all.fingerprint, all.neg_fingerprint);
}

/// How messages name an agreed field: a member of the op's options
/// (`name` after "ag_options."), a setting (after "config."), or the op's
/// layout option and configured chunks, whose names are the op's own, or
/// by `name` alone (plain: a size, e.g. "the width (q.cols)").
enum class field_scope { options, setting, layout, chunks, plain };

/// An option in an op's exchanged row that must be the same on every rank,
/// with its name in messages.
template <class Row>
struct agreed_field {
  const char* name;
  int64_t Row::*member;
  field_scope scope = field_scope::options;

  /// The name in a message about the op named `n`, e.g. "ag_options.strategy".
  [[nodiscard]] std::string name_for(const entry_names& n) const {
    switch (scope) {
      case field_scope::options: return std::string(n.options) + "." + name;
      case field_scope::setting: return std::string("config.") + name;
      case field_scope::layout: return n.layout_option;
      case field_scope::chunks: return n.chunks_setting;
      case field_scope::plain: return name;
    }
    return name;
  }
};

/// The part of an exchanged row that every matmul op has: its layout
/// option and the options that must agree (`agreed` names them; an op's
/// row adds its own in Row::more_agreed), then this rank's sizes. An op's
/// row derives from it and adds its own fields.
struct matmul_row {
  int64_t layout, strategy, chunks, transpose_a, transpose_b, activation, phases, automatic, automatic_recheck,
      algorithm, accumulate, batch;
  int64_t a_rows, a_cols, b_rows, b_cols;  ///< op(a), op(b)
  int64_t c_rows, c_cols;
  /// Pieces split one dimension of the output; this rank's GEMM keeps its rate above this many.
  int64_t knee;

  static constexpr std::array<agreed_field<matmul_row>, 12> agreed{{
      {"", &matmul_row::layout, field_scope::layout},
      {"strategy", &matmul_row::strategy},
      {"", &matmul_row::chunks, field_scope::chunks},
      {"transpose_a", &matmul_row::transpose_a},
      {"transpose_b", &matmul_row::transpose_b},
      {"epilogue.activation", &matmul_row::activation},
      {"phases", &matmul_row::phases, field_scope::setting},
      {"automatic", &matmul_row::automatic, field_scope::setting},
      {"automatic_recheck", &matmul_row::automatic_recheck, field_scope::setting},
      {"algorithm", &matmul_row::algorithm},
      {"accumulate", &matmul_row::accumulate},
      {"batch.count", &matmul_row::batch},
  }};
};

/// This rank's matmul_row for op `Op` (its traits type names the layout
/// option and the configured chunks); `knee` from context::piece_knee.
template <class Op>
matmul_row matmul_row_of(const context& ctx, const typename Op::options& opt, const typename Op::args& x,
                         int64_t knee) {
  const dims2 la = op_dims(x.a, opt.transpose_a), lb = op_dims(x.b, opt.transpose_b);
  return {static_cast<int64_t>(opt.*Op::layout),
          static_cast<int64_t>(opt.strategy),
          ctx.config().*Op::configured_chunks,
          opt.transpose_a,
          opt.transpose_b,
          static_cast<int64_t>(opt.epilogue.activation),
          static_cast<int64_t>(ctx.config().phases),
          static_cast<int64_t>(ctx.config().automatic),
          ctx.config().automatic_recheck,
          static_cast<int64_t>(opt.algorithm),
          opt.accumulate,
          opt.batch.count,
          la.rows,
          la.cols,
          lb.rows,
          lb.cols,
          x.c.rows,
          x.c.cols,
          knee};
}

/// A rule across ranks: rank r's value of `field` (a member of Row or of a
/// base) equals rank 0's, else std::invalid_argument naming `name` and both
/// values. Every rank checks the same table, so all throw alike.
template <class Row, class Field>
void require_agreed(const context& ctx, const arg_checks& checks, const std::vector<Row>& table, size_t r, Field field,
                    const std::string& name) {
  const int64_t v0 = table.front().*field, vr = table[r].*field;
  if (vr != v0)
    throw std::invalid_argument(checks.op() + ": " + name + " must agree across ranks (" + ctx.rank_name(0) + ": " +
                                std::to_string(v0) + ", " + ctx.rank_name(static_cast<int>(r)) + ": " +
                                std::to_string(vr) + ")");
}

/// A row's values in declaration order (Row: a struct of int64_t only).
template <class Row>
void append_values(std::vector<int64_t>& out, const Row& row) {
  static_assert(std::is_trivially_copyable_v<Row> && sizeof(Row) % sizeof(int64_t) == 0,
                "an exchanged row holds int64_t fields only");
  const size_t n = sizeof(Row) / sizeof(int64_t), at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, &row, sizeof(Row));
}

/// Rank r's value of every field of `fields` equals rank 0's, else
/// std::invalid_argument naming the field and the ranks.
template <class Row, class Fields>
void require_agreed_fields(const context& ctx, const arg_checks& checks, const std::vector<Row>& rows,
                           const Fields& fields) {
  for (size_t r = 1; r < rows.size(); ++r)
    for (const auto& f : fields) {
      const int64_t v0 = rows[0].*f.member, vr = rows[r].*f.member;
      if (vr != v0)
        throw std::invalid_argument(checks.op() + ": " + f.name_for(checks.names()) + " differs across ranks (" +
                                    ctx.rank_name(0) + ": " + std::to_string(v0) + ", " +
                                    ctx.rank_name(static_cast<int>(r)) + ": " + std::to_string(vr) +
                                    "); it must agree");
    }
}

/// Collective: every rank's row, exchanged as one MPI datatype (element r is
/// rank r's); agree() ensured that every rank called the same op. Then every
/// field of Row::agreed (a matmul op's row inherits matmul_row's) and of
/// Row::more_agreed (the op's own) must equal rank 0's, else
/// std::invalid_argument on every rank (all see the same table) naming the
/// field and the ranks.
template <class Row>
[[nodiscard]] std::vector<Row> exchange_rows(context& ctx, const Row& mine, const arg_checks& checks) {
  const std::string& op = checks.op();
  agreement_scratch& s = ctx.scratch();  // owned by the context: see agreement_scratch
  s.mine.clear();
  append_values(s.mine, mine);
  s.table.resize(s.mine.size() * static_cast<size_t>(ctx.size()));
  const mpi::datatype row = mpi::contiguous_type(static_cast<int64_t>(s.mine.size()), MPI_INT64_T);
  watched_collective(
      ctx, "MPI_Allgather",
      [&] { return MPI_Allgather(s.mine.data(), 1, row.get(), s.table.data(), 1, row.get(), ctx.comm()); },
      [&](MPI_Request* r) {
        return MPI_Iallgather(s.mine.data(), 1, row.get(), s.table.data(), 1, row.get(), ctx.comm(), r);
      },
      [&] { return op + " (exchanging shard sizes)"; });
  std::vector<Row> rows(static_cast<size_t>(ctx.size()));
  std::memcpy(rows.data(), s.table.data(), rows.size() * sizeof(Row));
  require_agreed_fields(ctx, checks, rows, Row::agreed);
  require_agreed_fields(ctx, checks, rows, Row::more_agreed);
  return rows;
}

/// What the ranks agreed on: every rank's cached plan matches (`cached`), or
/// the table of every rank's row (element r = rank r's).
template <class Row>
struct agreement {
  plan_base* cached = nullptr;
  std::vector<Row> table;
  /// The same on every rank: the exchanged table (which names the options) and the op.
  [[nodiscard]] uint64_t fingerprint(op_id op) const {
    std::vector<int64_t> values;
    for (const Row& r : table) append_values(values, r);
    return hash_values(values, hash_values({static_cast<int64_t>(op)}));
  }
};

/// Collective: agree() on the cached plan for `key`, and on a miss anywhere
/// exchange every rank's row (exchange_rows checks the options that must agree).
template <class Row>
[[nodiscard]] agreement<Row> agree_or_exchange(context& ctx, const arg_checks& checks, const plan_key& key,
                                               const Row& mine) {
  plan_base* cached = checks.failed() ? nullptr : ctx.find_plan(key);
  if (agree(ctx, checks, cached)) return {cached, {}};
  return {nullptr, exchange_rows(ctx, mine, checks)};
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
  agree_on(ctx, local, op);
  return result;
}

}  // namespace overlap::detail
