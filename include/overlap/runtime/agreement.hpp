#pragma once
/// @file
/// How the ranks of a context agree, in one place. Whatever can fail on one
/// rank alone (a check, an allocation, creating a primitive) is followed by
/// an agreement before any transfer, so that every rank ends the same way:
/// either all go on, or all throw the lowest failing rank's error.
///
/// - agree_on: every rank learns whether any rank failed; if one did, every
///   rank throws that rank's error (broadcast_failure).
/// - same_everywhere: whether every rank passed the same values (a layer's
///   shape and mode).
/// - call_vote: what each rank contributes when an op is called (did its
///   checks fail, does it hold a plan, which one, for which op and element
///   type), in one all-reduce (ops/call_agreement.hpp).
///
/// The functions take the context as `Ctx` (a template, so that context.hpp
/// can own the scratch without including this protocol's users): it gives
/// comm(), rank(), size(), rank_name(), scratch(), and what
/// watched_collective needs (watchdog.hpp).

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "overlap/runtime/failure.hpp"
#include "overlap/runtime/watchdog.hpp"

namespace overlap::detail {

/// What each rank contributes to the agreement on an op call, reduced with
/// MPI_MAX as int64_t values: a flag is set when any rank sets it; a value v
/// is sent as v and -v, so that one reduction gives its largest and (negated)
/// smallest value, and all ranks hold the same v when same().
struct call_vote {
  int64_t failed = 0;   ///< this rank's checks failed
  int64_t missing = 0;  ///< this rank holds no plan for the call
  int64_t fingerprint = 0, neg_fingerprint = 0;
  int64_t op = 0, neg_op = 0;
  int64_t type = 0, neg_type = 0;

  /// A vote with each value also negated.
  static call_vote of(bool failed, bool missing, int64_t fingerprint, int64_t op, int64_t type) {
    return {failed ? 1 : 0, missing ? 1 : 0, fingerprint, -fingerprint, op, -op, type, -type};
  }
  static constexpr int count = 8;  ///< int64_t values
  [[nodiscard]] static bool same(int64_t max, int64_t neg_max) noexcept { return max == -neg_max; }
};
static_assert(sizeof(call_vote) == call_vote::count * sizeof(int64_t), "call_vote is reduced as int64_t values");

/// What each rank contributes when the ranks agree on a failure.
struct failure_vote {
  int failed = 0, any_failed = 0;  ///< this rank's, and the maximum over ranks (MPI_MAX)
  int rank = 0, first = 0;         ///< this rank if it failed, else the size; the minimum (MPI_MIN)
  int length = 0;                  ///< bytes of the first failing rank's packed failure (MPI_Bcast)
};

/// Buffers of the agreement collectives, owned by the context so that a
/// collective abandoned by the watchdog never writes into a dead stack frame.
struct agreement_scratch {
  call_vote in, out;
  failure_vote failure;
  std::vector<int64_t> mine, table;
  std::string text;
  std::vector<int64_t> key;       ///< the plan key of the call being prepared (reused: no allocation on a cached call)
  std::vector<double> predicted;  ///< slowest_everywhere's values
};

/// Collective, after the ranks learnt that some rank failed: every rank
/// throws the lowest failing rank's error, prefixed with `where` and that rank.
template <class Ctx>
[[noreturn]] void broadcast_failure(Ctx& ctx, const failure& mine, const std::string& where) {
  agreement_scratch& s = ctx.scratch();
  failure_vote& v = s.failure;
  MPI_Comm comm = ctx.comm();
  auto describe = [&] { return where + " (reporting a failure)"; };
  v.rank = mine.failed() ? ctx.rank() : ctx.size();
  watched_collective(
      ctx, "MPI_Allreduce", [&] { return MPI_Allreduce(&v.rank, &v.first, 1, MPI_INT, MPI_MIN, comm); },
      [&](MPI_Request* r) { return MPI_Iallreduce(&v.rank, &v.first, 1, MPI_INT, MPI_MIN, comm, r); }, describe);
  const int root = v.first;
  s.text = ctx.rank() == root ? mine.pack() : std::string();
  v.length = static_cast<int>(s.text.size());
  watched_collective(
      ctx, "MPI_Bcast", [&] { return MPI_Bcast(&v.length, 1, MPI_INT, root, comm); },
      [&](MPI_Request* r) { return MPI_Ibcast(&v.length, 1, MPI_INT, root, comm, r); }, describe);
  s.text.resize(static_cast<size_t>(v.length));
  watched_collective(
      ctx, "MPI_Bcast", [&] { return MPI_Bcast(s.text.data(), v.length, MPI_CHAR, root, comm); },
      [&](MPI_Request* r) { return MPI_Ibcast(s.text.data(), v.length, MPI_CHAR, root, comm, r); }, describe);
  failure::unpack(s.text).raise(where + ": on " + ctx.rank_name(root));
}

/// Collective: every rank learns whether any rank's `mine` failed; if one
/// did, every rank throws the lowest failing rank's error (same type and
/// message, prefixed with `where` and that rank).
template <class Ctx>
void agree_on(Ctx& ctx, const failure& mine, const std::string& where) {
  failure_vote& v = ctx.scratch().failure;
  MPI_Comm comm = ctx.comm();
  v.failed = mine.failed() ? 1 : 0;
  watched_collective(
      ctx, "MPI_Allreduce", [&] { return MPI_Allreduce(&v.failed, &v.any_failed, 1, MPI_INT, MPI_MAX, comm); },
      [&](MPI_Request* r) { return MPI_Iallreduce(&v.failed, &v.any_failed, 1, MPI_INT, MPI_MAX, comm, r); },
      [&] { return where + " (agreeing on success)"; });
  if (v.any_failed != 0) broadcast_failure(ctx, mine, where);
}

/// Collective: whether every rank of ctx passed the same `values` (each rank
/// the same count, none of them INT64_MIN). One MPI_MAX all-reduce of each
/// value and its negation (call_vote's way), bounded by the watchdog like
/// every agreement; `where` names the caller in a watchdog report.
template <class Ctx>
bool same_everywhere(Ctx& ctx, const std::vector<int64_t>& values, const std::string& where) {
  agreement_scratch& s = ctx.scratch();
  s.mine.clear();
  for (int64_t v : values) s.mine.insert(s.mine.end(), {v, -v});
  s.table.assign(s.mine.size(), 0);
  const int n = static_cast<int>(s.mine.size());
  MPI_Comm comm = ctx.comm();
  watched_collective(
      ctx, "MPI_Allreduce", [&] { return MPI_Allreduce(s.mine.data(), s.table.data(), n, MPI_INT64_T, MPI_MAX, comm); },
      [&](MPI_Request* r) { return MPI_Iallreduce(s.mine.data(), s.table.data(), n, MPI_INT64_T, MPI_MAX, comm, r); },
      [&] { return where + " (comparing the ranks' values)"; });
  for (size_t i = 0; i < s.table.size(); i += 2)
    if (s.table[i] != -s.table[i + 1]) return false;
  return true;
}

/// Collective: every rank's `values` replaced by their maximum over the
/// ranks (each rank the same count), bounded by the watchdog; `where` names
/// the caller in a watchdog report. The cost model's choice takes the
/// slowest rank's predicted time of each candidate this way.
template <class Ctx>
void slowest_everywhere(Ctx& ctx, std::vector<double>& values, const std::string& where) {
  std::vector<double>& v = ctx.scratch().predicted;
  v = values;
  const int n = static_cast<int>(v.size());
  MPI_Comm comm = ctx.comm();
  watched_collective(
      ctx, "MPI_Allreduce", [&] { return MPI_Allreduce(MPI_IN_PLACE, v.data(), n, MPI_DOUBLE, MPI_MAX, comm); },
      [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, v.data(), n, MPI_DOUBLE, MPI_MAX, comm, r); },
      [&] { return where + " (the slowest rank's predictions)"; });
  values = v;
}

}  // namespace overlap::detail
