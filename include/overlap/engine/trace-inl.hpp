#pragma once
/// @file
/// trace_recorder::flush: the Chrome trace's JSON (nlohmann-json), compiled
/// once in the compiled flavour (src/instantiations.cpp), included by
/// engine/trace.hpp in the header-only one.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "overlap/core/flavour.hpp"
#include "overlap/engine/trace.hpp"

namespace overlap::engine {

OVERLAP_FUNC void trace_recorder::flush() {
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
  ev.push_back({{"name", "thread_name"},
                {"ph", "M"},
                {"pid", rank_},
                {"tid", int(track::data_parallel)},
                {"args", {{"name", "data-parallel collectives"}}}});
  for (const event& e : events_) {
    nlohmann::json j{{"name", e.name}, {"cat", e.category}, {"ph", std::string(1, e.phase)},
                     {"ts", e.ts},     {"pid", rank_},      {"tid", e.tid}};
    if (e.phase == 'X') j["dur"] = e.dur;
    if (e.id >= 0) j["id"] = e.id;
    // Complete spans always carry args (empty or not), as before; an
    // asynchronous span's begin carries its own, its end none.
    if (e.phase == 'X' || !e.args.empty()) {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [key, value] : e.args) args[key] = value;
      j["args"] = std::move(args);
    }
    ev.push_back(std::move(j));
  }
  std::ofstream out(path);
  out << doc.dump();
  if (!out) std::fprintf(stderr, "overlap: OVERLAP_TRACE: cannot write %s\n", path.c_str());
}

}  // namespace overlap::engine
