#pragma once
/// @file
/// OVERLAP_TRACE=DIR: a timeline of every rank in the Chrome trace format
/// (Perfetto and chrome://tracing open it): one file per rank,
/// DIR/rank\<world rank\>.json, with one process track per rank so the ranks
/// line up. Events: every op (its ring, collective or local step), every
/// ring step's GEMM and its wait for transfers, every transfer from its post
/// to the moment the engine saw it complete (peer, bytes, lane). Off by
/// default; off, nothing is recorded (callers hold a null recorder: no
/// allocation, no clock read).

#include <mpi.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "overlap/core/flavour.hpp"
#include "overlap/mpi/simulator.hpp"

namespace overlap::engine {

/// An event's arguments: named integers (a step count, a peer, bytes).
using trace_args = std::vector<std::pair<const char*, long long>>;

/// The process's recorder (every context of the process writes into it).
/// Events are kept as plain records and written as JSON by flush(), which
/// is compiled once in the compiled flavour (engine/trace-inl.hpp), so a
/// unit that includes this header parses no JSON library.
class trace_recorder {
 public:
  /// Thread of an event: ops and ring steps on the caller's (or the
  /// worker's) thread, transfers as asynchronous spans, the phases of a
  /// layer (layers/transformer.hpp) on the caller's thread, and the
  /// data-parallel collectives of a training step (layers/block_stack.hpp),
  /// which run beside them.
  enum class track { ops = 0, steps = 1, layer = 2, data_parallel = 3 };

  /// The recorder for dir, made on first use (the first directory given
  /// wins); its clock starts now: the caller calls it right after a
  /// collective, so the ranks' clocks start together.
  static trace_recorder* open(const std::string& dir, int world_rank) {
    static std::unique_ptr<trace_recorder> one;  // lives until the process ends
    static std::mutex guard;
    std::lock_guard<std::mutex> lock(guard);
    if (!one) one.reset(new trace_recorder(dir, world_rank));
    return one.get();
  }

  /// Microseconds since the recorder started.
  [[nodiscard]] double now() const { return (mpi::wtime() - t0_) * 1e6; }

  /// A span [begin, end) (microseconds) named `name` on a track.
  /// `category` must outlive the recorder (a string literal).
  void span(std::string name, const char* category, track t, double begin, double end, trace_args args = {}) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back({std::move(name), category, 'X', begin, end - begin, int(t), -1, std::move(args)});
  }
  /// A transfer from its post to its observed completion.
  struct transfer_span {
    bool send = false;    ///< a send (else a receive)
    int peer_world = -1;  ///< the peer's rank in MPI_COMM_WORLD
    long long bytes = 0;  ///< the bytes moved
    int lane = 0;         ///< the ring lane it travelled on
    ///@{
    /// Microseconds, as now(): when it was posted and when its completion was seen.
    double posted = 0, completed = 0;
    ///@}
  };
  /// A transfer, as an asynchronous span (its own row in the viewer,
  /// transfers may overlap).
  void transfer(const transfer_span& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    const long id = next_id_++;
    std::string name = std::string(s.send ? "send to " : "receive from ") + "rank " + std::to_string(s.peer_world);
    events_.push_back({name,
                       "transfer",
                       'b',
                       s.posted,
                       0,
                       int(track::steps),
                       id,
                       {{"peer", s.peer_world}, {"bytes", s.bytes}, {"lane", s.lane}}});
    events_.push_back({std::move(name), "transfer", 'e', s.completed, 0, int(track::steps), id, {}});
  }

  /// Writes DIR/rank\<R\>.json with every event so far (the whole file, so it
  /// is complete after every flush). A failure is reported, never thrown.
  void flush();

 private:
  /// One Chrome trace event: a complete span ('X', with dur) or the begin
  /// ('b') or end ('e') of an asynchronous one (with id).
  struct event {
    std::string name;
    const char* category;
    char phase;
    double ts, dur;
    int tid;
    long id;
    trace_args args;
  };
  trace_recorder(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank), t0_(mpi::wtime()) {}

  std::string dir_;
  int rank_;
  double t0_;
  std::mutex mutex_;
  std::vector<event> events_;
  long next_id_ = 0;
};

}  // namespace overlap::engine

#ifndef OVERLAP_COMPILED
#include "overlap/engine/trace-inl.hpp"
#endif
