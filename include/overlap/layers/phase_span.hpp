#pragma once
/// @file
/// A phase of a layer on the trace's layer track (engine/trace.hpp), timed
/// by scope.

#include <exception>

#include "overlap/engine/trace.hpp"

namespace overlap::layers::detail {

/// A phase of the layer on the trace's layer track (nothing when off).
class phase_span {
 public:
  phase_span(engine::trace_recorder* r, const char* name) : r_(r), name_(name), t0_(r ? r->now() : 0) {}
  phase_span(const phase_span&) = delete;
  phase_span& operator=(const phase_span&) = delete;
  ~phase_span() {
    if (r_ == nullptr) return;
    try {
      r_->span(name_, "layer", engine::trace_recorder::track::layer, t0_, r_->now());
    } catch (const std::exception&) {  // a timeline is not worth a crash
    }
  }

 private:
  engine::trace_recorder* r_;
  const char* name_;
  double t0_;
};

}  // namespace overlap::layers::detail
