#pragma once
/// @file
/// overlap._core.GradientReducer: the data-parallel rings of
/// layers::dp_reducer over a context's ranks, for Python's
/// DistributedDataParallel (overlap/torch/data_parallel.py). The buffers are
/// the caller's (NumPy views of torch tensors): the reducer holds a reference
/// to each until a wait() covers it, so that none is freed while a ring still
/// reads or writes it.

#include <mpi.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "overlap/layers/data_parallel.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/runtime/context.hpp"

namespace overlap::python {

namespace py = pybind11;

/// Ring all-reduces over the ranks of a context, in buckets, queued and run
/// one after the other while the caller computes (on a thread of the
/// reducer's own where MPI provides MPI_THREAD_MULTIPLE). Collective in
/// effect: every rank queues the same sizes in the same order; nothing
/// checks that per call (DistributedDataParallel agrees on its buckets once,
/// when it is built).
class gradient_reducer {
 public:
  /// Collective over ctx's ranks (duplicates its communicator). dtype:
  /// "float32" or "float64"; bucket: elements per ring (>= 1). The watchdog's
  /// bound and the thread's interval are ctx's timeout_s and
  /// progress_interval; its progress policy "poll" means no thread.
  gradient_reducer(const overlap::context& ctx, const std::string& dtype, int64_t bucket, bool thread) {
    if (dtype != "float32" && dtype != "float64")
      throw py::type_error("GradientReducer: dtype must be float32 or float64, not " + dtype);
    if (bucket < 1) throw std::invalid_argument("GradientReducer: bucket must be >= 1");
    int provided = MPI_THREAD_SINGLE;
    OVERLAP_MPI(MPI_Query_thread, &provided);
    thread = thread && provided >= MPI_THREAD_MULTIPLE && ctx.config().progress != progress_policy::poll;
    py::gil_scoped_release unlocked;  // collective
    if (dtype == "float32") {
      reducer_ = make<float>(ctx, bucket, thread);
    } else {
      reducer_ = make<double>(ctx, bucket, thread);
    }
  }
  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;
  /// Collectives still queued (after a failure, or a caller that never
  /// waited) may still be written by MPI: their buffers are leaked rather
  /// than freed under it.
  ~gradient_reducer() {
    std::visit([](auto& r) { r.reset(); }, reducer_);
    for (auto& held : held_) (void)held.second.release();
  }

  /// Queues the sum of buf (a writable, contiguous, one-dimensional buffer
  /// of the reducer's dtype) over the ranks, in place; returns its ticket.
  int64_t all_reduce(const py::buffer& buf) {
    const py::buffer_info info = buf.request(true);
    const int64_t t = std::visit(
        [&](auto& r) -> int64_t {
          using A = typename std::decay_t<decltype(*r)>::value_type;
          if (info.format != py::format_descriptor<A>::format() || info.itemsize != sizeof(A))
            throw py::type_error("GradientReducer.all_reduce: the buffer's type is not the reducer's");
          if (info.ndim != 1 || (info.size > 1 && info.strides[0] != info.itemsize))
            throw std::invalid_argument("GradientReducer.all_reduce: the buffer must be contiguous and 1-D");
          py::gil_scoped_release unlocked;  // the queue's lock may wait for the thread
          return r->enqueue(engine::ring_collective::all_reduce, static_cast<A*>(info.ptr), info.size);
        },
        reducer_);
    held_.emplace_back(t, buf);
    return t;
  }
  /// Blocks until the collectives up to ticket t have finished (raises
  /// their failure: overlap.Error, after which the reducer is unusable).
  void wait(int64_t t) {
    {
      py::gil_scoped_release unlocked;
      std::visit([t](auto& r) { r->wait(t); }, reducer_);
    }
    while (!held_.empty() && held_.front().first <= t) held_.pop_front();
  }
  /// Advances the rings without blocking (nothing to do with a thread).
  void poll() {
    py::gil_scoped_release unlocked;
    std::visit([](auto& r) { r->poll(); }, reducer_);
  }
  [[nodiscard]] int size() const {
    return std::visit([](const auto& r) { return r->size(); }, reducer_);
  }
  [[nodiscard]] int rank() const {
    return std::visit([](const auto& r) { return r->rank(); }, reducer_);
  }
  /// True when a thread of the reducer's own advances the rings.
  [[nodiscard]] bool threaded() const {
    return std::visit([](const auto& r) { return r->threaded(); }, reducer_);
  }

 private:
  template <class A>
  static std::unique_ptr<layers::dp_reducer<A>> make(const overlap::context& ctx, int64_t bucket, bool thread) {
    typename layers::dp_reducer<A>::options o;
    o.bucket = bucket;
    o.timeout_s = ctx.config().timeout_s;
    o.interval = ctx.config().progress_interval;
    o.thread = thread;
    return std::make_unique<layers::dp_reducer<A>>(ctx.comm(), o);
  }

  std::variant<std::unique_ptr<layers::dp_reducer<float>>, std::unique_ptr<layers::dp_reducer<double>>> reducer_;
  std::deque<std::pair<int64_t, py::object>> held_;  ///< (ticket, buffer) until a wait covers it
};

/// Defines GradientReducer on the module; Context is the module's context
/// type (its get() is the overlap::context).
template <class Context>
void def_gradient_reducer(py::module_& m) {
  py::class_<gradient_reducer>(m, "GradientReducer",
                               "GradientReducer(ctx, dtype, bucket, thread=True): ring all-reduces over ctx's "
                               "ranks in buckets of `bucket` elements, queued and run in order while the caller "
                               "computes. Collective; every rank must queue the same sizes in the same order.")
      .def(py::init([](Context& c, const std::string& dtype, int64_t bucket, bool thread) {
             return std::make_unique<gradient_reducer>(c.get(), dtype, bucket, thread);
           }),
           py::arg("ctx"), py::arg("dtype"), py::arg("bucket"), py::arg("thread") = true, py::keep_alive<1, 2>())
      .def("all_reduce", &gradient_reducer::all_reduce, py::arg("buf"),
           "Queues buf's sum over the ranks, in place; returns the ticket wait() takes.")
      .def("wait", &gradient_reducer::wait, py::arg("ticket"), "Blocks until the collectives up to ticket are done.")
      .def("poll", &gradient_reducer::poll, "Advances the rings without blocking (a no-op with a thread).")
      .def_property_readonly("size", &gradient_reducer::size)
      .def_property_readonly("rank", &gradient_reducer::rank)
      .def_property_readonly("threaded", &gradient_reducer::threaded);
}

}  // namespace overlap::python
