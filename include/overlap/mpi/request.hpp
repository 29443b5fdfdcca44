#pragma once
/// @file
/// Move-only non-blocking requests that cannot be dropped while pending.

#include <mpi.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "overlap/core/error.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/mpi/topology.hpp"
#include "overlap/mpi/wait.hpp"

namespace overlap::mpi {

/// A group of outstanding requests, each with a deadline: the step before
/// which it must have completed (the ring engine completes a step's receives
/// just before the step computes, and lets sends run on while the buffers they
/// read stay untouched). Destroying a group with pending requests cancels and
/// completes them, so a request never outlives the buffers of the scope that
/// posted it.
class request_group {
 public:
  /// Work this rank may do, a piece at a time, while it waits for its
  /// requests (engine::side_work): on a single thread, the caller's own
  /// products run in the gaps an op's transfers leave, where no second
  /// thread may call MPI (SimGrid SMPI) or none is wanted.
  class idle_work {
   public:
    virtual ~idle_work() = default;
    /// Runs one piece; false when none was left.
    virtual bool run_one() = 0;
  };
  /// What a request moves, for the watchdog's report.
  struct about {
    int lane = 0;                           ///< the ring lane
    int peer = MPI_PROC_NULL;               ///< the rank it goes to or comes from
    MPI_Datatype type = MPI_DATATYPE_NULL;  ///< `count` of it
    bool send = false;                      ///< a send (else a receive)
    bool collective = false;                ///< a non-blocking collective (MPI cannot free one that is pending)
    double posted = 0;                      ///< when it was posted (tracing only)
    int count = 1;                          ///< last, so that the positional initialisers before it keep their meaning
    /// A paced send (send_paced): the next one of its lane is posted only
    /// once this one has completed.
    bool paced = false;
    /// A paced send: MPI_Wtime when it was posted (its rate is learnt from it).
    double started = 0;
    /// The bytes it moves.
    [[nodiscard]] long long bytes() const {
      int size = 0;
      if (type != MPI_DATATYPE_NULL) MPI_Type_size(type, &size);
      return static_cast<long long>(size) * count;
    }
  };
  /// Tracing (OVERLAP_TRACE): the clock of post times, and what to do with a
  /// request the group saw complete (after the wait that completed it).
  class observer {
   public:
    virtual ~observer() = default;
    [[nodiscard]] virtual double now() const = 0;   ///< the clock, in the observer's unit
    virtual void completed(const about& what) = 0;  ///< a request was seen complete
  };

  request_group() = default;
  request_group(const request_group&) = delete;
  request_group& operator=(const request_group&) = delete;
  /// Takes other's requests; other is empty after.
  request_group(request_group&& other) noexcept
      : reqs_(std::move(other.reqs_)),
        due_(std::move(other.due_)),
        about_(std::move(other.about_)),
        held_(std::move(other.held_)),
        timeout_s_(other.timeout_s_) {
    other.clear();
  }
  /// Cancels and completes this group's requests, then takes other's.
  request_group& operator=(request_group&& other) noexcept {
    if (this != &other) {
      abandon();
      reqs_ = std::move(other.reqs_);
      due_ = std::move(other.due_);
      about_ = std::move(other.about_);
      held_ = std::move(other.held_);
      timeout_s_ = other.timeout_s_;
      other.clear();
    }
    return *this;
  }
  ~request_group() { abandon(); }

  /// A slot for MPI_Isend / MPI_Irecv to write the new request into; it must
  /// complete before step `deadline` (see wait_due). Storage grows to the
  /// largest window once and is reused, so the hot loop does not allocate.
  [[nodiscard]] MPI_Request* add(int deadline = 0) { return add(deadline, about{}); }
  /// As add(deadline), recording what the request moves for the watchdog and traces.
  [[nodiscard]] MPI_Request* add(int deadline, const about& what) {
    due_.push_back(deadline);
    about_.push_back(what);
    if (observer_ != nullptr) about_.back().posted = observer_->now();
    return &reqs_.emplace_back(MPI_REQUEST_NULL);
  }
  /// A send paced on its lane: posted now when no earlier paced send of
  /// `what.lane` is in flight, else held back and posted as soon as the one
  /// before it completes (seen by test_all, wait_due and wait_all). One piece
  /// in flight per lane, so that the first piece of a step is not slowed by
  /// the next ones sharing its link (docs/design.md, "Paced sends"). It must
  /// complete before step `deadline`, as add()'s requests.
  void send_paced(void* buf, int count, MPI_Datatype type, int to, int tag, MPI_Comm comm, int deadline, about what) {
    what.send = true, what.paced = true;
    held_.push_back({buf, count, type, to, tag, comm, deadline, what});
    release_held();
  }
  /// Sends held back (send_paced) and not yet posted.
  [[nodiscard]] int held() const noexcept { return static_cast<int>(held_.size()); }

  /// Before `horizon_s` seconds in which this rank will not look at its
  /// requests (a GEMM step, under progress_policy::none): posts the held send
  /// of every lane whose in-flight paced send is expected to complete within
  /// them, at the fastest rate that lane's sends to that peer were seen to
  /// move (learnt where a wait saw one complete). The two then share the link for
  /// the rest of the first, which finishes that much later, rather than the
  /// link idling until this rank looks again (docs/design.md, "Paced
  /// sends"). Nothing is posted where no rate is known yet.
  void release_ahead(double horizon_s) {
    if (held_.empty() || horizon_s <= 0) return;
    release_held();
    const double now = wtime();
    int posted = 0;  // lanes released here (bit per lane): one each
    for (size_t h = 0; h < held_.size();) {
      const int lane = held_[h].what.lane, bit = 1 << lane;
      const double done = (posted & bit) != 0 ? now + horizon_s + 1 : expected_done(lane);
      if (done > now + horizon_s || lane_holds_before(h)) {
        ++h;
        continue;
      }
      post_held(h);
      posted |= bit;
    }
  }
  /// Bytes per second lane `lane`'s paced sends to `peer` were seen to move
  /// at, the fastest (0: none seen yet).
  [[nodiscard]] double paced_rate(int lane, int peer) const noexcept {
    for (const rate& r : rates_)
      if (r.lane == lane && r.peer == peer) return r.bytes_per_s;
    return 0;
  }

  /// Watchdog: waits give up after this many seconds (0: unbounded) with
  /// mpi::wait_timeout naming the requests still pending.
  void set_timeout(double seconds) noexcept { timeout_s_ = seconds; }
  /// The world rank of every peer, for messages (mpi::world_ranks: empty when
  /// the numbers are the world's).
  void set_world_ranks(std::vector<int> world) { world_ = std::move(world); }
  /// While w is set (null: none), a wait whose requests have not all
  /// completed runs w's pieces first, one at a time, testing the requests
  /// between pieces, and blocks only once they are complete or w has none
  /// left. The owner keeps w alive until it sets null again. Returns the
  /// work set before.
  idle_work* fill_waits(idle_work* w) noexcept { return std::exchange(idle_, w); }
  /// Tracing: o sees every point-to-point request complete (null: off).
  void observe(observer* o) noexcept { observer_ = o; }
  [[nodiscard]] bool empty() const noexcept { return reqs_.empty(); }                 ///< no request held
  [[nodiscard]] int size() const noexcept { return static_cast<int>(reqs_.size()); }  ///< requests held

  /// Non-blocking progress (and held sends posted whose lane is free: under
  /// SMPI, whose lane's send an earlier wait or test completed, see
  /// lane_busy); true when every request has completed and none is held.
  bool test_all() {
    release_held();
    if (reqs_.empty()) return held_.empty();
    int done = 0;
    OVERLAP_MPI(MPI_Testall, size(), reqs_.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0 && held_.empty();
  }
  /// Cancels and completes every pending request and empties the group (for
  /// error paths: a request must not outlive the step that posted it).
  void cancel_all() noexcept { abandon(); }
  /// Forgets every request without cancelling or waiting (for a fatal error:
  /// a send to a peer that is gone may never complete, and MPI_Cancel cannot
  /// take back a send that was matched). Point-to-point requests are freed,
  /// so MPI releases them whenever they complete; pending non-blocking
  /// collectives cannot be freed (MPI_ERR_REQUEST) and are only forgotten.
  void leak() noexcept {
    for (size_t i = 0; i < reqs_.size(); ++i)
      if (reqs_[i] != MPI_REQUEST_NULL && !about_[i].collective) MPI_Request_free(&reqs_[i]);
    clear();
  }

  /// Blocks until every request has completed, then empties the group.
  void wait_all() {
    post_held_due(std::numeric_limits<int>::max());
    if (reqs_.empty()) return;
    fill_until_done(reqs_.size());
    if (timeout_s_ > 0) {
      bounded_wait(reqs_.size(), "the end of the ring");
    } else {
      const int rc = MPI_Waitall(size(), reqs_.data(), MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) overlap::detail::throw_mpi_error(rc, "MPI_Waitall");
    }
    report(reqs_.size());
    clear();
  }

  /// Blocks until every request whose deadline is <= step has completed and
  /// drops those from the group; later ones stay outstanding.
  void wait_due(int step) {
    post_held_due(step);
    // The due requests first, so one bounded wait covers exactly them.
    size_t n_due = 0;
    for (size_t i = 0; i < reqs_.size(); ++i)
      if (due_[i] <= step) {
        std::swap(reqs_[i], reqs_[n_due]);
        std::swap(due_[i], due_[n_due]);
        std::swap(about_[i], about_[n_due]);
        ++n_due;
      }
    if (n_due == 0) return;
    fill_until_done(n_due);
    if (timeout_s_ > 0) {
      bounded_wait(n_due, "step " + std::to_string(step + 1));
    } else {
      const int rc = MPI_Waitall(static_cast<int>(n_due), reqs_.data(), MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) overlap::detail::throw_mpi_error(rc, "MPI_Waitall");
    }
    report(n_due);
    reqs_.erase(reqs_.begin(), reqs_.begin() + static_cast<std::ptrdiff_t>(n_due));
    due_.erase(due_.begin(), due_.begin() + static_cast<std::ptrdiff_t>(n_due));
    about_.erase(about_.begin(), about_.begin() + static_cast<std::ptrdiff_t>(n_due));
  }

 private:
  /// Runs idle work while the first n requests have not all completed (the
  /// wait after it then returns at once, or blocks once no work is left).
  void fill_until_done(size_t n) {
    if (idle_ == nullptr) return;
    for (;;) {
      int done = 0;
      OVERLAP_MPI(MPI_Testall, static_cast<int>(n), reqs_.data(), &done, MPI_STATUSES_IGNORE);
      if (done != 0 || !idle_->run_one()) return;
    }
  }
  /// Tracing: the first n requests (now complete) to the observer.
  void report(size_t n) {
    if (observer_ == nullptr) return;
    for (size_t i = 0; i < n; ++i)
      if (!about_[i].collective) observer_->completed(about_[i]);
  }
  void clear() noexcept {
    reqs_.clear();
    due_.clear();
    about_.clear();
    held_.clear();  // never posted: nothing to cancel
  }

  /// A send held back until its lane's previous paced send completes.
  struct held_send {
    void* buf;
    int count;
    MPI_Datatype type;
    int to, tag;
    MPI_Comm comm;
    int deadline;
    about what;
  };
  /// True while a paced send of `lane` is in flight (tests it). Under SMPI
  /// it does not test: a paced send counts as in flight until a wait
  /// completes it. post_held_due waits for the in-flight send of every lane
  /// that holds one beside the step's requests, and release_ahead posts from
  /// the lane's learnt rate, so a held send still goes out when its lane
  /// frees while the rank waits, and before a GEMM step; only a lane that
  /// frees while the rank computes, with nothing due, waits for the next
  /// wait or GEMM step. SimGrid 3.32 never drops a request that MPI_Test completed from its
  /// rank's list of activities, and scans that list at every computation and
  /// wait that ends: these tests made that scan 22% of a 64-rank
  /// bidirectional run and 29% of a 128-rank automatic one (docs/smpi.md).
  bool lane_busy(int lane) {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (!about_[i].paced || about_[i].lane != lane || reqs_[i] == MPI_REQUEST_NULL) continue;
      if (simulated) return true;
      int done = 0;
      OVERLAP_MPI(MPI_Test, &reqs_[i], &done, MPI_STATUS_IGNORE);
      if (done == 0) return true;
      if (waiting_) learn(i);  // seen inside a wait: it completed about now
    }
    return false;
  }
  /// Posts the first held send of every lane that has none in flight.
  void release_held() {
    int blocked = 0;  // lanes seen held or busy (bit per lane)
    for (size_t h = 0; h < held_.size();) {
      const int bit = 1 << held_[h].what.lane;
      if ((blocked & bit) != 0 || lane_busy(held_[h].what.lane)) {
        blocked |= bit;
        ++h;
        continue;
      }
      post_held(h);
      blocked |= bit;  // now in flight
    }
  }
  /// Posts held send h (and forgets it as held).
  void post_held(size_t h) {
    held_send s = held_[h];
    held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(h));
    s.what.started = wtime();
    OVERLAP_MPI(MPI_Isend, s.buf, s.count, s.type, s.to, s.tag, s.comm, add(s.deadline, s.what));
  }
  /// Whether a held send of held send h's lane comes before it (sends of a lane go in order).
  [[nodiscard]] bool lane_holds_before(size_t h) const noexcept {
    for (size_t i = 0; i < h; ++i)
      if (held_[i].what.lane == held_[h].what.lane) return true;
    return false;
  }
  /// When the last in-flight paced send of `lane` is expected to complete
  /// (MPI_Wtime; infinity where its rate is not known).
  [[nodiscard]] double expected_done(int lane) const {
    double done = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (!about_[i].paced || about_[i].lane != lane || reqs_[i] == MPI_REQUEST_NULL) continue;
      const double r = paced_rate(lane, about_[i].peer);
      if (r <= 0) return std::numeric_limits<double>::infinity();
      done = std::max(done, about_[i].started + double(about_[i].bytes()) / r);
    }
    return done;
  }
  /// A wait saw paced send i complete: its lane's rate to its peer. A
  /// completion may be seen late (it happened before the wait began), which
  /// only understates the rate, never overstates it: the lane keeps the
  /// fastest it saw.
  void learn(size_t i) {
    const about& a = about_[i];
    const double took = wtime() - a.started;
    if (!a.paced || took <= 0) return;
    const double bytes_per_s = double(a.bytes()) / took;
    for (rate& r : rates_)
      if (r.lane == a.lane && r.peer == a.peer) {
        r.bytes_per_s = std::max(r.bytes_per_s, bytes_per_s);
        return;
      }
    rates_.push_back({a.lane, a.peer, bytes_per_s});
  }
  /// True when a send of `lane` is held back.
  [[nodiscard]] bool lane_holds(int lane) const noexcept {
    for (const held_send& h : held_)
      if (h.what.lane == lane) return true;
    return false;
  }
  /// Before waiting for step `step`: until every held send due by then is
  /// posted and every request due has completed, waits for any of those or
  /// for the in-flight send of a lane that holds one, and posts each held
  /// send as soon as its lane is free, so that no link idles while this rank
  /// waits. Held sends of later steps still waiting for their lane stay held.
  void post_held_due(int step) {
    const double start = wtime();
    waiting_ = true;
    struct waiting_scope {
      bool& w;
      ~waiting_scope() { w = false; }
    } scope{waiting_};
    while (!held_.empty()) {
      release_held();
      bool needed = false;  // a held send or a request this step needs
      for (const held_send& h : held_) needed = needed || h.deadline <= step;
      watch_.clear(), watch_at_.clear();
      for (size_t i = 0; i < reqs_.size(); ++i) {
        if (reqs_[i] == MPI_REQUEST_NULL) continue;
        const bool due = due_[i] <= step;
        needed = needed || due;
        if (due || (about_[i].paced && lane_holds(about_[i].lane))) watch_.push_back(reqs_[i]), watch_at_.push_back(i);
      }
      if (!needed || watch_.empty()) return;
      int index = MPI_UNDEFINED, flag = 0;
      if (idle_ != nullptr && timeout_s_ <= 0) {  // a piece of idle work rather than a blocking wait
        OVERLAP_MPI(MPI_Testany, static_cast<int>(watch_.size()), watch_.data(), &index, &flag, MPI_STATUS_IGNORE);
        if (flag == 0 && idle_->run_one()) continue;  // nothing completed: watch_ holds the same requests
        if (flag == 0) {
          OVERLAP_MPI(MPI_Waitany, static_cast<int>(watch_.size()), watch_.data(), &index, MPI_STATUS_IGNORE);
        }
      } else if (timeout_s_ > 0) {
        OVERLAP_MPI(MPI_Testany, static_cast<int>(watch_.size()), watch_.data(), &index, &flag, MPI_STATUS_IGNORE);
        if (flag == 0 && wtime() - start > timeout_s_)  // reports what is pending and throws
          bounded_wait(reqs_.size(), step == std::numeric_limits<int>::max() ? std::string("the end of the ring")
                                                                             : "step " + std::to_string(step + 1));
      } else {
        OVERLAP_MPI(MPI_Waitany, static_cast<int>(watch_.size()), watch_.data(), &index, MPI_STATUS_IGNORE);
      }
      if (index != MPI_UNDEFINED && (timeout_s_ <= 0 || flag != 0)) learn(watch_at_[static_cast<size_t>(index)]);
      for (size_t k = 0; k < watch_.size(); ++k) reqs_[watch_at_[k]] = watch_[k];
    }
  }

  /// Waits for the first n requests under the watchdog.
  void bounded_wait(size_t n, const std::string& before) {
    const bool done = poll_until(
        [&] {
          int flag = 0;
          const int rc = MPI_Testall(static_cast<int>(n), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
          if (rc != MPI_SUCCESS) overlap::detail::throw_mpi_error(rc, "MPI_Testall");
          return flag != 0;
        },
        timeout_s_);
    if (done) return;
    std::string what =
        "waited more than " + std::to_string(static_cast<int>(timeout_s_)) + " s before " + before + " for";
    for (size_t i = 0; i < n; ++i) {
      if (reqs_[i] == MPI_REQUEST_NULL) continue;
      if (about_[i].collective) {
        what += std::string(i ? ";" : "") + " a non-blocking collective of every rank";
        continue;
      }
      const long long bytes = about_[i].bytes();
      what += std::string(i ? ";" : "") + (about_[i].send ? " a send of " : " a receive of ") + std::to_string(bytes) +
              " bytes " + (about_[i].send ? "to " : "from ") + rank_text(about_[i].peer, world_) + " on lane " +
              std::to_string(about_[i].lane);
    }
    throw wait_timeout(what);
  }

  void abandon() noexcept {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      MPI_Request& r = reqs_[i];
      if (r == MPI_REQUEST_NULL || about_[i].collective) continue;  // a collective cannot be cancelled
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
    clear();
  }

  std::vector<MPI_Request> reqs_;
  std::vector<int> due_;  ///< deadline step of each request
  std::vector<about> about_;
  std::vector<held_send> held_;  ///< paced sends not yet posted, in order
  /// The fastest rate a lane's paced sends to a peer were seen to move at.
  struct rate {
    int lane, peer;
    double bytes_per_s;
  };
  std::vector<rate> rates_;
  bool waiting_ = false;  ///< inside post_held_due: a completion seen is seen about when it happened
  /// post_held_due's requests to wait for and their places in reqs_: kept,
  /// so that a cached call's waits do not allocate.
  std::vector<MPI_Request> watch_;
  std::vector<size_t> watch_at_;
  double timeout_s_ = 0;
  std::vector<int> world_;
  observer* observer_ = nullptr;
  idle_work* idle_ = nullptr;  ///< fill_waits: not owned
};

}  // namespace overlap::mpi
