#pragma once
/// @file
/// The calibration's file format (JSON, through nlohmann-json): part of the
/// header-only flavour, compiled once into the library otherwise
/// (flavour.hpp).

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "overlap/core/error.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/schedule/calibration.hpp"

namespace overlap {

OVERLAP_FUNC std::string calibration::to_json() const {
  nlohmann::json j;
  j["format"] = "overlap-calibration";
  j["version"] = 1;
  for (const auto& [c, l] : links) {
    nlohmann::json& o = j["links"][to_string(c)];
    o = {{"latency_us", l.latency_s * 1e6},
         {"gbit_per_s", l.bytes_per_s * 8e-9},
         {"gbit_per_s_both_directions", l.bytes_per_s_both * 8e-9},
         {"gemm_slowdown", l.gemm_slowdown}};
    if (l.collectives.ranks == 0) continue;
    o["collectives"]["ranks"] = l.collectives.ranks;
    detail::for_each_collective(l.collectives, [&](const char* name, const collective_rate& r) {
      std::vector<double> gbit;
      for (double b : r.bytes_per_s) gbit.push_back(b * 8e-9);
      o["collectives"][name] = {{"block_bytes", r.block_bytes}, {"gbit_per_s", gbit}};
    });
  }
  for (const auto& [t, g] : gemm) {
    std::vector<double> gflops;
    for (double f : g.flops_per_s) gflops.push_back(f * 1e-9);
    j["gemm"][to_string(t)] = {{"sizes", g.sizes}, {"gflops", gflops}};
  }
  for (const auto& [key, c] : choices)
    j["choices"][key] = {{"call", c.call},
                         {"strategy", to_string(c.chosen.strategy)},
                         {"algorithm", to_string(c.chosen.algorithm)},
                         {"chunks", c.chosen.chunks},
                         {"measured_ms", c.chosen.measured_s * 1e3}};
  return j.dump(1);
}

namespace detail {

/// The `collectives` of a link class (`where` names it in errors, `bad`
/// makes the exception).
template <class Bad>
collective_rates collectives_from_json(const nlohmann::json& cj, const std::string& where, Bad&& bad) {
  collective_rates r;
  r.ranks = cj.at("ranks").get<int>();
  if (r.ranks < 2) throw bad(where + " collectives need ranks >= 2");
  for_each_collective(r, [&](const char* what, collective_rate& cr) {
    const std::string which = where + " collective " + what;
    cr.block_bytes = cj.at(what).at("block_bytes").get<std::vector<double>>();
    for (double g : cj.at(what).at("gbit_per_s").get<std::vector<double>>()) cr.bytes_per_s.push_back(g / 8e-9);
    if (cr.block_bytes.empty() || cr.block_bytes.size() != cr.bytes_per_s.size())
      throw bad(which + " needs as many block_bytes as gbit_per_s values, at least one");
    if (!std::is_sorted(cr.block_bytes.begin(), cr.block_bytes.end()) || !(cr.block_bytes.front() > 0) ||
        std::adjacent_find(cr.block_bytes.begin(), cr.block_bytes.end()) != cr.block_bytes.end())
      throw bad(which + " block_bytes must be positive and ascending");
    for (double b : cr.bytes_per_s)
      if (!(b > 0 && std::isfinite(b))) throw bad(which + " rates must be positive");
  });
  return r;
}

/// The saved measured choices (`bad` makes the exception).
template <class Bad>
std::map<std::string, saved_choice> choices_from_json(const nlohmann::json& cj, Bad&& bad) {
  std::map<std::string, saved_choice> out;
  for (auto it = cj.begin(); it != cj.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& o = it.value();
    saved_choice sc;
    sc.call = o.value("call", "");
    const std::string s = o.at("strategy").get<std::string>(), a = o.at("algorithm").get<std::string>();
    if (!parse_enum(s, sc.chosen.strategy) || sc.chosen.strategy == strategy::automatic)
      throw bad(std::string("choice ").append(key).append(": unknown strategy ").append(s));
    if (!parse_enum(a, sc.chosen.algorithm) || sc.chosen.algorithm == algorithm::automatic)
      throw bad(std::string("choice ").append(key).append(": unknown algorithm ").append(a));
    sc.chosen.chunks = o.at("chunks").get<int>();
    sc.chosen.measured_s = o.at("measured_ms").get<double>() * 1e-3;
    if (sc.chosen.chunks < 0 || !(sc.chosen.measured_s >= 0 && std::isfinite(sc.chosen.measured_s)))
      throw bad("choice " + key + " needs chunks >= 0 and a finite measured_ms >= 0");
    out[key] = std::move(sc);
  }
  return out;
}

}  // namespace detail

// NOLINTNEXTLINE(bugprone-easily-swappable-parameters): see the declaration
OVERLAP_FUNC calibration calibration::from_json(const std::string& text, const std::string& origin) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("overlap: calibration " + origin + ": " + why);
  };
  calibration c;
  c.origin = origin;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("format", "") != "overlap-calibration") throw bad("not an overlap calibration (format field)");
    if (j.value("version", 0) != 1) throw bad("version " + std::to_string(j.value("version", 0)) + " is not 1");
    if (j.contains("links"))
      for (const auto& [name, l] : j.at("links").items()) {
        link_class cls = link_class::shared;
        if (!parse_enum(name, cls)) throw bad("unknown link class '" + name + "'");
        link_rates r;
        r.latency_s = l.at("latency_us").get<double>() * 1e-6;
        r.bytes_per_s = l.at("gbit_per_s").get<double>() / 8e-9;
        r.bytes_per_s_both = l.at("gbit_per_s_both_directions").get<double>() / 8e-9;
        r.gemm_slowdown = l.at("gemm_slowdown").get<double>();
        if (!(r.latency_s >= 0 && r.bytes_per_s > 0 && r.bytes_per_s_both > 0 && r.gemm_slowdown >= 1 &&
              std::isfinite(r.latency_s + r.bytes_per_s + r.bytes_per_s_both + r.gemm_slowdown)))
          throw bad("link class '" + name + "' needs latency >= 0, rates > 0 and gemm_slowdown >= 1");
        if (l.contains("collectives"))
          r.collectives = detail::collectives_from_json(l.at("collectives"), "link class '" + name + "'", bad);
        c.links[cls] = r;
      }
    if (j.contains("gemm"))
      for (const auto& [name, g] : j.at("gemm").items()) {
        dtype t = dtype::f32;
        if (!parse_enum(name, t)) throw bad("unknown element type '" + name + "'");
        gemm_rates r;
        r.sizes = g.at("sizes").get<std::vector<int64_t>>();
        for (double f : g.at("gflops").get<std::vector<double>>()) r.flops_per_s.push_back(f * 1e9);
        const size_t s = r.sizes.size();
        if (s == 0 || r.flops_per_s.size() != s * s * s)
          throw bad("gemm " + name + " needs sizes and sizes^3 gflops values");
        if (!std::is_sorted(r.sizes.begin(), r.sizes.end()) || r.sizes.front() < 1 ||
            std::adjacent_find(r.sizes.begin(), r.sizes.end()) != r.sizes.end())
          throw bad("gemm " + name + " sizes must be positive and ascending");
        for (double f : r.flops_per_s)
          if (!(f > 0 && std::isfinite(f))) throw bad("gemm " + name + " rates must be positive");
        c.gemm[t] = std::move(r);
      }
    if (j.contains("choices")) c.choices = detail::choices_from_json(j.at("choices"), bad);
  } catch (const nlohmann::json::exception& e) {
    throw bad(e.what());
  }
  return c;
}

OVERLAP_FUNC calibration calibration::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("overlap: calibration " + path + " cannot be read (OVERLAP_CALIBRATION)");
  std::ostringstream s;
  s << in.rdbuf();
  return from_json(s.str(), path);
}

OVERLAP_FUNC calibration calibration::broadcast(MPI_Comm comm, int root, const calibration& mine,
                                                const std::string& origin) {
  int rank = 0;
  OVERLAP_MPI(MPI_Comm_rank, comm, &rank);
  std::string text = rank == root ? mine.to_json() : std::string();
  auto n = static_cast<int64_t>(text.size());
  OVERLAP_MPI(MPI_Bcast, &n, 1, MPI_INT64_T, root, comm);
  text.resize(static_cast<size_t>(n));
  OVERLAP_MPI(MPI_Bcast, text.data(), mpi::detail::to_count(n, "calibration text"), MPI_CHAR, root, comm);
  return from_json(text, origin);
}

}  // namespace overlap
