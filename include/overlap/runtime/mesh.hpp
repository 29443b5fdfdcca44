#pragma once
/// @file
/// A mesh of ranks (data parallel x tensor parallel, x pipeline ...): the
/// Cartesian communicator of a named shape, the communicator along each axis
/// and a context on the axes whose ops overlap.

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "overlap/config.hpp"
#include "overlap/core/error.hpp"
#include "overlap/mpi/communicator.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/failure.hpp"

namespace overlap {

/// One axis of a mesh: its name, its extent (0: whatever the communicator's
/// size leaves, for at most one axis) and whether it gets a context.
struct mesh_axis {
  std::string name;      ///< e.g. "tp"; unique within a mesh
  int size = 0;          ///< ranks along the axis; 0: the rest
  bool context = false;  ///< build an overlap::context over each group of this axis
};

/// A Cartesian mesh over a communicator. Axes are listed outermost first and
/// the last one varies fastest: rank r of comm sits at the coordinates of r
/// in row-major order (no reordering). Put the tensor-parallel axis last so
/// that a tensor group is consecutive ranks, which mpirun and srun place on
/// one node when it fits (--map-by slot, -m block: the defaults): its
/// transfers then go through shared memory and the ranks across nodes are
/// the data-parallel ones. Example, 8 ranks as 2 x 4:
///
///     overlap::mesh m(MPI_COMM_WORLD, {{"dp", 0}, {"tp", 4, true}});
///     overlap::all_gather_matmul<float>(m.context("tp"), a, b, c);
///     MPI_Allreduce(..., m.comm("dp"));  // gradients, over the data axis
///
/// Owns the Cartesian communicator, one communicator per axis (the ranks
/// that differ from this one in that axis only; MPI_Cart_sub) and the
/// contexts. Not copyable; movable.
class mesh {
 public:
  /// Collective over comm. Every rank must give the same axes; a shape that
  /// does not multiply to comm's size, an axis named twice, an empty name, a
  /// negative size or two axes of size 0 raise std::invalid_argument on every
  /// rank. The contexts are created with cfg, collectively over their axis.
  mesh(MPI_Comm comm, std::vector<mesh_axis> axes, const overlap::config& cfg);
  /// As above, with the configuration from the OVERLAP_* environment.
  mesh(MPI_Comm comm, std::vector<mesh_axis> axes) : mesh(comm, std::move(axes), config::from_env()) {}

  /// The axes, with sizes resolved (no 0 left).
  [[nodiscard]] const std::vector<mesh_axis>& axes() const noexcept { return axes_; }
  /// Extent of an axis.
  [[nodiscard]] int size(const std::string& axis) const { return axes_[index(axis)].size; }
  /// This rank's coordinate along an axis (0 .. size(axis) - 1), which is
  /// also its rank in comm(axis) and in context(axis).
  [[nodiscard]] int coord(const std::string& axis) const { return coords_[index(axis)]; }
  /// The Cartesian communicator over every rank (ranks as in the given comm).
  [[nodiscard]] MPI_Comm cart() const noexcept { return cart_.get(); }
  /// The ranks that differ from this one in `axis` only, ordered by it.
  [[nodiscard]] MPI_Comm comm(const std::string& axis) const { return along_[index(axis)].get(); }
  /// The context of an axis created with context = true;
  /// std::invalid_argument for another axis.
  [[nodiscard]] overlap::context& context(const std::string& axis) {
    const size_t i = index(axis);
    if (!contexts_[i])
      throw std::invalid_argument("overlap::mesh: axis '" + axis + "' has no context; create the mesh with {\"" + axis +
                                  "\", size, true}");
    return *contexts_[i];
  }

 private:
  [[nodiscard]] size_t index(const std::string& axis) const {
    for (size_t i = 0; i < axes_.size(); ++i)
      if (axes_[i].name == axis) return i;
    std::string names;
    for (const mesh_axis& a : axes_) names += (names.empty() ? "" : ", ") + a.name;
    throw std::invalid_argument("overlap::mesh: no axis named '" + axis + "' (axes: " + names + ")");
  }

  void agree_on_axes(MPI_Comm comm, int rank, const std::string& who) const;
  void make_communicators(MPI_Comm comm, int rank);
  void make_contexts(const overlap::config& cfg, const std::string& who);

  std::vector<mesh_axis> axes_;
  std::vector<int> coords_;
  mpi::communicator cart_;
  std::vector<mpi::communicator> along_;
  std::vector<std::unique_ptr<overlap::context>> contexts_;  ///< destroyed before the communicators
};

namespace detail {
/// The axes with a 0 size resolved, or "" and why they cannot be (local).
inline std::string resolve_axes(std::vector<mesh_axis>& axes, int ranks) {
  if (axes.empty()) return "a mesh needs at least one axis";
  int64_t known = 1;
  mesh_axis* open = nullptr;
  for (size_t i = 0; i < axes.size(); ++i) {
    mesh_axis& a = axes[i];
    if (a.name.empty()) return "axis " + std::to_string(i) + " has an empty name";
    for (size_t j = 0; j < i; ++j)
      if (axes[j].name == a.name) return "axis '" + a.name + "' is named twice";
    if (a.size < 0) return "axis '" + a.name + "' has a negative size (" + std::to_string(a.size) + ")";
    if (a.size == 0) {
      if (open != nullptr) return "axes '" + open->name + "' and '" + a.name + "' both have size 0 (at most one may)";
      open = &a;
    } else {
      known *= a.size;
    }
  }
  std::string shape;
  for (const mesh_axis& a : axes) shape += (shape.empty() ? "" : " x ") + a.name + "=" + std::to_string(a.size);
  if (open != nullptr && known > 0 && ranks % known == 0) open->size = static_cast<int>(ranks / known);
  if (open != nullptr ? open->size == 0 : known != ranks)
    return "the shape " + shape + " does not fit the communicator's " + std::to_string(ranks) + " ranks";
  return {};
}

/// A text of the axes as given, the same on every rank that gave the same.
inline std::string axes_text(const std::vector<mesh_axis>& axes) {
  std::string s;
  for (const mesh_axis& a : axes) s += a.name + "=" + std::to_string(a.size) + (a.context ? "+ctx" : "") + ";";
  return s;
}
}  // namespace detail

inline mesh::mesh(MPI_Comm comm, std::vector<mesh_axis> axes, const overlap::config& cfg) : axes_(std::move(axes)) {
  const std::string who = "overlap::mesh";
  detail::require_mpi_running(who.c_str());
  if (comm == MPI_COMM_NULL) throw std::invalid_argument(who + ": comm is MPI_COMM_NULL");
  int rank = 0, ranks = 1;
  OVERLAP_MPI(MPI_Comm_rank, comm, &rank);
  OVERLAP_MPI(MPI_Comm_size, comm, &ranks);
  agree_on_axes(comm, rank, who);
  // The same axes and size everywhere: every rank finds the same problem.
  if (const std::string why = detail::resolve_axes(axes_, ranks); !why.empty())
    throw std::invalid_argument(who + ": " + why);
  make_communicators(comm, rank);
  make_contexts(cfg, who);
}

inline void mesh::agree_on_axes(MPI_Comm comm, int rank, const std::string& who) const {
  // Every rank's text of the axes against rank 0's.
  const std::string mine = detail::axes_text(axes_);
  auto n = static_cast<int64_t>(mine.size());
  OVERLAP_MPI(MPI_Bcast, &n, 1, MPI_INT64_T, 0, comm);
  std::string first(static_cast<size_t>(n), '\0');
  if (rank == 0) first = mine;
  OVERLAP_MPI(MPI_Bcast, first.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
  int differs = first == mine ? 0 : 1, any = 0;
  OVERLAP_MPI(MPI_Allreduce, &differs, &any, 1, MPI_INT, MPI_MAX, comm);
  if (any != 0)
    throw std::invalid_argument(who + ": the ranks gave different axes (rank 0: " + first + " this rank: " + mine +
                                "); every rank must give the same");
}

inline void mesh::make_communicators(MPI_Comm comm, int rank) {
  const int nd = static_cast<int>(axes_.size());
  std::vector<int> dims, periods(axes_.size(), 0);
  for (const mesh_axis& a : axes_) dims.push_back(a.size);
  MPI_Comm cart = MPI_COMM_NULL;
  OVERLAP_MPI(MPI_Cart_create, comm, nd, dims.data(), periods.data(), 0, &cart);
  cart_ = mpi::communicator::adopt(cart);
  coords_.resize(axes_.size());
  OVERLAP_MPI(MPI_Cart_coords, cart, rank, nd, coords_.data());
  for (size_t i = 0; i < axes_.size(); ++i) {
    std::vector<int> remain(axes_.size(), 0);
    remain[i] = 1;
    MPI_Comm sub = MPI_COMM_NULL;
    OVERLAP_MPI(MPI_Cart_sub, cart, remain.data(), &sub);
    along_.push_back(mpi::communicator::adopt(sub));
  }
}

inline void mesh::make_contexts(const overlap::config& cfg, const std::string& who) {
  // A context's constructor fails on every rank of its group alike, but the
  // groups along an axis are several: all ranks learn whether any failed.
  contexts_.resize(axes_.size());
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (!axes_[i].context) continue;
    detail::failure failed;
    try {
      contexts_[i] = std::make_unique<overlap::context>(along_[i].get(), cfg);
    } catch (...) {
      failed = detail::failure::capture(std::current_exception());
    }
    int bad = failed.failed() ? 1 : 0, any_bad = 0;
    OVERLAP_MPI(MPI_Allreduce, &bad, &any_bad, 1, MPI_INT, MPI_MAX, cart_.get());
    if (failed.failed()) failed.raise(who + ": the context of axis '" + axes_[i].name + "'");
    if (any_bad != 0)
      throw std::runtime_error(who + ": creating the context of axis '" + axes_[i].name +
                               "' failed on other ranks (they report why)");
  }
}

}  // namespace overlap
