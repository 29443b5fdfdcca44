#pragma once
/// @file
/// The plan cache a context owns: plans by key, least recently used evicted
/// beyond a bound, and a count of the plans built again after an eviction
/// (a program whose calls use more shapes than the cache keeps pays an
/// agreement and a plan build on every such call).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace overlap::detail {

/// A cached plan: everything that depends only on the shapes of a call.
struct plan_base {
  virtual ~plan_base() = default;
  /// Hash of the global problem (every rank's sizes and the options) the plan
  /// was built for; ranks compare it to agree that their cached plans match.
  uint64_t fingerprint = 0;
  /// The op, element type, strategy and global shape, for error reports.
  std::string summary;
  /// The schedule it runs in words (to_string(schedule): with every
  /// candidate's predicted time when the cost model chose); context::plan_reports.
  std::string schedule_words;
  bool automatic = false;  ///< the call asked for strategy::automatic
  /// True while strategy::automatic times this shape's candidates
  /// (ops/measured_plans.hpp): its calls may run any of them.
  [[nodiscard]] virtual bool measuring() const noexcept { return false; }
};
using plan_key = std::vector<int64_t>;

/// Plans by key, most recently used first, at most `bound` of them. Local:
/// each rank keeps its own, and the ranks' agreement (ops/call_agreement.hpp)
/// notices when one rank's plan is missing.
class plan_cache {
 public:
  /// Evictions remembered to tell a rebuild from a first build: a key
  /// requested again within this many evictions counts as rebuilt. Keys, not
  /// plans: about 200 bytes each.
  static constexpr size_t remembered_evictions = 256;

  explicit plan_cache(size_t bound) : bound_(bound < 1 ? 1 : bound) {}

  /// The plan for key (now the most recently used), or null.
  [[nodiscard]] plan_base* find(const plan_key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    plans_.splice(plans_.begin(), plans_, it->second);
    return it->second->second.get();
  }

  /// Caches a newly built plan under key (replacing one already there) and
  /// evicts the least recently used beyond the bound; returns the plan.
  plan_base* store(const plan_key& key, std::unique_ptr<plan_base> plan) {
    if (auto it = index_.find(key); it != index_.end()) {
      plans_.erase(it->second);
      index_.erase(it);
    }
    // An eviction counts for one rebuild at most: a plan replaced later
    // (a peer lacked its own) was not evicted again.
    if (auto it = last_eviction_.find(key); it != last_eviction_.end()) {
      last_eviction_.erase(it);
      ++rebuilt_;
    }
    plans_.emplace_front(key, std::move(plan));
    index_.emplace(key, plans_.begin());
    while (plans_.size() > bound_) evict_last();
    ++built_;
    return plans_.front().second.get();
  }

  /// Drops every plan. What was evicted before stays remembered.
  void clear() noexcept {
    index_.clear();
    plans_.clear();
  }

  /// Hands over every plan (a fatal error gives them up without freeing
  /// them: MPI may still write into their buffers) and empties the cache.
  [[nodiscard]] std::vector<std::unique_ptr<plan_base>> release() {
    std::vector<std::unique_ptr<plan_base>> out;
    for (auto& entry : plans_) out.push_back(std::move(entry.second));
    clear();
    return out;
  }

  /// The plans, most recently used first.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& entry : plans_) f(*entry.second);
  }

  [[nodiscard]] size_t size() const noexcept { return plans_.size(); }
  [[nodiscard]] size_t bound() const noexcept { return bound_; }
  /// Plans stored so far.
  [[nodiscard]] size_t built() const noexcept { return built_; }
  /// Plans stored for a key that the bound evicted earlier.
  [[nodiscard]] size_t rebuilt() const noexcept { return rebuilt_; }

 private:
  void evict_last() {
    const plan_key& key = plans_.back().first;
    last_eviction_[key] = ++evictions_;
    evicted_.emplace_back(key, evictions_);
    if (evicted_.size() > remembered_evictions) {
      // Forgotten unless the key was evicted again since (or rebuilt: gone).
      auto it = last_eviction_.find(evicted_.front().first);
      if (it != last_eviction_.end() && it->second == evicted_.front().second) last_eviction_.erase(it);
      evicted_.pop_front();
    }
    index_.erase(key);
    plans_.pop_back();
  }

  size_t bound_;
  std::list<std::pair<plan_key, std::unique_ptr<plan_base>>> plans_;
  std::map<plan_key, decltype(plans_)::iterator> index_;
  /// The last evictions, oldest first: the key and the eviction's number.
  std::deque<std::pair<plan_key, uint64_t>> evicted_;
  /// The keys evicted within the last remembered_evictions evictions and
  /// not stored since: the number of their latest eviction.
  std::map<plan_key, uint64_t> last_eviction_;
  uint64_t evictions_ = 0;
  size_t built_ = 0, rebuilt_ = 0;
};

}  // namespace overlap::detail
