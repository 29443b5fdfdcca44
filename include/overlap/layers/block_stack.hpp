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
/// - dp_sync::overlapped starts block i's as soon as its backward has
///   made them, so that they travel while blocks i-1 .. 0 compute;
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
  /// which tests them and sleeps config::progress_interval between tests
  /// (Open MPI moves a message only inside an MPI call). It needs
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
  void agree(bool ok, const std::string& what);
  /// The number of elements of a block's parameters (all twelve tensors).
  [[nodiscard]] int64_t parameter_count() const;
  /// Block i's gradients into grads_[i], scaled by 1 / replicas.
  void flatten_gradients(int i);
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
};

// ---------------------------------------------------------------------------

template <class T>
block_stack<T>::block_stack(overlap::mesh& m, int blocks, const block_shape& shape, const stack_options& opt)
    : tp_(&m.context("tp")), opt_(opt) {
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
  const int summed = replicas_comm_.size();
  replicas_ = summed / shares_;
  for (const mesh_axis& a : m.axes())  // the data axes' coordinates, as one index
    if (a.name != "tp" && a.name != "cp") replica_ = replica_ * a.size + m.coord(a.name);

  const bool sane = blocks >= 1 && opt.bucket_bytes > 0 && std::isfinite(opt.learning_rate) && opt.learning_rate >= 0 &&
                    opt.momentum >= 0 && opt.momentum < 1;
  agree(sane, "block_stack needs blocks >= 1, bucket_bytes > 0, learning_rate >= 0 and 0 <= momentum < 1; got " +
                  std::to_string(blocks) + " blocks, bucket_bytes " + std::to_string(opt.bucket_bytes) +
                  ", learning_rate " + std::to_string(opt.learning_rate) + ", momentum " +
                  std::to_string(opt.momentum));
  auto bits = [](double v) {
    int64_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    return b;
  };
  const std::vector<int64_t> mine{blocks,           int64_t(opt.dp_sync),    int64_t(opt.optimizer),
                                  opt.bucket_bytes, bits(opt.learning_rate), bits(opt.momentum)};
  agree(overlap::detail::same_everywhere(*everyone_, mine, "overlap::layers::block_stack"),
        "the ranks passed different blocks, dp_sync, optimizer, bucket_bytes, learning_rate or momentum");

  for (int i = 0; i < blocks; ++i)
    blocks_.push_back(cp_ != nullptr ? std::make_unique<transformer_block<T>>(*tp_, *cp_, shape, opt.block)
                                     : std::make_unique<transformer_block<T>>(*tp_, shape, opt.block));
  const int64_t rows = layout().rows(), d = shape.hidden, count = parameter_count();
  std::string failed;
  try {
    acts_.assign(size_t(blocks), std::vector<T>(size_t(rows * d)));
    grad_a_.resize(size_t(rows * d)), grad_b_.resize(size_t(rows * d));
    grads_.assign(size_t(blocks), std::vector<acc>(size_t(count)));
    const bool sharded = opt.optimizer == optimizer_state::sharded && opt.dp_sync != dp_sync::none && summed > 1;
    if (sharded) weights_.assign(size_t(blocks), std::vector<acc>(size_t(count)));
    reduced_.assign(size_t(blocks), 0), gathered_.assign(size_t(blocks), 0);
    // Data-parallel rings on a thread of their own where one may call MPI
    // beside the caller's.
    int provided = MPI_THREAD_SINGLE;
    OVERLAP_MPI(MPI_Query_thread, &provided);
    const bool thread = opt.dp_thread && !mpi::simulated && provided >= MPI_THREAD_MULTIPLE;
    const int64_t bucket = std::max<int64_t>(1, opt.bucket_bytes / int64_t(sizeof(acc)));
    reducer_ = std::make_unique<dp_reducer<acc>>(replicas_comm_.get(), bucket, tp_->config().timeout_s, thread,
                                                 tp_->config().progress_interval);
    reducer_->trace(tp_->tracer());
    // The momentum: all of it, or this rank's part of every bucket.
    int64_t owned = count;
    if (sharded) {
      owned = 0;
      reducer_->for_each_owned(count, [&](int64_t, int64_t n) { owned += n; });
    }
    momentum_.assign(size_t(blocks), std::vector<acc>(size_t(owned), acc(0)));
  } catch (const std::bad_alloc&) {
    failed = "cannot allocate the stack's activations, gradients and optimizer state (std::bad_alloc)";
  }
  agree(failed.empty(), failed);
}

template <class T>
block_stack<T>::~block_stack() {
  try {
    synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "overlap::layers::block_stack: a weight gather failed: %s\n", e.what());
  }
}

template <class T>
void block_stack<T>::agree(bool ok, const std::string& what) {
  using overlap::detail::failure;
  overlap::detail::agree_on(*everyone_, ok ? failure() : failure(failure::kind::invalid_argument, what),
                            "overlap::layers::block_stack");
}

template <class T>
int64_t block_stack<T>::parameter_count() const {
  int64_t n = 0;
  blocks_.front()->params().each([&](const char*, const std::vector<T>& v, bool) { n += int64_t(v.size()); });
  return n;
}

template <class T>
void block_stack<T>::flatten_gradients(int i) {
  const acc scale = acc(1) / acc(replicas_);
  acc* out = grads_[size_t(i)].data();
  blocks_[size_t(i)]->grads().each([&](const char*, const std::vector<acc>& v, bool) {
    for (acc e : v) *out++ = e * scale;
  });
}

template <class T>
void block_stack<T>::update(int i, bool sharded) {
  const acc lr = acc(opt_.learning_rate), mu = acc(opt_.momentum);
  const std::vector<acc>& g = grads_[size_t(i)];
  std::vector<acc>& v = momentum_[size_t(i)];
  if (!sharded) {
    size_t k = 0;
    blocks_[size_t(i)]->params().each([&](const char*, std::vector<T>& w, bool) {
      for (T& e : w) {
        v[k] = mu * v[k] + g[k];
        e = detail::cast<T>(detail::cast<acc>(e) - lr * v[k]);
        ++k;
      }
    });
    return;
  }
  // This rank's part of every bucket: the weights as they are, the summed
  // gradient, this part's momentum; the gather brings the other parts.
  std::vector<acc>& w = weights_[size_t(i)];
  acc* flat = w.data();
  blocks_[size_t(i)]->params().each([&](const char*, std::vector<T>& p, bool) {
    for (const T& e : p) *flat++ = detail::cast<acc>(e);
  });
  size_t j = 0;
  reducer_->for_each_owned(int64_t(w.size()), [&](int64_t at, int64_t n) {
    for (int64_t k = at; k < at + n; ++k, ++j) {
      v[j] = mu * v[j] + g[size_t(k)];
      w[size_t(k)] -= lr * v[j];
    }
  });
}

template <class T>
void block_stack<T>::unflatten_weights(int i) {
  const acc* flat = weights_[size_t(i)].data();
  blocks_[size_t(i)]->params().each([&](const char*, std::vector<T>& p, bool) {
    for (T& e : p) e = detail::cast<T>(*flat++);
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
    reducer_->wait(
        reducer_->enqueue(sharded ? engine::ring_collective::reduce_scatter : engine::ring_collective::all_reduce,
                          scratch_.data(), int64_t(scratch_.size())));
  for (int i = 0; sharded && i < blocks(); ++i)
    reducer_->wait(reducer_->enqueue(engine::ring_collective::all_gather, scratch_.data(), int64_t(scratch_.size())));
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
  engine::trace_recorder* tracer = tp_->tracer();
  const bool summed = opt_.dp_sync != dp_sync::none && replicas_comm_.size() > 1;
  const bool sharded = summed && opt_.optimizer == optimizer_state::sharded;
  const auto form = sharded ? engine::ring_collective::reduce_scatter : engine::ring_collective::all_reduce;

  // Forward, each block's weights taken from their gather just before it runs.
  for (int i = 0; i < blocks(); ++i) {
    take_weights(i);
    const matrix_view<const T> in = i == 0 ? x : matrix_view<const T>{acts_[size_t(i - 1)].data(), n, d};
    blocks_[size_t(i)]->forward(in, {acts_[size_t(i)].data(), n, d});
    reducer_->poll();
  }

  // The loss of this rank's rows and its gradient: every tp rank holds all of
  // the share's rows without sequence parallelism, so one of them counts them.
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
  loss /= replicas_;

  // Backward, last block first; each block's gradients leave as soon as
  // they are made (overlapped) or after the whole pass (bulk).
  {
    detail::phase_span span(tracer, "backward");
    for (int i = blocks() - 1; i >= 0; --i) {
      std::vector<T>& dout = (blocks() - 1 - i) % 2 == 0 ? grad_a_ : grad_b_;
      std::vector<T>& din = (blocks() - 1 - i) % 2 == 0 ? grad_b_ : grad_a_;
      blocks_[size_t(i)]->backward({dout.data(), n, d}, {din.data(), n, d});
      flatten_gradients(i);
      if (summed && opt_.dp_sync == dp_sync::overlapped) {
        auto& g = grads_[size_t(i)];
        reduced_[size_t(i)] = reducer_->enqueue(form, g.data(), int64_t(g.size()));
      }
      reducer_->poll();
    }
  }
  if (summed && opt_.dp_sync == dp_sync::bulk) {
    detail::phase_span span(tracer, "data-parallel sum");
    for (int i = blocks() - 1; i >= 0; --i) {
      auto& g = grads_[size_t(i)];
      reducer_->wait(reducer_->enqueue(form, g.data(), int64_t(g.size())));
    }
  }

  // The optimizer, in the order the sums finish; the sharded form's weight
  // gathers are queued first block first, the order the next forward needs them.
  {
    detail::phase_span span(tracer, "optimizer");
    for (int i = blocks() - 1; i >= 0; --i) {
      auto& t = reduced_[size_t(i)];
      if (t != 0) reducer_->wait(t), t = 0;
      update(i, sharded);
    }
    if (sharded)
      for (int i = 0; i < blocks(); ++i) {
        auto& w = weights_[size_t(i)];
        gathered_[size_t(i)] = reducer_->enqueue(engine::ring_collective::all_gather, w.data(), int64_t(w.size()));
        if (opt_.dp_sync == dp_sync::bulk) take_weights(i);
      }
  }
  return loss;
}

}  // namespace overlap::layers
