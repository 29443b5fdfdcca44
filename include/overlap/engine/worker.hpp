#pragma once
/// @file
/// The worker of a context: one thread that runs the part of an op after the
/// ranks agreed to run it (the ring, a collective), while the caller computes
/// something else (start_all_gather_matmul, start_matmul_reduce_scatter).

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace overlap::engine {

/// One job at a time: post() hands it over, wait() blocks until it ended and
/// rethrows what it threw. The thread starts with the worker and ends with it.
/// runs::on_caller_thread has no thread: post() runs the job before it
/// returns and keeps what it threw for wait() (for MPI libraries where a
/// second thread must not call MPI, such as SimGrid SMPI).
class worker {
 public:
  /// Where jobs run: on the worker's own thread, or on the thread that posts them.
  enum class runs { on_own_thread, on_caller_thread };
  /// Starts the thread (runs::on_own_thread); it idles until post().
  explicit worker(runs where = runs::on_own_thread) {
    if (where == runs::on_own_thread) thread_ = std::thread([this] { loop(); });
  }
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
  ~worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();  // after the job in hand, if any
  }

  /// Starts job on the worker's thread; the worker must be idle.
  void post(std::function<void()> job) {
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = std::move(job);
    running_ = true;
    claimed_ = false;
    failure_ = nullptr;
    if (!thread_.joinable()) {
      run_job(lock);  // runs::on_caller_thread
      return;
    }
    lock.unlock();
    cv_.notify_all();
  }
  /// True from post() until wait() returned (the job may have ended).
  [[nodiscard]] bool busy() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !claimed_;
  }
  /// True when no job is running (the last one ended, or none was posted);
  /// never blocks on the job.
  [[nodiscard]] bool ended() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !running_;
  }
  /// Blocks until the job ended; rethrows what it threw. Idle: returns.
  void wait() {
    std::exception_ptr failure;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return !running_; });
      claimed_ = true;
      failure = std::exchange(failure_, nullptr);
    }
    if (failure) std::rethrow_exception(failure);
  }

 private:
  /// Runs the job in hand on the calling thread (the lock held on entry and
  /// on return, released while the job runs) and records how it ended.
  void run_job(std::unique_lock<std::mutex>& lock) {
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    std::exception_ptr failure;
    try {
      job();
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    failure_ = failure;
    running_ = false;
    cv_.notify_all();
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || static_cast<bool>(job_); });
      if (!job_) return;  // stopping, nothing in hand
      run_job(lock);
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::exception_ptr failure_;
  bool running_ = false;  ///< a job is in hand
  bool claimed_ = true;   ///< wait() returned since the last post()
  bool stop_ = false;
  std::thread thread_;  // last: starts (in the constructor's body) after the members it uses exist
};

}  // namespace overlap::engine
