#pragma once
/// @file
/// What the cost model knows about a machine, measured (overlap-calibrate, or
/// a context on first need): per link class the latency and bandwidth of a
/// ring's links, one and both directions, how much slower a GEMM runs while
/// they carry data, and the rates of the MPI collectives over them; per element type the GEMM rate on a grid of shapes
/// (pieces lose rate; the model interpolates). Stored as a small JSON file
/// (OVERLAP_CALIBRATION=path).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <mpi.h>

#include "overlap/core/dtype.hpp"
#include "overlap/core/flavour.hpp"
#include "overlap/schedule/schedule.hpp"

namespace overlap {

/// Where a ring's neighbours sit: the same node (MPI moves data through
/// shared memory, with the cores that compute) or other nodes (a network).
enum class link_class { shared, network };

/// The names of link_class's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<link_class> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<link_class>, 2> entries{
      {{link_class::shared, "shared"}, {link_class::network, "network"}}};
};

/// One MPI collective as measured on a context: its effective rate at a few
/// block sizes (bytes of one rank's block), in the terms the cost model
/// prices it with (detail::predict): allgather and reduce-scatter as R - 1
/// hops of (latency + block / rate), all-to-all as R - 1 latencies plus the
/// bytes one rank sends over the rate.
struct collective_rate {
  std::vector<double> block_bytes;  ///< ascending
  std::vector<double> bytes_per_s;  ///< at each block size

  [[nodiscard]] bool empty() const noexcept { return block_bytes.empty(); }  ///< nothing measured
  /// The rate at `block`: linear in log2 of the block, clamped to the sizes measured.
  [[nodiscard]] double at(double block) const {
    if (block <= block_bytes.front()) return bytes_per_s.front();
    if (block >= block_bytes.back()) return bytes_per_s.back();
    size_t i = 0;
    while (block > block_bytes[i + 1]) ++i;
    const double w = std::log2(block / block_bytes[i]) / std::log2(block_bytes[i + 1] / block_bytes[i]);
    return std::exp((1 - w) * std::log(bytes_per_s[i]) + w * std::log(bytes_per_s[i + 1]));
  }
};

/// Open MPI's collectives as the bulk and the other-operands schedules call
/// them (its algorithms route through the topology and copy; a ring of links
/// gives more than one link's rate to some, less to others), measured on a
/// context of `ranks` ranks. The model uses them for contexts of as many
/// ranks and otherwise prices a collective as R - 1 hops over one link.
struct collective_rates {
  int ranks = 0;                   ///< 0: not measured
  collective_rate allgather;       ///< MPI_Allgatherv (bulk)
  collective_rate iallgather;      ///< MPI_Iallgatherv (other operands, beside a GEMM)
  collective_rate reduce_scatter;  ///< MPI_Reduce_scatter of f32 sums
  collective_rate alltoall;        ///< MPI_Ialltoallv (other operands)
};

namespace detail {

/// The collectives of `r` (a collective_rates, const or not) with the names
/// the calibration file gives them.
template <class Rates, class F>
void for_each_collective(Rates& r, F&& f) {
  f("allgather", r.allgather), f("iallgather", r.iallgather), f("reduce_scatter", r.reduce_scatter),
      f("alltoall", r.alltoall);
}

}  // namespace detail

/// A ring's links as measured: every rank sending to one neighbour at once
/// (one direction), or to both (both directions).
struct link_rates {
  double latency_s = 0;         ///< per message
  double bytes_per_s = 0;       ///< one direction
  double bytes_per_s_both = 0;  ///< per direction, both directions busy
  /// A GEMM and transfers carrying half the links' both-ways capacity over its
  /// time, run at once, over the GEMM alone (>= 1): what moving data costs the
  /// cores (detail::seconds_per_byte).
  double gemm_slowdown = 1;
  collective_rates collectives;  ///< optional (older files lack them)
};

/// GEMM rates of one element type on a grid sizes x sizes x sizes (m, n, k).
struct gemm_rates {
  std::vector<int64_t> sizes;       ///< ascending
  std::vector<double> flops_per_s;  ///< [(i * n + j) * n + l] for m = sizes[i], n = sizes[j], k = sizes[l]

  [[nodiscard]] bool empty() const noexcept { return sizes.empty(); }  ///< nothing measured
  /// The rate at (m, n, k): trilinear in log2 of each extent, clamped to the grid.
  [[nodiscard]] double at(int64_t m, int64_t n, int64_t k) const {
    const size_t s = sizes.size();
    auto locate = [&](int64_t v, size_t& i0, double& w) {
      const double x = std::log2(static_cast<double>(std::max<int64_t>(v, 1)));
      i0 = 0, w = 0;
      if (s == 1 || x <= std::log2(double(sizes.front()))) return;
      if (x >= std::log2(double(sizes.back()))) {
        i0 = s - 2, w = 1;
        return;
      }
      while (i0 + 2 < s && x > std::log2(double(sizes[i0 + 1]))) ++i0;
      const double lo = std::log2(double(sizes[i0])), hi = std::log2(double(sizes[i0 + 1]));
      w = (x - lo) / (hi - lo);
    };
    size_t i = 0, j = 0, l = 0;
    double wi = 0, wj = 0, wl = 0;
    locate(m, i, wi), locate(n, j, wj), locate(k, l, wl);
    double r = 0;
    for (int di = 0; di < 2; ++di)
      for (int dj = 0; dj < 2; ++dj)
        for (int dl = 0; dl < 2; ++dl) {
          const double w = (di ? wi : 1 - wi) * (dj ? wj : 1 - wj) * (dl ? wl : 1 - wl);
          if (w == 0) continue;
          const size_t ii = std::min(i + di, s - 1), jj = std::min(j + dj, s - 1), ll = std::min(l + dl, s - 1);
          r += w * std::log(flops_per_s[(ii * s + jj) * s + ll]);
        }
    return std::exp(r);
  }
};

/// A schedule strategy::automatic measured for one call shape
/// (OVERLAP_AUTOMATIC=measured), kept so that a later job with the same
/// shapes starts from it instead of measuring again.
struct saved_choice {
  candidate chosen;  ///< what runs, with its measured time (slowest rank)
  std::string call;  ///< the call in words (op, element type, ranks, shape), for people reading the file
};

/// Everything the cost model is fed.
struct calibration {
  std::map<link_class, link_rates> links;  ///< the ring's links, by kind (inside a node, between nodes)
  std::map<dtype, gemm_rates> gemm;        ///< GEMM rates, by element type
  std::string origin;                      ///< the file it came from, or how it was measured
  /// Measured choices by call shape (the key hashes the op, every rank's
  /// sizes and options, and the nodes); a context adds each choice it settles.
  std::map<std::string, saved_choice> choices;

  [[nodiscard]] bool has(link_class l) const { return links.count(l) != 0; }  ///< links of kind l measured
  [[nodiscard]] bool has(dtype t) const {
    return gemm.count(t) != 0 && !gemm.at(t).empty();
  }  ///< GEMM rates of t measured

  /// The calibration as JSON text (the file's format).
  [[nodiscard]] std::string to_json() const;
  /// Parses to_json()'s format; `origin` names the text in errors.
  // Swapped, the origin fails to parse as JSON at once: the mistake is loud.
  [[nodiscard]] static calibration from_json(const std::string& text,  // NOLINT(bugprone-easily-swappable-parameters)
                                             const std::string& origin);
  /// Reads a calibration file (from_json's errors, or one naming the path).
  [[nodiscard]] static calibration load(const std::string& path);
  /// Collective over comm: the calibration rank `root` holds (`mine` there,
  /// ignored elsewhere), on every rank, so that every rank's cost model
  /// makes the same choices. `origin` names it in errors.
  [[nodiscard]] static calibration broadcast(MPI_Comm comm, int root, const calibration& mine,
                                             const std::string& origin);
};

}  // namespace overlap

// Header-only, the implementation comes with the declarations (flavour.hpp).
#ifndef OVERLAP_COMPILED
#include "overlap/schedule/calibration-inl.hpp"
#endif
