#pragma once
/// @file
/// A model of N transformer blocks (layers/transformer.hpp) trained on a
/// data-parallel x (context-parallel x) tensor-parallel mesh: forward
/// through the blocks, a mean-squared-error loss, backward, the
/// data-parallel gradient sum, and SGD with momentum (docs/layer.md).
///
/// Each data-parallel replica trains on its own sequence; the gradients are
/// averaged over the replicas (and summed over the context-parallel shares
/// of a sequence) by ring collectives over every rank with the same
/// tensor-parallel rank (layers/data_parallel.hpp), in buckets:
/// - dp_sync::overlapped starts each group of block i's gradients as soon
///   as its backward has made them (transformer_block::on_gradients: the
///   MLP's down projection, its up projection, then the rest), so that they
///   travel while the rest of block i and blocks i-1 .. 0 compute;
/// - dp_sync::bulk sums them after the whole backward pass (the baseline);
/// - dp_sync::none leaves each replica its own (the bound of any overlap).
///
/// With optimizer_state::sharded (ZeRO-1/2) each rank keeps the momentum of
/// its part of every bucket only: the gradients are reduce-scattered, each
/// rank updates its part, and the updated weights are all-gathered; with
/// dp_sync::overlapped those gathers run during the next step's forward,
/// block i's waited for just before block i runs (FSDP's prefetch).

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "overlap/core/flavour.hpp"
#include "overlap/engine/ring_reduce.hpp"
#include "overlap/engine/trace.hpp"
#include "overlap/kernels/element_cast.hpp"
#include "overlap/layers/block_params.hpp"
#include "overlap/layers/data_parallel.hpp"
#include "overlap/layers/phase_span.hpp"
#include "overlap/layers/transformer.hpp"
#include "overlap/mpi/communicator.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/runtime/agreement.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/mesh.hpp"
#include "overlap/runtime/watchdog.hpp"

namespace overlap::layers {

/// How a block_stack trains.
struct stack_options {
  /// Every block's options (strategy of the tensor-parallel ops, sequence
  /// parallelism, where the weight gradients run).
  block_options block;
  /// When the data-parallel gradients are combined. Must agree across ranks.
  overlap::layers::dp_sync dp_sync = overlap::layers::dp_sync::overlapped;
  /// Replicated (all-reduce) or sharded (reduce-scatter + all-gather,
  /// ZeRO-1/2) optimizer state. Must agree across ranks.
  overlap::layers::optimizer_state optimizer = overlap::layers::optimizer_state::replicated;
  /// Bytes of gradient per ring collective (PyTorch DDP's default is 25 MiB).
  /// Must agree across ranks; positive.
  int64_t bucket_bytes = int64_t(25) << 20;
  /// SGD with momentum: v = momentum * v + g; w -= learning_rate * v.
  /// Must agree across ranks; learning_rate >= 0, 0 <= momentum < 1.
  double learning_rate = 1e-2;
  double momentum = 0.9;  ///< see learning_rate
  /// Advance the data-parallel collectives on a thread of the stack's own,
  /// which tests them and sleeps between tests (at least
  /// config::progress_interval; see dp_reducer::options::thread). Open MPI
  /// moves a message only inside an MPI call. It needs
  /// MPI_THREAD_MULTIPLE and is never used under SMPI; without it the
  /// collectives advance between the blocks and in the stack's waits only.
  /// Local.
  bool dp_thread = true;
};

/// N transformer blocks, a loss and an optimizer on the ranks of a mesh.
/// T: float, double or bfloat16, as transformer_block; gradients, momentum
/// and the data-parallel sums are in the blocks' acc type (double for
/// double, else float).
///
/// The mesh has an axis "tp" with a context (the blocks' tensor-parallel
/// ops), optionally an axis "cp" with a context (the sequence's shares,
/// ring attention between them), and any other axes, whose ranks are data
/// parallel replicas. Collective over the mesh: every rank constructs it
/// and calls step() in the same order with the same shapes and options.
/// Not thread-safe; the mesh's contexts must not be used by others meanwhile.
template <class T>
class block_stack {
 public:
  using acc = typename transformer_block<T>::acc;  ///< gradients, momentum, sums

  /// Collective over the mesh. Checks the options on every rank (blocks >=
  /// 1, bucket_bytes > 0, learning_rate >= 0, 0 <= momentum < 1, the same
  /// everywhere) and builds the blocks (their own checks: the shape);
  /// failures throw std::invalid_argument on every rank.
  block_stack(overlap::mesh& m, int blocks, const block_shape& shape, const stack_options& opt = {});
  block_stack(const block_stack&) = delete;
  block_stack& operator=(const block_stack&) = delete;
  /// Completes the weight gathers still in flight (collective, as the
  /// construction was); a failure there is printed, not thrown.
  ~block_stack();

  /// The number of blocks.
  [[nodiscard]] int blocks() const noexcept { return static_cast<int>(blocks_.size()); }
  /// Block i (0: the first the input meets). Its params() are current after
  /// synchronize().
  [[nodiscard]] transformer_block<T>& block(int i) { return *blocks_.at(static_cast<size_t>(i)); }
  /// Where this rank's shards sit (the same for every block).
  [[nodiscard]] const block_layout& layout() const { return blocks_.front()->layout(); }
  /// Data-parallel replicas (ranks of the data-parallel sum, over cp's shares).
  [[nodiscard]] int replicas() const noexcept { return replicas_; }
  /// This rank's replica (0 .. replicas() - 1): the sequence it trains on.
  [[nodiscard]] int replica() const noexcept { return replica_; }
  /// True when a thread of the stack's own advances the data-parallel
  /// collectives (stack_options::dp_thread, MPI_THREAD_MULTIPLE, not SMPI).
  [[nodiscard]] bool threaded() const noexcept { return reducer_->threaded(); }

  /// Collective: one training step on this replica's sequence. x and target
  /// are this rank's rows of it (layout().rows() x hidden; row i is token
  /// layout().token(i)). Runs forward through every block, the loss
  /// L = 0.5 * mean over the replicas, tokens and features of
  /// (out - target)^2, backward, the data-parallel sum of the gradients as
  /// options say, and the optimizer step. Returns L before the update
  /// (the same on every rank).
  double step(matrix_view<const T> x, matrix_view<const T> target);
  /// Collective: completes the updated weights' gathers still in flight
  /// (sharded, overlapped); every block's params() are then current.
  void synchronize();
  /// Collective: the step's data-parallel collectives alone, as dp_sync::bulk
  /// runs them (every block's gradient sum, and with sharded state the
  /// weights' gather), on scratch: for timing their cost beside step(). The
  /// model is not changed. Nothing with dp_sync::none or one replica.
  void collectives_only();

 private:
  /// A block's flat parameters: its tensors grouped by gradients_ready
  /// (each group contiguous, in the order backward finishes them).
  static constexpr int groups = 3;
  struct segment {
    int64_t begin = 0, count = 0;
  };
  void agree(bool ok, const std::string& what);
  /// Collective: the cp axis, the replicas' communicator, the context over
  /// every rank and the reducer.
  void join(overlap::mesh& m);
  /// Collective: the options valid and the same everywhere.
  void check(int blocks);
  /// Collective: the activations, flat buffers and momentum, agreed.
  void allocate();
  /// on_gradients of block i: group g is final (flatten it; send it when overlapped).
  void gradients_made(int i, int g);
  /// step's parts: the loss (and dL/dout into grad_a_), the backward with
  /// the sums, the optimizer.
  double loss_and_gradient(matrix_view<const T> target);
  void backward_and_sums();
  void optimize();
  /// Lays out the flat buffers: every tensor's offset, each group's segment.
  void lay_out();
  /// f(tensor, its offset in the flat buffers) for every tensor of p (group g only, or all when g < 0).
  template <class P, class F>
  void each_tensor(P& p, int g, F&& f) const;
  /// Block i's gradients of group g into grads_[i], scaled by 1 / replicas.
  void flatten_gradients(int i, int g);
  /// Queues `what` of group g's segment of buf; returns its ticket.
  typename dp_reducer<acc>::ticket enqueue(engine::ring_collective what, std::vector<acc>& buf, int g);
  /// The optimizer on block i's gradients (grads_[i], summed as the options say).
  void update(int i, bool sharded);
  /// Block i's weights from weights_[i] (after their gather).
  void unflatten_weights(int i);
  /// Waits for block i's weight gather, if one is in flight, and takes its weights.
  void take_weights(int i);

  context* tp_;
  context* cp_ = nullptr;
  mpi::communicator replicas_comm_;    ///< every rank with this tp rank: the data-parallel sums
  std::unique_ptr<context> everyone_;  ///< over the whole mesh: agreements and the loss
  stack_options opt_;
  std::vector<std::unique_ptr<transformer_block<T>>> blocks_;
  std::unique_ptr<dp_reducer<acc>> reducer_;
  int replicas_ = 1, replica_ = 0, shares_ = 1;
  std::vector<std::vector<T>> acts_;                                  ///< the blocks' outputs
  std::vector<T> grad_a_, grad_b_;                                    ///< d(loss)/d(activation), in turns
  std::vector<std::vector<acc>> grads_, weights_, momentum_;          ///< per block, flat
  std::vector<acc> scratch_;                                          ///< collectives_only's buffer
  std::vector<typename dp_reducer<acc>::ticket> reduced_, gathered_;  ///< per block: 0 when none is in flight
  std::vector<int64_t> offsets_;                                      ///< every tensor's, in each() order
  std::vector<int> group_of_;                                         ///< every tensor's gradients_ready
  segment segments_[groups];
};

// ---------------------------------------------------------------------------

template <class T>
block_stack<T>::block_stack(overlap::mesh& m, int blocks, const block_shape& shape, const stack_options& opt)
    : tp_(&m.context("tp")), opt_(opt) {
  join(m);
  check(blocks);
  for (int i = 0; i < blocks; ++i) {
    blocks_.push_back(cp_ != nullptr ? std::make_unique<transformer_block<T>>(*tp_, *cp_, shape, opt.block)
                                     : std::make_unique<transformer_block<T>>(*tp_, shape, opt.block));
    blocks_.back()->on_gradients([this, i](gradients_ready g) { gradients_made(i, int(g)); });
  }
  lay_out();
  allocate();
}

template <class T>
void block_stack<T>::join(overlap::mesh& m) {
  bool has_cp = false;
  for (const mesh_axis& a : m.axes()) has_cp = has_cp || a.name == "cp";
  if (has_cp && m.size("cp") > 1) cp_ = &m.context("cp");
  shares_ = has_cp ? m.size("cp") : 1;
  // Everyone with this tp rank: the data-parallel replicas and, within a
  // replica, the cp shares (whose gradients are partial sums too).
  MPI_Comm split = MPI_COMM_NULL;
  int world_rank = 0;
  OVERLAP_MPI(MPI_Comm_rank, m.cart(), &world_rank);
  OVERLAP_MPI(MPI_Comm_split, m.cart(), m.coord("tp"), world_rank, &split);
  replicas_comm_ = mpi::communicator::adopt(split);
  overlap::config quiet = tp_->config();
  quiet.progress = progress_policy::none, quiet.trace.clear();
  everyone_ = std::make_unique<context>(m.cart(), quiet);
  replicas_ = replicas_comm_.size() / shares_;
  for (const mesh_axis& a : m.axes())  // the data axes' coordinates, as one index
    if (a.name != "tp" && a.name != "cp") replica_ = replica_ * a.size + m.coord(a.name);
  // Data-parallel rings on a thread of their own where one may call MPI
  // beside the caller's. Collective (a duplicate of the replicas'
  // communicator): made here, before anything that can fail on one rank.
  int provided = MPI_THREAD_SINGLE;
  OVERLAP_MPI(MPI_Query_thread, &provided);
  typename dp_reducer<acc>::options ro;
  ro.bucket = std::max<int64_t>(1, opt_.bucket_bytes / int64_t(sizeof(acc)));
  ro.timeout_s = tp_->config().timeout_s;
  ro.thread = opt_.dp_thread && !mpi::simulated && provided >= MPI_THREAD_MULTIPLE;
  ro.interval = tp_->config().progress_interval;
  reducer_ = std::make_unique<dp_reducer<acc>>(replicas_comm_.get(), ro);
  reducer_->trace(tp_->tracer());
}

template <class T>
void block_stack<T>::check(int blocks) {
  const stack_options& o = opt_;
  const bool sane = blocks >= 1 && o.bucket_bytes > 0 && std::isfinite(o.learning_rate) && o.learning_rate >= 0 &&
                    o.momentum >= 0 && o.momentum < 1;
  agree(sane, "block_stack needs blocks >= 1, bucket_bytes > 0, learning_rate >= 0 and 0 <= momentum < 1; got " +
                  std::to_string(blocks) + " blocks, bucket_bytes " + std::to_string(o.bucket_bytes) +
                  ", learning_rate " + std::to_string(o.learning_rate) + ", momentum " + std::to_string(o.momentum));
  auto bits = [](double v) {
    int64_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    return b;
  };
  const std::vector<int64_t> mine{blocks,         int64_t(o.dp_sync),    int64_t(o.optimizer),
                                  o.bucket_bytes, bits(o.learning_rate), bits(o.momentum)};
  agree(overlap::detail::same_everywhere(*everyone_, mine, "overlap::layers::block_stack"),
        "the ranks passed different blocks, dp_sync, optimizer, bucket_bytes, learning_rate or momentum");
}

template <class T>
void block_stack<T>::allocate() {
  const int64_t rows = layout().rows(), d = layout().shape.hidden,
                count = segments_[groups - 1].begin + segments_[groups - 1].count;
  const auto n = size_t(blocks());
  std::string failed;
  try {
    acts_.assign(n, std::vector<T>(size_t(rows * d)));
    grad_a_.resize(size_t(rows * d)), grad_b_.resize(size_t(rows * d));
    grads_.assign(n, std::vector<acc>(size_t(count)));
    const bool sharded =
        opt_.optimizer == optimizer_state::sharded && opt_.dp_sync != dp_sync::none && replicas_comm_.size() > 1;
    if (sharded) weights_.assign(n, std::vector<acc>(size_t(count)));
    reduced_.assign(n, 0), gathered_.assign(n, 0);
    // The momentum: all of it, or this rank's part of every bucket.
    int64_t owned = count;
    if (sharded) {
      owned = 0;
      for (const segment& sg : segments_) reducer_->for_each_owned(sg.count, [&](int64_t, int64_t k) { owned += k; });
    }
    momentum_.assign(n, std::vector<acc>(size_t(owned), acc(0)));
  } catch (const std::bad_alloc&) {
    failed = "cannot allocate the stack's activations, gradients and optimizer state (std::bad_alloc)";
  }
  agree(failed.empty(), failed);
}

template <class T>
void block_stack<T>::gradients_made(int i, int g) {
  flatten_gradients(i, g);
  if (opt_.dp_sync == dp_sync::overlapped && replicas_comm_.size() > 1)
    reduced_[size_t(i)] = enqueue(opt_.optimizer == optimizer_state::sharded ? engine::ring_collective::reduce_scatter
                                                                             : engine::ring_collective::all_reduce,
                                  grads_[size_t(i)], g);
  reducer_->poll();
}

template <class T>
block_stack<T>::~block_stack() {
  try {
    synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "overlap::layers::block_stack: a weight gather failed: %s\n", e.what());
  }
  reducer_.reset();  // its thread stops before the buffers it reads are freed (members declared after it)
}

template <class T>
void block_stack<T>::agree(bool ok, const std::string& what) {
  using overlap::detail::failure;
  overlap::detail::agree_on(*everyone_, ok ? failure() : failure(failure::kind::invalid_argument, what),
                            "overlap::layers::block_stack");
}

template <class T>
void block_stack<T>::lay_out() {
  // Each tensor's group, by name: what backward() has finished at each on_gradients call.
  auto group = [](const std::string& name) {
    if (name == "w2" || name == "b1") return int(gradients_ready::mlp_down);
    if (name == "w1") return int(gradients_ready::mlp_up);
    return int(gradients_ready::all);
  };
  std::vector<int64_t> sizes;
  blocks_.front()->params().each([&](const char* name, const auto& v, bool) {
    sizes.push_back(int64_t(v.size()));
    group_of_.push_back(group(name));
  });
  offsets_.assign(sizes.size(), 0);
  int64_t at = 0;
  for (int g = 0; g < groups; ++g) {
    segments_[g].begin = at;
    for (size_t t = 0; t < sizes.size(); ++t)
      if (group_of_[t] == g) offsets_[t] = at, at += sizes[t];
    segments_[g].count = at - segments_[g].begin;
  }
}

template <class T>
template <class P, class F>
void block_stack<T>::each_tensor(P& p, int g, F&& f) const {
  size_t t = 0;
  p.each([&](const char*, auto& v, bool) {
    if (g < 0 || group_of_[t] == g) f(v, offsets_[t]);
    ++t;
  });
}

template <class T>
void block_stack<T>::flatten_gradients(int i, int g) {
  const acc scale = acc(1) / acc(replicas_);
  acc* flat = grads_[size_t(i)].data();
  each_tensor(blocks_[size_t(i)]->grads(), g, [&](const auto& v, int64_t at) {
    for (size_t k = 0; k < v.size(); ++k) flat[at + int64_t(k)] = v[k] * scale;
  });
}

template <class T>
typename dp_reducer<typename block_stack<T>::acc>::ticket block_stack<T>::enqueue(engine::ring_collective what,
                                                                                  std::vector<acc>& buf, int g) {
  return reducer_->enqueue(what, buf.data() + segments_[g].begin, segments_[g].count);
}

template <class T>
void block_stack<T>::update(int i, bool sharded) {
  const acc lr = acc(opt_.learning_rate), mu = acc(opt_.momentum);
  const std::vector<acc>& g = grads_[size_t(i)];
  std::vector<acc>& v = momentum_[size_t(i)];
  if (!sharded) {
    each_tensor(blocks_[size_t(i)]->params(), -1, [&](auto& w, int64_t at) {
      for (size_t k = 0; k < w.size(); ++k) {
        const size_t f = size_t(at) + k;
        v[f] = mu * v[f] + g[f];
        w[k] = detail::cast<T>(detail::cast<acc>(w[k]) - lr * v[f]);
      }
    });
    return;
  }
  // This rank's part of every bucket: the weights as they are, the summed
  // gradient, this part's momentum; the gathers bring the other parts.
  std::vector<acc>& w = weights_[size_t(i)];
  each_tensor(blocks_[size_t(i)]->params(), -1, [&](const auto& p, int64_t at) {
    for (size_t k = 0; k < p.size(); ++k) w[size_t(at) + k] = detail::cast<acc>(p[k]);
  });
  size_t j = 0;
  for (const segment& sg : segments_)
    reducer_->for_each_owned(sg.count, [&](int64_t at, int64_t n) {
      for (int64_t k = sg.begin + at; k < sg.begin + at + n; ++k, ++j) {
        v[j] = mu * v[j] + g[size_t(k)];
        w[size_t(k)] -= lr * v[j];
      }
    });
}

template <class T>
void block_stack<T>::unflatten_weights(int i) {
  const std::vector<acc>& w = weights_[size_t(i)];
  each_tensor(blocks_[size_t(i)]->params(), -1, [&](auto& p, int64_t at) {
    for (size_t k = 0; k < p.size(); ++k) p[k] = detail::cast<T>(w[size_t(at) + k]);
  });
}

template <class T>
void block_stack<T>::take_weights(int i) {
  auto& t = gathered_[size_t(i)];
  if (t == 0) return;
  reducer_->wait(t);
  t = 0;
  unflatten_weights(i);
}

template <class T>
void block_stack<T>::synchronize() {
  for (int i = 0; i < blocks(); ++i) take_weights(i);
}

template <class T>
void block_stack<T>::collectives_only() {
  if (opt_.dp_sync == dp_sync::none || replicas_comm_.size() < 2) return;
  synchronize();
  const bool sharded = opt_.optimizer == optimizer_state::sharded;
  scratch_.resize(grads_.front().size());
  for (int i = blocks() - 1; i >= 0; --i)
    for (int g = 0; g < groups; ++g)
      reducer_->wait(enqueue(sharded ? engine::ring_collective::reduce_scatter : engine::ring_collective::all_reduce,
                             scratch_, g));
  for (int i = 0; sharded && i < blocks(); ++i)
    for (int g = 0; g < groups; ++g) reducer_->wait(enqueue(engine::ring_collective::all_gather, scratch_, g));
}

template <class T>
double block_stack<T>::step(matrix_view<const T> x, matrix_view<const T> target) {
  const block_layout& l = layout();
  const int64_t n = l.rows(), d = l.shape.hidden;
  auto fits = [&](const matrix_view<const T>& v) {
    return v.rows == n && v.cols == d && v.ld >= d && (n * d == 0 || v.data != nullptr);
  };
  auto dims = [](const matrix_view<const T>& v) {
    return std::to_string(v.rows) + " x " + std::to_string(v.cols) + " (ld " + std::to_string(v.ld) + ")";
  };
  agree(fits(x) && fits(target), "step: x and target must be " + std::to_string(n) + " x " + std::to_string(d) +
                                     " (ld >= " + std::to_string(d) + "); got " + dims(x) + " and " + dims(target));
  // Forward, each block's weights taken from their gather just before it runs.
  for (int i = 0; i < blocks(); ++i) {
    take_weights(i);
    const matrix_view<const T> in = i == 0 ? x : matrix_view<const T>{acts_[size_t(i - 1)].data(), n, d};
    blocks_[size_t(i)]->forward(in, {acts_[size_t(i)].data(), n, d});
    reducer_->poll();
  }
  const double loss = loss_and_gradient(target);
  backward_and_sums();
  optimize();
  return loss;
}

template <class T>
double block_stack<T>::loss_and_gradient(matrix_view<const T> target) {
  // The loss of this rank's rows and its gradient: every tp rank holds all of
  // the share's rows without sequence parallelism, so one of them counts them.
  const block_layout& l = layout();
  const int64_t n = l.rows(), d = l.shape.hidden;
  const std::vector<T>& out = acts_.back();
  const double per_entry = 1.0 / (double(l.shape.seq) * double(d));
  double mine = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < d; ++c) {
      const double e = detail::cast<double>(out[size_t(r * d + c)]) - detail::cast<double>(target(r, c));
      mine += 0.5 * e * e * per_entry;
      grad_a_[size_t(r * d + c)] = detail::cast<T>(e * per_entry);
    }
  if (!l.axes.sequence_parallel && tp_->rank() != 0) mine = 0;
  double loss = 0;
  MPI_Comm all = everyone_->comm();
  overlap::detail::watched_collective(
      *everyone_, "MPI_Allreduce", [&] { return MPI_Allreduce(&mine, &loss, 1, MPI_DOUBLE, MPI_SUM, all); },
      [&](MPI_Request* r) { return MPI_Iallreduce(&mine, &loss, 1, MPI_DOUBLE, MPI_SUM, all, r); },
      [] { return std::string("overlap::layers::block_stack: the loss"); });
  return loss / replicas_;
}

template <class T>
void block_stack<T>::backward_and_sums() {
  // Last block first; each block's on_gradients flattens each group as it is
  // made, and sends it when overlapped (gradients_made). Bulk sums them after.
  const int64_t n = layout().rows(), d = layout().shape.hidden;
  {
    detail::phase_span span(tp_->tracer(), "backward");
    for (int i = blocks() - 1; i >= 0; --i) {
      std::vector<T>& dout = (blocks() - 1 - i) % 2 == 0 ? grad_a_ : grad_b_;
      std::vector<T>& din = (blocks() - 1 - i) % 2 == 0 ? grad_b_ : grad_a_;
      blocks_[size_t(i)]->backward({dout.data(), n, d}, {din.data(), n, d});
    }
  }
  if (opt_.dp_sync != dp_sync::bulk || replicas_comm_.size() < 2) return;
  detail::phase_span span(tp_->tracer(), "data-parallel sum");
  const bool sharded = opt_.optimizer == optimizer_state::sharded;
  for (int i = blocks() - 1; i >= 0; --i)
    for (int g = 0; g < groups; ++g)
      reducer_->wait(enqueue(sharded ? engine::ring_collective::reduce_scatter : engine::ring_collective::all_reduce,
                             grads_[size_t(i)], g));
}

template <class T>
void block_stack<T>::optimize() {
  // In the order the sums finish; the sharded form's weight gathers are
  // queued first block first, the order the next forward needs them.
  detail::phase_span span(tp_->tracer(), "optimizer");
  const bool sharded =
      opt_.dp_sync != dp_sync::none && replicas_comm_.size() > 1 && opt_.optimizer == optimizer_state::sharded;
  for (int i = blocks() - 1; i >= 0; --i) {
    auto& t = reduced_[size_t(i)];
    if (t != 0) reducer_->wait(t), t = 0;
    update(i, sharded);
  }
  if (!sharded) return;
  for (int i = 0; i < blocks(); ++i) {
    for (int g = 0; g < groups; ++g)
      gathered_[size_t(i)] = enqueue(engine::ring_collective::all_gather, weights_[size_t(i)], g);
    if (opt_.dp_sync == dp_sync::bulk) take_weights(i);
  }
}

}  // namespace overlap::layers
