#pragma once
/// @file
/// The routing of a mixture-of-experts layer as the all-to-all ops read it
/// (all_to_all_matmul, matmul_all_to_all): how many token rows go from
/// each rank to each expert. Every rank holds `experts` local experts;
/// expert e of rank q is the global expert q * experts + e.

#include <mpi.h>

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "overlap/runtime/agreement.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/failure.hpp"
#include "overlap/runtime/watchdog.hpp"

namespace overlap {

/// Token rows per (rank, local expert), from this rank's side. With R ranks
/// and E = experts, both vectors hold R * E counts, rank-major:
/// - send[q * E + e]: rows this rank sends to local expert e of rank q;
/// - recv[q * E + e]: rows this rank receives from rank q for its own
///   local expert e.
///
/// recv on rank p must equal, entry for entry, what each rank q's send says
/// for p (send[p * E + e] on rank q); exchange_expert_counts makes recv from
/// the send counts. Counts may be zero, and a rank may send or receive no
/// rows at all.
struct expert_counts {
  int experts = 0;            ///< local experts per rank (the same on every rank)
  std::vector<int64_t> send;  ///< rows to (rank, its expert), R * experts
  std::vector<int64_t> recv;  ///< rows from (rank, for this rank's expert), R * experts
  /// Rows this rank sends in all: the rows of dispatch's input and combine's output.
  [[nodiscard]] int64_t sent_rows() const { return std::accumulate(send.begin(), send.end(), int64_t{0}); }
  /// Rows this rank receives in all: the rows of dispatch's output and combine's input.
  [[nodiscard]] int64_t received_rows() const { return std::accumulate(recv.begin(), recv.end(), int64_t{0}); }
};

/// Collective over ctx: the counts of a routing whose send side this rank
/// gives (`send`: R * experts counts, as expert_counts::send); the receive
/// side comes from the other ranks (one MPI_Alltoall of `experts` counts
/// per pair). experts must be positive and agree across ranks, and send
/// hold R * experts non-negative counts: a rank whose input breaks that
/// throws std::invalid_argument, and so does every other rank.
inline expert_counts exchange_expert_counts(context& ctx, int experts, std::vector<int64_t> send) {
  const int R = ctx.size();
  std::string why;
  if (experts <= 0)
    why = "experts must be positive; got " + std::to_string(experts);
  else if (send.size() != static_cast<size_t>(R) * static_cast<size_t>(experts))
    why = "send holds " + std::to_string(send.size()) + " counts; ranks x experts is " + std::to_string(R) + " x " +
          std::to_string(experts);
  for (size_t i = 0; why.empty() && i < send.size(); ++i)
    if (send[i] < 0) why = "send[" + std::to_string(i) + "] is negative (" + std::to_string(send[i]) + ")";
  const char* const op = "overlap::exchange_expert_counts";
  detail::agree_on(ctx, why.empty() ? detail::failure() : detail::failure(detail::failure::kind::invalid_argument, why),
                   op);
  if (!detail::same_everywhere(ctx, {experts}, op))
    throw std::invalid_argument(std::string(op) + ": experts differs across ranks; it must agree");
  expert_counts c;
  c.experts = experts;
  c.send = std::move(send);
  c.recv.assign(c.send.size(), 0);
  detail::watched_collective(
      ctx, "MPI_Alltoall",
      [&] {
        return MPI_Alltoall(c.send.data(), experts, MPI_INT64_T, c.recv.data(), experts, MPI_INT64_T, ctx.comm());
      },
      [&](MPI_Request* r) {
        return MPI_Ialltoall(c.send.data(), experts, MPI_INT64_T, c.recv.data(), experts, MPI_INT64_T, ctx.comm(), r);
      },
      [&] { return std::string(op); });
  return c;
}

}  // namespace overlap
