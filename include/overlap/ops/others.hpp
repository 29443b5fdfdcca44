#pragma once
/// @file
/// The other-operands algorithm (algorithm::others) of both ops: instead of
/// the data the op's name moves (the sharded operand of an all-gather, the
/// partial sums of a reduce-scatter), the operands the other side needs
/// travel, every rank computes the products it can, and the results go where
/// the caller asked for them. It moves less for thin products
/// (docs/design.md, "Choosing a schedule"). A plan here is a list of steps,
/// built by each op for its layout and run by others_runner: pack, non-blocking
/// input collectives (MPI_Iallgatherv, MPI_Ialltoallv) while this rank's own
/// product is computed, one GEMM per peer block, each output block sent to
/// its owner (MPI_Isend) as soon as it is computed, or MPI_Reduce_scatter of
/// partial sums, and a pass for the epilogue. A gathered operand may travel
/// in pieces (one MPI_Iallgatherv each): the products of a piece, and the
/// output blocks they make, follow its arrival while the next piece moves.
/// Received blocks may be assembled side by side into one operand of the
/// whole contracted dimension, so that one GEMM replaces one per peer.

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "overlap/core/matrix.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/ops/geometry.hpp"
#include "overlap/ops/run.hpp"
#include "overlap/ops/site.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/schedule/model.hpp"

namespace overlap::detail {

/// Where a GEMM operand or a packed block is read: the caller's operands,
/// the gathered or exchanged blocks, or the blocks this rank sends (its own
/// block is there before the exchange completes).
enum class others_src { caller_a, caller_b, gathered, exchanged, sent, assembled };

/// A stored block of the caller's a or b, packed densely (ld = nc) at
/// element `to` of a plan buffer, or, for placements, a dense block at
/// element `to` of the received buffer copied to c at (r0, c0).
struct others_block {
  others_src from = others_src::caller_a;
  int64_t r0 = 0, c0 = 0, nr = 0, nc = 0;
  int64_t to = 0;
};

/// The stored block of an operand (stored transposed when `trans`) that
/// holds logical rows `lr` and columns `lc` of op(operand).
inline others_block stored_block(others_src from, bool trans, range lr, range lc, int64_t to) {
  if (trans) return {from, lc.begin, lr.begin, lc.len, lr.len, to};
  return {from, lr.begin, lc.begin, lr.len, lc.len, to};
}
/// The leading dimension of a densely packed block with `cols` stored columns.
inline int64_t packed_ld(int64_t cols) { return std::max<int64_t>(1, cols); }

/// Piece counts the cost model may try for the other-operands algorithm
/// besides one piece, and the floors of a piece's width (rows or columns of
/// the widest rank's operand): thinner pieces cost the GEMMs more than they
/// hide (docs/design.md, "Choosing a schedule").
inline constexpr std::array<int, 2> others_piece_candidates{2, 4};
inline constexpr int64_t others_min_piece_units = 32;
/// The width a piece keeps where no model chooses (fast transfers hide little).
inline constexpr int64_t others_rule_piece_units = 128;

/// Piece counts the other-operands algorithm may gather an operand in along
/// its free dimension, so that products (and output blocks) follow the
/// transfer piece by piece (docs/design.md): as configured (the op's
/// configured chunks), else 1 and those of others_piece_candidates whose
/// pieces of `widest` keep others_min_piece_units, for the cost model to
/// choose from.
template <class Op>
std::vector<int> others_piece_counts(const config& c, int64_t widest) {
  const int configured = c.*Op::configured_chunks;
  if (configured > 0) return {configured};
  std::vector<int> out{1};
  for (int p : others_piece_candidates)
    if (widest / p >= others_min_piece_units) out.push_back(p);
  return out;
}

/// The piece count taken without a model: the most of others_piece_counts'
/// whose pieces keep others_rule_piece_units.
inline int others_piece_rule(const std::vector<int>& pieces, int64_t widest) {
  int best = pieces.front();
  for (int p : pieces)
    if (p == pieces.front() || widest / p >= others_rule_piece_units) best = p;
  return best;
}

/// Piece j of `pieces` of an extent (as even as can be).
inline range others_piece(int64_t extent, int j, int pieces) {
  const int64_t b = extent * j / pieces;
  return {b, extent * (j + 1) / pieces - b};
}

/// A dense rows x cols block at element `at` of a received buffer, copied to
/// element `to` of the assembled buffer (leading dimension `ld`): blocks of
/// K_q stored columns, side by side, make one operand of all of K.
struct others_concat {
  others_src from = others_src::exchanged;
  int64_t at = 0, rows = 0, cols = 0, to = 0, ld = 0;
};

/// One GEMM of the plan: operands at element offsets of their sources; the
/// product goes to the caller's c (to_c, element offset `out` of T) or to the
/// products buffer (element offset `out` of the plan's out type). addend: the
/// fp32 sum so far (products at 0) is added while writing c (bf16).
struct others_gemm {
  int peer = 0;     ///< the rank whose block it multiplies (and, for owners, who gets the product)
  int inputs = -1;  ///< the input collective it waits for (-1: its inputs are local)
  int send = 0;     ///< output `owners`: elements of its block sent to `peer` (0: none)
  others_src a = others_src::caller_a, b = others_src::caller_b;
  int64_t a_off = 0, b_off = 0, out = 0;
  int64_t bias_off = 0;    ///< the bias of its first output column
  int64_t addend_off = 0;  ///< where its addend starts in the products buffer (elements of the plan's out type)
  /// Received blocks to assemble once its inputs arrived, before it runs.
  std::vector<others_concat> assemble;
  bool to_c = false;
  bool addend = false;
  gemm_desc desc;
  std::shared_ptr<const gemm_kernel> kernel;
};

/// How the products reach the caller's c.
enum class others_output {
  owners,   ///< blocks of T go to the ranks that own them (MPI_Alltoallv) and are placed in c
  reduced,  ///< partial sums are reduced and scattered (MPI_Reduce_scatter)
  local,    ///< the GEMMs wrote this rank's result into c already
};

/// MPI counts and displacements of one collective, in elements.
struct others_counts {
  std::vector<int> counts, displs;
  /// Counts from element counts (one per rank); the blocks lie one after the
  /// other in rank order starting from rank `first` and going round (0: rank
  /// order).
  explicit others_counts(const std::vector<int64_t>& n = {}, int first = 0) {
    const size_t R = n.size();
    counts.resize(R), displs.resize(R);
    int64_t at = 0;
    for (size_t i = 0; i < R; ++i) {
      const size_t q = (static_cast<size_t>(first) + i) % R;
      counts[q] = mpi::detail::to_count(n[q], "count of a collective");
      displs[q] = mpi::detail::to_count(at, "displacement of a collective");
      at += n[q];
    }
  }
  [[nodiscard]] int64_t total() const {
    int64_t sum = 0;
    for (int c : counts) sum += c;
    return sum;
  }
};

/// One input all-gather: a piece of every rank's block, at element `base`
/// of the gathered buffer (this rank's packed in place first, at own.to).
struct others_gather {
  others_block own;
  others_counts at;  ///< relative to base
  int64_t base = 0;
};

/// Output `owners`: a block this rank receives from `peer`, at element `at`
/// of where received blocks land.
struct others_recv {
  int peer = 0;
  int64_t at = 0;
  int count = 0;
};

template <class T>
struct others_plan {
  dtype out = dtype_of<T>();  ///< element type of the products buffer
  // Inputs: every rank's block gathered, in one piece or more ...
  std::vector<others_gather> gathers;
  engine::buffer<T> gathered;
  // ... and blocks exchanged, one to every rank.
  bool exchange = false;
  std::vector<others_block> exchange_out;
  others_counts sent_at, exchanged_at;
  engine::buffer<T> send, exchanged;
  // The products.
  std::vector<others_gemm> gemms;
  engine::buffer<T> assembled;  ///< operands assembled from received blocks (others_concat)
  engine::buffer<std::byte> products;
  // Output.
  others_output output = others_output::local;
  std::vector<others_recv> recvs;  ///< owners: blocks received, in the order each peer sends them
  bool recv_into_c = false;        ///< owners: received straight into c (dense row blocks)
  engine::buffer<T> received;
  std::vector<others_block> place;   ///< owners: received blocks to c
  std::vector<others_block> own;     ///< owners: this rank's own blocks, from element `to` of products to c
  others_counts reduce_at;           ///< reduced: the sums each rank gets
  int64_t result_elems = 0;          ///< reduced: elements of `result` (0: the sums land in c)
  engine::buffer<std::byte> result;  ///< reduced: when not straight into c
  bool finish = false;               ///< a pass over c for the epilogue (and the fp32 result)
  gemm_desc finish_desc;
};

/// Elements this rank sends each rank (`sent[q]`) and receives from each
/// (`got[q]`) in an exchange.
struct others_traffic {
  std::vector<int64_t> sent, got;
};

/// The exchange of a plan's inputs (MPI_Alltoallv): what this rank sends,
/// packed from the caller's operand by `block_to(q, to)` at element `to` of
/// the send buffer (in rank order), and what it receives, laid out from rank
/// `first` on.
template <class T, class BlockTo>
void others_exchange(others_plan<T>& o, const others_traffic& t, int first, BlockTo&& block_to) {
  o.exchange = true;
  o.sent_at = others_counts(t.sent);
  o.exchanged_at = others_counts(t.got, first);
  for (size_t q = 0; q < t.sent.size(); ++q)
    o.exchange_out.push_back(block_to(static_cast<int>(q), o.sent_at.displs[q]));
}

/// The all-gathers of a plan's inputs, one per piece j of `pieces`, one
/// after the other in the gathered buffer: `counts_of(j)` says what every
/// rank contributes and where it lies (others_counts); this rank packs its
/// own in place, the block `own_block(j, gather)` returns.
template <class T, class CountsOf, class OwnBlock>
void others_gathers(others_plan<T>& o, int pieces, CountsOf&& counts_of, OwnBlock&& own_block) {
  int64_t base = 0;
  for (int j = 0; j < pieces; ++j) {
    others_gather ga;
    ga.at = counts_of(j);
    ga.base = base;
    ga.own = own_block(j, ga);
    base += ga.at.total();
    o.gathers.push_back(std::move(ga));
  }
}

/// The pass that finishes c after an output collective: c = act(c + bias)
/// (sums in c already), or c = act(sum + bias) from the sums in `result`.
template <class T>
void others_finish(others_plan<T>& plan, matrix_view<T> c, const epilogue& e, bool from_result, dtype acc) {
  const gemm_desc d = finishing_pass(c.rows, c.cols, c.ld, dtype_of<T>(), static_cast<bool>(e.bias), e.activation,
                                     from_result, c.cols, acc);
  plan.finish = from_result || d.has_epilogue();
  plan.finish_desc = d;
}

/// An others plan as the cost model prices it (schedule/model.hpp, work's
/// pipelined fields): its GEMMs (this rank's own first: their inputs are
/// local), the input gathers' blocks, what this rank (`rank`) exchanges
/// with its peers, and the output collective. One batch member.
template <class T>
work others_work(const others_plan<T>& o, int rank) {
  const auto elem = static_cast<double>(sizeof(T));
  auto most = [](const others_counts& c) {
    return c.counts.empty() ? 0 : *std::max_element(c.counts.begin(), c.counts.end());
  };
  work w;
  w.pipelined = true;
  w.alltoall_out = o.output == others_output::owners;
  w.own_gemms = 0;
  for (const others_gemm& g : o.gemms) {
    w.gemms.push_back({g.desc.m, g.desc.n, g.desc.k});
    if (g.inputs < 0) ++w.own_gemms;
  }
  w.pieces = std::max<int>(1, static_cast<int>(o.gathers.size()));
  for (const others_gather& g : o.gathers) w.allgather_block += double(most(g.at)) * elem;
  double sent = 0, got = 0;
  if (o.exchange) {
    const auto p = static_cast<size_t>(rank);
    sent += double(o.sent_at.total() - o.sent_at.counts[p]);
    got += double(o.exchanged_at.total() - o.exchanged_at.counts[p]);
  }
  if (w.alltoall_out) {
    for (const others_gemm& g : o.gemms) sent += g.send;
    for (const others_recv& r : o.recvs) got += r.count;
  }
  w.alltoall_bytes = std::max(sent, got) * elem;
  if (o.output == others_output::reduced) w.reduce_scatter_block = double(most(o.reduce_at)) * double(size_of(o.out));
  return w;
}

/// Runs an others plan on the call's operands (collective). The input
/// collectives are non-blocking: the first GEMM (this rank's own block, whose
/// inputs are local) runs while they move data, and with output `owners`
/// every block goes to its owner (MPI_Isend) as soon as it is computed, while
/// the next is computed. Transfers are progressed as in the ring engine, and
/// a failure once the ranks agreed is fatal like one in a ring.
template <class T>
class others_runner {
 public:
  /// x: the op's operands (x.a, x.b and the output x.c).
  template <class Args>
  others_runner(context& ctx, const plan_base& info, others_plan<T>& plan, int tag, const Args& x, const T* bias)
      : ctx_(ctx),
        info_(info),
        plan_(plan),
        tag_(tag),
        a_(x.a),
        b_(x.b),
        c_(x.c),
        bias_(bias),
        comm_(ctx.config().phases != ring_phases::compute_only),
        compute_(ctx.config().phases != ring_phases::comm_only),
        owners_(plan.output == others_output::owners),
        owned_(plan.recv_into_c ? x.c.data : plan.received.data()) {}

  void run() {
    for (const others_gather& g : plan_.gathers) pack(g.own, plan_.gathered.data());
    if (plan_.exchange)
      for (const others_block& k : plan_.exchange_out) pack(k, plan_.send.data());
    // ctx.fatal forgets the pending requests.
    fatal_on_failure(
        ctx_, info_, "others", [&] { return info_.summary; },
        [&] {
          if (comm_) post_inputs();
          int waited = -1;
          for (const others_gemm& gm : plan_.gemms) {
            if (comm_ && gm.inputs > waited) {
              post_gathers_through(gm.inputs);
              ctx_.requests().wait_due(waited = gm.inputs);
              post_gathers_through(waited + 1);
            }
            if (compute_)
              for (const others_concat& k : gm.assemble)
                if (k.rows > 0 && k.cols > 0)  // an empty block has no storage there: `assembled` may be empty
                  copy_block<T>({source(k.from) + k.at, k.rows, k.cols},
                                {plan_.assembled.data() + k.to, k.rows, k.cols, k.ld});
            multiply(gm);
          }
          if (comm_) {
            post_gathers_through(static_cast<int>(plan_.gathers.size()) - 1);  // pieces no GEMM of this rank needs
            ctx_.requests().wait_all();
          }
        });
    if (owners_) place_blocks();
    if (plan_.output == others_output::reduced) reduce();
    if (plan_.finish)
      run_local_step(ctx_, info_, [&] {
        run_degenerate(plan_.finish_desc, gemm_operands().c(c_.data).bias(bias_).addend(result()));
      });
  }

 private:
  [[nodiscard]] const T* source(others_src s) const {
    switch (s) {
      case others_src::caller_a: return a_.data;
      case others_src::caller_b: return b_.data;
      case others_src::gathered: return plan_.gathered.data();
      case others_src::exchanged: return plan_.exchanged.data();
      case others_src::sent: return plan_.send.data();
      case others_src::assembled: return plan_.assembled.data();
    }
    return nullptr;
  }
  void pack(const others_block& k, T* dst) const {
    const matrix_view<const T>& v = k.from == others_src::caller_a ? a_ : b_;
    copy_block<T>(v.block(k.r0, k.c0, k.nr, k.nc), {dst + k.to, k.nr, k.nc});
  }
  [[nodiscard]] std::byte* products() const { return plan_.products.data(); }
  /// p + off, where an empty operand's null pointer stays null: offsetting
  /// it is undefined behaviour, and a GEMM with an empty dimension reads
  /// and writes nothing (Clang's UBSan flagged group_test at 6 ranks).
  template <class P>
  [[nodiscard]] static P* at(P* p, int64_t off) {
    return p == nullptr ? p : p + off;
  }
  [[nodiscard]] void* result() const {
    return plan_.result.data() != nullptr ? static_cast<void*>(plan_.result.data()) : static_cast<void*>(c_.data);
  }

  /// The first input collectives (gather piece 0: deadline 0; the exchange:
  /// 0), and the receives of this rank's output blocks (after every piece).
  void post_inputs() {
    maybe_stall(ctx_.rank());
    mpi::request_group& g = ctx_.requests();
    const others_counts &s = plan_.sent_at, &r = plan_.exchanged_at;
    posted_gathers_ = 0;
    post_gathers_through(0);
    if (plan_.exchange)
      OVERLAP_MPI(MPI_Ialltoallv, plan_.send.data(), s.counts.data(), s.displs.data(), type_, plan_.exchanged.data(),
                  r.counts.data(), r.displs.data(), type_, ctx_.comm(),
                  g.add(0, {0, MPI_PROC_NULL, type_, false, true}));
    const int after_gathers = std::max(static_cast<int>(plan_.gathers.size()), 1);
    for (const others_recv& rv : plan_.recvs)
      if (owners_ && rv.count > 0) {
        mpi::request_group::about what{0, rv.peer, type_, false};
        what.count = rv.count;
        OVERLAP_MPI(MPI_Irecv, owned_ + rv.at, rv.count, type_, rv.peer, tag_, ctx_.comm(), g.add(after_gathers, what));
      }
  }

  /// Posts the gather pieces up to `last` (deadline: the piece's index) that
  /// are not posted yet. The pieces go one after another: the next is posted
  /// once the one before it arrived, while its products are computed. Posted
  /// all at once, they share the links (a fabric or SimGrid shares a link
  /// among the messages on it), so the first piece arrived only when they
  /// all did and its products waited for the whole gather. Every rank makes
  /// the calls in one order (piece 0, the exchange, the other pieces by
  /// index), as MPI requires of collectives.
  void post_gathers_through(int last) {
    last = std::min(last, static_cast<int>(plan_.gathers.size()) - 1);
    for (; posted_gathers_ <= last; ++posted_gathers_) {
      const others_gather& ga = plan_.gathers[static_cast<size_t>(posted_gathers_)];
      OVERLAP_MPI(MPI_Iallgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, plan_.gathered.data() + ga.base,
                  ga.at.counts.data(), ga.at.displs.data(), type_, ctx_.comm(),
                  ctx_.requests().add(posted_gathers_, {0, MPI_PROC_NULL, type_, false, true}));
    }
  }

  /// One GEMM, and with output `owners` the send of its block to its owner.
  void multiply(const others_gemm& gm) {
    const auto out_size = static_cast<int64_t>(size_of(plan_.out));
    if (compute_) {
      void* dst =
          gm.to_c ? static_cast<void*>(at(c_.data, gm.out)) : static_cast<void*>(at(products(), gm.out * out_size));
      engine::progress_scope scope(ctx_.progress(), ctx_.requests());
      gemm_operands io;
      io.a(at(source(gm.a), gm.a_off)).b(at(source(gm.b), gm.b_off)).c(dst);
      io.bias(gm.desc.bias ? at(bias_, gm.bias_off) : nullptr);
      gm.kernel->run(io.addend(gm.addend ? at(products(), gm.addend_off * out_size) : nullptr));
      scope.finish();
    }
    if (comm_ && owners_ && gm.peer != ctx_.rank() && gm.send > 0) {
      mpi::request_group::about what{0, gm.peer, type_, true};
      what.count = gm.send;
      OVERLAP_MPI(MPI_Isend, products() + gm.out * out_size, gm.send, type_, gm.peer, tag_, ctx_.comm(),
                  ctx_.requests().add(std::max(static_cast<int>(plan_.gathers.size()), 1), what));
    }
  }

  /// Output `owners`: this rank's own blocks and the received ones to their places in c.
  void place_blocks() const {
    for (const others_block& k : plan_.own)
      if (compute_)
        copy_block<T>({reinterpret_cast<const T*>(products()) + k.to, k.nr, k.nc}, c_.block(k.r0, k.c0, k.nr, k.nc));
    for (const others_block& k : plan_.place)
      copy_block<T>({plan_.received.data() + k.to, k.nr, k.nc}, c_.block(k.r0, k.c0, k.nr, k.nc));
  }

  /// Output `reduced`: the partial sums reduced and scattered into c (or result).
  void reduce() {
    const MPI_Datatype acc = mpi_type_of(plan_.out);
    const others_counts& r = plan_.reduce_at;
    run_collective(
        ctx_, info_, "MPI_Reduce_scatter",
        [&] {
          return MPI_Reduce_scatter(products(), mpi::any_buffer(result()), r.counts.data(), acc, MPI_SUM, ctx_.comm());
        },
        [&](MPI_Request* q) {
          return MPI_Ireduce_scatter(products(), mpi::any_buffer(result()), r.counts.data(), acc, MPI_SUM, ctx_.comm(),
                                     q);
        });
  }

  context& ctx_;
  const plan_base& info_;
  others_plan<T>& plan_;
  int tag_;
  matrix_view<const T> a_, b_;
  matrix_view<T> c_;
  const T* bias_;
  bool comm_, compute_, owners_;
  T* owned_;                ///< where this rank's received output blocks land
  int posted_gathers_ = 0;  ///< gather pieces posted so far
  MPI_Datatype type_ = mpi_type_of(dtype_of<T>());
};

/// Sets up the output collective MPI_Reduce_scatter of partial sums laid out
/// as `sums` (elements per rank, in rank order) into c, or into a result
/// buffer (others_allocate makes it) when c is not dense or the sums are not
/// of T; and the pass after it.
template <class T>
void others_reduce_into(others_plan<T>& plan, const std::vector<int64_t>& sums, matrix_view<T> c, const epilogue& e) {
  plan.output = others_output::reduced;
  plan.reduce_at = others_counts(sums);
  const bool via_result = c.ld != c.cols || plan.out != dtype_of<T>();
  plan.result_elems = via_result ? c.rows * c.cols : 0;
  others_finish(plan, c, e, via_result, plan.out);
}

/// Allocates the buffers of a plan whose blocks and counts are set (none
/// for a dry plan).
template <class T>
void others_allocate(const build_site& at, others_plan<T>& plan, int64_t product_elems) {
  if (at.dry()) return;
  if (plan.result_elems > 0)
    plan.result = engine::buffer<std::byte>(static_cast<size_t>(plan.result_elems) * size_of(plan.out));
  int64_t gathered = 0;
  for (const others_gather& g : plan.gathers) gathered = std::max(gathered, g.base + g.at.total());
  if (!plan.gathers.empty()) plan.gathered = engine::buffer<T>(static_cast<size_t>(gathered));
  if (plan.exchange) {
    plan.send = engine::buffer<T>(static_cast<size_t>(plan.sent_at.total()));
    plan.exchanged = engine::buffer<T>(static_cast<size_t>(plan.exchanged_at.total()));
  }
  int64_t assembled = 0;
  for (const others_gemm& g : plan.gemms)
    for (const others_concat& k : g.assemble)
      if (k.rows > 0 && k.cols > 0) assembled = std::max(assembled, k.to + (k.rows - 1) * k.ld + k.cols);
  if (assembled > 0) plan.assembled = engine::buffer<T>(static_cast<size_t>(assembled));
  plan.products = engine::buffer<std::byte>(static_cast<size_t>(product_elems) * size_of(plan.out));
  int64_t received = 0;
  for (const others_recv& r : plan.recvs) received = std::max(received, r.at + r.count);
  if (plan.output == others_output::owners && !plan.recv_into_c)
    plan.received = engine::buffer<T>(static_cast<size_t>(received));
}

}  // namespace overlap::detail
