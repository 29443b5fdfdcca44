#pragma once
/// @file
/// all_gather_matmul: a product whose sharded operand would be all-gathered
/// first, decomposed into ring steps that overlap each shard's transfer with
/// the partial product of the shard before it.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "overlap/context.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/engine/ring.hpp"
#include "overlap/matrix.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/ops/agreement.hpp"
#include "overlap/ops/options.hpp"

namespace overlap {
namespace detail {

/// Where the gathered operand X sits in the product and how it is split.
struct ag_geometry {
  gathered variant = gathered::lhs_rows;
  bool lhs = true;          ///< X is the left operand A (else the right operand B)
  bool shard_rows = true;   ///< X is sharded along its rows (else its columns)
  bool contracting = false; ///< the sharded dimension is K: partial products accumulate
  int64_t x_rows = 0, x_cols = 0;
  shard_layout layout;      ///< X's sharded dimension over the ranks

  explicit ag_geometry(gathered g = gathered::lhs_rows)
      : variant(g),
        lhs(g == gathered::lhs_rows || g == gathered::lhs_cols),
        shard_rows(g == gathered::lhs_rows || g == gathered::rhs_rows),
        contracting(g == gathered::lhs_cols || g == gathered::rhs_rows) {}
};

/// Where a ring piece lives on this rank.
enum class piece_home { local, gathered_out, slot };

template <class T>
struct ag_step {
  int64_t r0 = 0, c0 = 0, nr = 0, nc = 0;  ///< the piece, in X's global coordinates
  piece_home home = piece_home::slot;
  int64_t slot_offset = 0;                 ///< element offset into the slot buffer
  int64_t ld = 0;                          ///< leading dimension where it lives
  MPI_Datatype type = MPI_DATATYPE_NULL;   ///< the piece as one element (owned by the plan)
  bool send = false;                       ///< forwarded to the previous rank
  bool recv = false;                       ///< arrives from the next rank
  std::shared_ptr<const gemm_kernel<T>> kernel;
};

template <class T>
struct ag_plan final : plan_base {
  ag_geometry geo;
  overlap::strategy strategy = overlap::strategy::ring;
  // ring
  std::vector<ag_step<T>> steps;
  int lead = 1;
  engine::buffer<T> slots;
  std::map<std::tuple<int64_t, int64_t, int64_t>, mpi::datatype> types;  // by (rows, cols, ld)
  // bulk
  engine::buffer<T> gather_ws, blocks_ws;
  std::vector<int> counts, displs;
  std::shared_ptr<const gemm_kernel<T>> bulk_kernel;
  bool gather_into_out = false;  ///< bulk gathers straight into the caller's gathered view

  MPI_Datatype type_of(int64_t rows, int64_t cols, int64_t ld) {
    auto& t = types[{rows, cols, ld}];
    if (t.get() == MPI_DATATYPE_NULL) t = mpi::block_type<T>(rows, cols, ld);
    return t.get();
  }
};

/// The call's operands; `out` is the optional gathered by-product (has_out).
template <class T>
struct ag_args {
  matrix_view<const T> a, b;
  matrix_view<T> c, out;
  bool has_out = false;
  /// The view holding this rank's shard of X.
  [[nodiscard]] const matrix_view<const T>& local(const ag_geometry& g) const { return g.lhs ? a : b; }
};

inline int64_t chunk_begin(int64_t extent, int chunks, int j) {
  return extent / chunks * j + std::min<int64_t>(j, extent % chunks);
}

template <class T>
void copy_block(matrix_view<const T> src, matrix_view<T> dst) {
  for (int64_t i = 0; i < src.rows; ++i) std::copy_n(src.data + i * src.ld, src.cols, dst.data + i * dst.ld);
}

/// The GEMM of one piece of X (nr x nc, stored with ld):
/// lhs: C[r0:+nr, :] (+)= X[piece] @ b[c0:+nc, :];  rhs: C[:, c0:+nc] (+)= a[:, r0:+nr] @ X[piece].
template <class T>
gemm_desc ag_gemm(const ag_geometry& geo, const ag_args<T>& x, int64_t nr, int64_t nc, int64_t ld, bool accumulate) {
  if (geo.lhs) return gemm_desc{nr, x.b.cols, nc, ld, x.b.ld, x.c.ld, false, false, accumulate};
  return gemm_desc{x.a.rows, nc, nr, x.a.ld, ld, x.c.ld, false, false, accumulate};
}

template <class T>
void ag_build(context& ctx, ag_plan<T>& plan, const ag_args<T>& x, int chunks) {
  const ag_geometry& geo = plan.geo;
  const int R = ctx.size();
  const int p = ctx.rank();
  const matrix_view<const T>& local = x.local(geo);

  if (plan.strategy == strategy::bulk) {
    const int64_t per_unit = geo.shard_rows ? geo.x_cols : geo.x_rows;  // elements per shard row/col
    plan.counts.resize(static_cast<size_t>(R));
    plan.displs.resize(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      plan.counts[static_cast<size_t>(r)] = mpi::detail::to_count(geo.layout.size(r) * per_unit, "all-gather count");
      plan.displs[static_cast<size_t>(r)] = mpi::detail::to_count(geo.layout.offset(r) * per_unit, "all-gather displacement");
    }
    const auto elems = static_cast<size_t>(geo.x_rows * geo.x_cols);
    // Row shards land as contiguous row blocks of X: straight into gathered_out
    // when it is dense, else into gather_ws. Column shards land as blocks in
    // blocks_ws and are unpacked side by side into gathered_out or gather_ws.
    plan.gather_into_out = x.has_out && geo.shard_rows && x.out.ld == geo.x_cols;
    if (!geo.shard_rows) plan.blocks_ws = engine::buffer<T>(elems);
    if (!plan.gather_into_out && (geo.shard_rows || !x.has_out)) plan.gather_ws = engine::buffer<T>(elems);
    const int64_t x_ld = x.has_out ? x.out.ld : geo.x_cols;
    plan.bulk_kernel = ctx.make_kernel<T>(ag_gemm(geo, x, geo.x_rows, geo.x_cols, x_ld, false));
    return;
  }

  // Ring: at step t = i * chunks + j this rank computes chunk j of shard
  // (p + i) % R, sends it on to p - 1 (unless it went all the way round) and
  // receives the piece it needs `chunks` steps later from p + 1.
  const int slots = chunks + 1;
  plan.lead = chunks;
  int64_t slot_elems = 0;
  for (int i = 0; i < R; ++i) {
    const int shard = (p + i) % R;
    const int64_t off = geo.layout.offset(shard), len = geo.layout.size(shard);
    for (int j = 0; j < chunks; ++j) {
      ag_step<T> st;
      // Chunks split X's output dimension: rows of A, or columns of B.
      const bool chunk_rows = geo.lhs;
      const int64_t extent = chunk_rows == geo.shard_rows ? len : (chunk_rows ? geo.x_rows : geo.x_cols);
      const int64_t base = chunk_rows == geo.shard_rows ? off : 0;
      const int64_t b0 = base + chunk_begin(extent, chunks, j);
      const int64_t bn = chunk_begin(extent, chunks, j + 1) - chunk_begin(extent, chunks, j);
      if (geo.shard_rows) {
        st.r0 = chunk_rows ? b0 : off;
        st.nr = chunk_rows ? bn : len;
        st.c0 = chunk_rows ? 0 : b0;
        st.nc = chunk_rows ? geo.x_cols : bn;
      } else {
        st.c0 = chunk_rows ? off : b0;
        st.nc = chunk_rows ? len : bn;
        st.r0 = chunk_rows ? b0 : 0;
        st.nr = chunk_rows ? bn : geo.x_rows;
      }
      const int t = i * chunks + j;
      if (x.has_out) {
        st.home = piece_home::gathered_out;
        st.ld = x.out.ld;
      } else if (i == 0) {
        st.home = piece_home::local;
        st.ld = local.ld;
      } else {
        st.home = piece_home::slot;
        st.ld = st.nc;
        st.slot_offset = t % slots;  // scaled to elements below
        slot_elems = std::max(slot_elems, st.nr * st.nc);
      }
      const bool nonempty = st.nr > 0 && st.nc > 0;
      st.send = nonempty && i < R - 1;
      st.recv = nonempty && i > 0;
      if (st.send || st.recv) st.type = plan.type_of(st.nr, st.nc, st.ld);
      st.kernel = ctx.make_kernel<T>(ag_gemm(geo, x, st.nr, st.nc, st.ld, geo.contracting && i > 0));
      plan.steps.push_back(std::move(st));
    }
  }
  for (auto& st : plan.steps)
    if (st.home == piece_home::slot) st.slot_offset *= slot_elems;
  plan.slots = engine::buffer<T>(static_cast<size_t>(slot_elems * slots));
}

/// Checks a call, agrees with the other ranks, and returns the plan (built
/// and cached on first use). Collective.
template <class T>
ag_plan<T>& ag_prepare(context& ctx, const ag_args<T>& x, const ag_options& opt) {
  const ag_geometry geo(opt.gathered);
  arg_checks checks(std::string("overlap::all_gather_matmul(gathered=") + to_string(opt.gathered) + ")");
  const auto g = static_cast<int>(opt.gathered);
  const auto s = static_cast<int>(opt.strategy);
  checks.require(g >= 0 && g <= 3, "ag_options.gathered has an invalid value " + std::to_string(g));
  checks.require(s >= 0 && s <= 2, "ag_options.strategy has an invalid value " + std::to_string(s));
  checks.view("a", x.a);
  checks.view("b", x.b);
  checks.view("c", x.c);
  if (x.has_out) checks.view("gathered_out", x.out);
  auto dim = [](const char* n, int64_t v) { return std::string(n) + " (" + std::to_string(v) + ")"; };
  switch (opt.gathered) {
    case gathered::lhs_rows:
      checks.require(x.b.rows == x.a.cols, dim("b.rows", x.b.rows) + " must equal " + dim("a.cols", x.a.cols) + ", the K dimension");
      checks.require(x.c.cols == x.b.cols, dim("c.cols", x.c.cols) + " must equal " + dim("b.cols", x.b.cols));
      break;
    case gathered::lhs_cols:
      checks.require(x.c.rows == x.a.rows, dim("c.rows", x.c.rows) + " must equal " + dim("a.rows", x.a.rows));
      checks.require(x.c.cols == x.b.cols, dim("c.cols", x.c.cols) + " must equal " + dim("b.cols", x.b.cols));
      break;
    case gathered::rhs_cols:
      checks.require(x.b.rows == x.a.cols, dim("b.rows", x.b.rows) + " must equal " + dim("a.cols", x.a.cols) + ", the K dimension");
      checks.require(x.c.rows == x.a.rows, dim("c.rows", x.c.rows) + " must equal " + dim("a.rows", x.a.rows));
      break;
    case gathered::rhs_rows:
      checks.require(x.c.rows == x.a.rows, dim("c.rows", x.c.rows) + " must equal " + dim("a.rows", x.a.rows));
      checks.require(x.c.cols == x.b.cols, dim("c.cols", x.c.cols) + " must equal " + dim("b.cols", x.b.cols));
      break;
  }
  int backend = -1;
  try {
    backend = static_cast<int>(ctx.backend_for<T>());
  } catch (const std::invalid_argument& e) {
    checks.require(false, e.what());
  }

  const int chunks = ctx.config().ag_chunks;
  const plan_key key{1, g, s, chunks, backend, static_cast<int64_t>(sizeof(T)),
                     x.a.rows, x.a.cols, x.a.ld, x.b.rows, x.b.cols, x.b.ld, x.c.rows, x.c.cols, x.c.ld,
                     x.has_out, x.out.rows, x.out.cols, x.out.ld};
  plan_base* cached = checks.failed() ? nullptr : ctx.find_plan(key);
  if (agree(ctx, checks, cached)) return static_cast<ag_plan<T>&>(*cached);

  // Plan miss on some rank: exchange every rank's sizes and check the rules
  // that span ranks. Every rank sees the same table, so all throw alike.
  const std::vector<int64_t> mine{g, s, chunks, x.a.rows, x.a.cols, x.b.rows, x.b.cols,
                                  x.c.rows, x.c.cols, x.has_out, x.out.rows, x.out.cols};
  const size_t nv = mine.size();
  const std::vector<int64_t> all = allgather_values(ctx, mine);
  const int R = ctx.size();
  auto at = [&](int r, size_t i) { return all[static_cast<size_t>(r) * nv + i]; };
  auto fail = [&](const std::string& msg) { throw std::invalid_argument(checks.op() + ": " + msg); };
  const char* fields[] = {"ag_options.gathered", "ag_options.strategy", "config.ag_chunks"};
  for (int r = 1; r < R; ++r)
    for (size_t i = 0; i < 3; ++i)
      if (at(r, i) != at(0, i))
        fail(std::string(fields[i]) + " differs across ranks (rank 0: " + std::to_string(at(0, i)) + ", rank " +
             std::to_string(r) + ": " + std::to_string(at(r, i)) + "); it must agree");
  enum { ar = 3, ac, br, bc, cr, cc, has_out, outr, outc };
  // The dimension every rank must agree on, and the sharded one that sums up.
  const size_t agreed = geo.lhs ? (geo.shard_rows ? ac : ar) : (geo.shard_rows ? bc : br);
  const size_t sharded = geo.lhs ? (geo.shard_rows ? ar : ac) : (geo.shard_rows ? br : bc);
  const char* agreed_name = geo.lhs ? (geo.shard_rows ? "a.cols (K)" : "a.rows (M)") : (geo.shard_rows ? "b.cols (N)" : "b.rows (K)");
  std::vector<int64_t> sizes(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    if (at(r, agreed) != at(0, agreed))
      fail(std::string(agreed_name) + " must agree across ranks (rank 0: " + std::to_string(at(0, agreed)) +
           ", rank " + std::to_string(r) + ": " + std::to_string(at(r, agreed)) + ")");
    sizes[static_cast<size_t>(r)] = at(r, sharded);
  }
  ag_geometry full = geo;
  full.layout = shard_layout(sizes);
  const int64_t total = full.layout.total();
  full.x_rows = geo.shard_rows ? total : at(0, agreed);
  full.x_cols = geo.shard_rows ? at(0, agreed) : total;
  for (int r = 0; r < R; ++r) {
    const std::string on = " on rank " + std::to_string(r);
    const std::string sum = std::to_string(total);
    switch (geo.variant) {
      case gathered::lhs_rows:
        if (at(r, cr) != total) fail("c.rows (" + std::to_string(at(r, cr)) + ")" + on + " must equal M = sum of a.rows over ranks (" + sum + ")");
        break;
      case gathered::lhs_cols:
        if (at(r, br) != total) fail("b.rows (" + std::to_string(at(r, br)) + ")" + on + " must equal K = sum of a.cols over ranks (" + sum + ")");
        break;
      case gathered::rhs_cols:
        if (at(r, cc) != total) fail("c.cols (" + std::to_string(at(r, cc)) + ")" + on + " must equal N = sum of b.cols over ranks (" + sum + ")");
        break;
      case gathered::rhs_rows:
        if (at(r, ac) != total) fail("a.cols (" + std::to_string(at(r, ac)) + ")" + on + " must equal K = sum of b.rows over ranks (" + sum + ")");
        break;
    }
    if (at(r, has_out) && (at(r, outr) != full.x_rows || at(r, outc) != full.x_cols))
      fail("gathered_out" + on + " is " + std::to_string(at(r, outr)) + " x " + std::to_string(at(r, outc)) +
           "; it must be the gathered operand's " + std::to_string(full.x_rows) + " x " + std::to_string(full.x_cols));
  }

  auto plan = std::make_unique<ag_plan<T>>();
  plan->geo = full;
  plan->strategy = opt.strategy == strategy::bulk ? strategy::bulk : strategy::ring;
  plan->fingerprint = hash_values(all, hash_values(key));
  ag_build<T>(ctx, *plan, x, chunks);
  return static_cast<ag_plan<T>&>(*ctx.store_plan(key, std::move(plan)));
}

/// The ring pattern of all_gather_matmul, for engine::run_ring.
template <class T>
class ag_ring_pattern {
 public:
  ag_ring_pattern(ag_plan<T>& plan, const ag_args<T>& x, int rank) : plan_(plan), x_(x), local_(x.local(plan.geo)) {
    const int64_t off = plan.geo.layout.offset(rank);
    (plan.geo.shard_rows ? local_r0_ : local_c0_) = off;
  }
  [[nodiscard]] int steps() const { return static_cast<int>(plan_.steps.size()); }
  [[nodiscard]] int lead() const { return plan_.lead; }
  [[nodiscard]] engine::transfer recv(int t) const {
    const auto& st = plan_.steps[static_cast<size_t>(t)];
    return st.recv ? engine::transfer{piece(st), st.type} : engine::transfer{};
  }
  [[nodiscard]] engine::transfer send(int t) const {
    const auto& st = plan_.steps[static_cast<size_t>(t)];
    return st.send ? engine::transfer{piece(st), st.type} : engine::transfer{};
  }
  void compute(int t) {
    const auto& st = plan_.steps[static_cast<size_t>(t)];
    if (plan_.geo.lhs) st.kernel->run(piece(st), x_.b.data + st.c0 * x_.b.ld, x_.c.data + st.r0 * x_.c.ld);
    else st.kernel->run(x_.a.data + st.r0, piece(st), x_.c.data + st.c0);
  }

 private:
  [[nodiscard]] T* piece(const ag_step<T>& st) const {
    switch (st.home) {
      case piece_home::local:
        // Local pieces are only read and sent; MPI_Isend takes a const buffer.
        return const_cast<T*>(local_.data + (st.r0 - local_r0_) * st.ld + (st.c0 - local_c0_));
      case piece_home::gathered_out: return x_.out.data + st.r0 * x_.out.ld + st.c0;
      case piece_home::slot: return plan_.slots.data() + st.slot_offset;
    }
    return nullptr;
  }
  ag_plan<T>& plan_;
  const ag_args<T>& x_;
  matrix_view<const T> local_;
  int64_t local_r0_ = 0, local_c0_ = 0;  ///< where this rank's shard starts in X
};

template <class T>
void ag_bulk(context& ctx, ag_plan<T>& plan, const ag_args<T>& x) {
  const ag_geometry& geo = plan.geo;
  const matrix_view<const T>& local = x.local(geo);
  T* dst = !geo.shard_rows ? plan.blocks_ws.data() : (plan.gather_into_out ? x.out.data : plan.gather_ws.data());
  // The local shard is copied to its place and gathered MPI_IN_PLACE: Open MPI
  // 4.1's tuned MPI_Allgatherv hangs at odd rank counts when the send side is
  // a derived datatype (seen with doubles at 3 ranks), so none is used here.
  const int me = ctx.rank();
  copy_block<T>(local, {dst + plan.displs[static_cast<size_t>(me)], local.rows, local.cols});
  OVERLAP_MPI(MPI_Allgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, dst, plan.counts.data(), plan.displs.data(),
              mpi::base_type<T>::get(), ctx.comm());
  const matrix_view<T> xv = x.has_out ? x.out : matrix_view<T>(plan.gather_ws.data(), geo.x_rows, geo.x_cols);
  if (geo.shard_rows) {
    if (x.has_out && !plan.gather_into_out) copy_block<T>({dst, geo.x_rows, geo.x_cols}, x.out);
  } else {
    for (int r = 0; r < ctx.size(); ++r) {
      const int64_t off = geo.layout.offset(r), len = geo.layout.size(r);
      copy_block<T>({dst + off * geo.x_rows, geo.x_rows, len}, xv.block(0, off, geo.x_rows, len));
    }
  }
  if (geo.lhs) plan.bulk_kernel->run(xv.data, x.b.data, x.c.data);
  else plan.bulk_kernel->run(x.a.data, xv.data, x.c.data);
}

template <class T>
void all_gather_matmul_impl(context& ctx, const ag_args<T>& x, const ag_options& opt) {
  ag_plan<T>& plan = ag_prepare<T>(ctx, x, opt);
  if (plan.strategy == strategy::bulk) {
    ag_bulk(ctx, plan, x);
    return;
  }
  if (x.has_out) {  // the local shard joins the gathered by-product first
    const ag_geometry& geo = plan.geo;
    const int64_t off = geo.layout.offset(ctx.rank());
    const auto& l = x.local(geo);
    copy_block<T>(l, geo.shard_rows ? x.out.block(off, 0, l.rows, l.cols) : x.out.block(0, off, l.rows, l.cols));
  }
  ag_ring_pattern<T> pattern(plan, x, ctx.rank());
  const int R = ctx.size();
  const engine::ring_links links{ctx.comm(), (ctx.rank() + 1) % R, (ctx.rank() + R - 1) % R, 1};
  engine::run_ring(links, pattern, ctx.requests(), ctx.progress());
}

}  // namespace detail

/// C = AG(X) @ ..., where X is the operand named by opt.gathered, sharded over
/// the ranks of ctx (see ag_options / gathered for the four layouts).
///
/// Collective over ctx: every rank calls it with the same options; the
/// dimension that is not sharded must agree across ranks, shards may have any
/// size (including zero), and C's rows or columns follow rank order. Bad input
/// on any rank raises std::invalid_argument on every rank; the context stays
/// usable. The first call with a shape builds and caches a plan (sizes
/// exchanged, schedule, GEMM primitives, buffers); later calls reuse it.
template <class T>
void all_gather_matmul(context& ctx, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c,
                       const ag_options& opt = {}) {
  detail::all_gather_matmul_impl<T>(ctx, detail::ag_args<T>{a, b, c, {}, false}, opt);
}

/// As above, and also writes the gathered operand X into gathered_out (M x K
/// for lhs_*, K x N for rhs_*), received directly into it.
template <class T>
void all_gather_matmul(context& ctx, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c,
                       matrix_view<T> gathered_out, const ag_options& opt = {}) {
  detail::all_gather_matmul_impl<T>(ctx, detail::ag_args<T>{a, b, c, gathered_out, true}, opt);
}

#ifdef OVERLAP_COMPILED
extern template void all_gather_matmul<float>(context&, matrix_view<const float>, matrix_view<const float>,
                                              matrix_view<float>, const ag_options&);
extern template void all_gather_matmul<double>(context&, matrix_view<const double>, matrix_view<const double>,
                                               matrix_view<double>, const ag_options&);
extern template void all_gather_matmul<float>(context&, matrix_view<const float>, matrix_view<const float>,
                                              matrix_view<float>, matrix_view<float>, const ag_options&);
extern template void all_gather_matmul<double>(context&, matrix_view<const double>, matrix_view<const double>,
                                               matrix_view<double>, matrix_view<double>, const ag_options&);
#endif

}  // namespace overlap
