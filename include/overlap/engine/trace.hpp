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

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace overlap::engine {

/// The process's recorder (every context of the process writes into it).
class trace_recorder {
 public:
  /// Thread of an event: ops and ring steps on the caller's (or the
  /// worker's) thread, transfers as asynchronous spans, the phases of a
  /// layer (layers/transformer.hpp) on the caller's thread.
  enum class track { ops = 0, steps = 1, layer = 2 };

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
  [[nodiscard]] double now() const { return (MPI_Wtime() - t0_) * 1e6; }

  /// A span [begin, end) (microseconds) named `name` on a track.
  void span(std::string name, const char* category, track t, double begin, double end,
            nlohmann::json args = nlohmann::json::object()) {
    nlohmann::json e{{"name", std::move(name)}, {"cat", category}, {"ph", "X"},     {"ts", begin},
                     {"dur", end - begin},      {"pid", rank_},    {"tid", int(t)}, {"args", std::move(args)}};
    add(std::move(e));
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
    const std::string name =
        std::string(s.send ? "send to " : "receive from ") + "rank " + std::to_string(s.peer_world);
    const nlohmann::json args{{"peer", s.peer_world}, {"bytes", s.bytes}, {"lane", s.lane}};
    events_.push_back({{"name", name},
                       {"cat", "transfer"},
                       {"ph", "b"},
                       {"id", id},
                       {"ts", s.posted},
                       {"pid", rank_},
                       {"tid", int(track::steps)},
                       {"args", args}});
    events_.push_back({{"name", name},
                       {"cat", "transfer"},
                       {"ph", "e"},
                       {"id", id},
                       {"ts", s.completed},
                       {"pid", rank_},
                       {"tid", int(track::steps)}});
  }

  /// Writes DIR/rank\<R\>.json with every event so far (the whole file, so it
  /// is complete after every flush). A failure is reported, never thrown.
  void flush() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    const std::string path = dir_ + "/rank" + std::to_string(rank_) + ".json";
    nlohmann::json doc{{"traceEvents", nlohmann::json::array()}, {"displayTimeUnit", "ms"}};
    nlohmann::json& ev = doc["traceEvents"];
    ev.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
    ev.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"sort_index", rank_}}}});
    ev.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", int(track::ops)}, {"args", {{"name", "ops"}}}});
    ev.push_back({{"name", "thread_name"},
                  {"ph", "M"},
                  {"pid", rank_},
                  {"tid", int(track::steps)},
                  {"args", {{"name", "ring steps and transfers"}}}});
    ev.push_back({{"name", "thread_name"},
                  {"ph", "M"},
                  {"pid", rank_},
                  {"tid", int(track::layer)},
                  {"args", {{"name", "layer phases"}}}});
    for (const nlohmann::json& e : events_) ev.push_back(e);
    std::ofstream out(path);
    out << doc.dump();
    if (!out) std::fprintf(stderr, "overlap: OVERLAP_TRACE: cannot write %s\n", path.c_str());
  }

 private:
  trace_recorder(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank), t0_(MPI_Wtime()) {}
  void add(nlohmann::json e) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(e));
  }

  std::string dir_;
  int rank_;
  double t0_;
  std::mutex mutex_;
  std::vector<nlohmann::json> events_;
  long next_id_ = 0;
};

}  // namespace overlap::engine
