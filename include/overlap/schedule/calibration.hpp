#pragma once
/// @file
/// What the cost model knows about a machine, measured (overlap-calibrate, or
/// a context on first need): per link class the latency and bandwidth of a
/// ring's links, one and both directions, and how much slower a GEMM runs
/// while they carry data; per element type the GEMM rate on a grid of shapes
/// (pieces lose rate; the model interpolates). Stored as a small JSON file
/// (OVERLAP_CALIBRATION=path).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "overlap/backend/dtype.hpp"

namespace overlap {

/// Where a ring's neighbours sit: the same node (MPI moves data through
/// shared memory, with the cores that compute) or other nodes (a network).
enum class link_class { shared, network };

template <>
struct enum_names<link_class> {
  static constexpr std::array<enum_entry<link_class>, 2> entries{
      {{link_class::shared, "shared"}, {link_class::network, "network"}}};
};

/// A ring's links as measured: every rank sending to one neighbour at once
/// (one direction), or to both (both directions).
struct link_rates {
  double latency_s = 0;          ///< per message
  double bytes_per_s = 0;        ///< one direction
  double bytes_per_s_both = 0;   ///< per direction, both directions busy
  double gemm_slowdown = 1;      ///< GEMM time while the links carry data / alone (>= 1)
};

/// GEMM rates of one element type on a grid sizes x sizes x sizes (m, n, k).
struct gemm_rates {
  std::vector<int64_t> sizes;  ///< ascending
  std::vector<double> flops_per_s;  ///< [(i * n + j) * n + l] for m = sizes[i], n = sizes[j], k = sizes[l]

  [[nodiscard]] bool empty() const noexcept { return sizes.empty(); }
  /// The rate at (m, n, k): trilinear in log2 of each extent, clamped to the grid.
  [[nodiscard]] double at(int64_t m, int64_t n, int64_t k) const {
    const size_t s = sizes.size();
    auto locate = [&](int64_t v, size_t& i0, double& w) {
      const double x = std::log2(static_cast<double>(std::max<int64_t>(v, 1)));
      i0 = 0, w = 0;
      if (s == 1 || x <= std::log2(double(sizes.front()))) return;
      if (x >= std::log2(double(sizes.back()))) { i0 = s - 2, w = 1; return; }
      while (i0 + 2 < s && x > std::log2(double(sizes[i0 + 1]))) ++i0;
      const double lo = std::log2(double(sizes[i0])), hi = std::log2(double(sizes[i0 + 1]));
      w = (x - lo) / (hi - lo);
    };
    size_t i = 0, j = 0, l = 0;
    double wi = 0, wj = 0, wl = 0;
    locate(m, i, wi), locate(n, j, wj), locate(k, l, wl);
    double r = 0;
    for (int di = 0; di < 2; ++di)
      for (int dj = 0; dj < 2; ++dj)
        for (int dl = 0; dl < 2; ++dl) {
          const double w = (di ? wi : 1 - wi) * (dj ? wj : 1 - wj) * (dl ? wl : 1 - wl);
          if (w == 0) continue;
          const size_t ii = std::min(i + di, s - 1), jj = std::min(j + dj, s - 1), ll = std::min(l + dl, s - 1);
          r += w * std::log(flops_per_s[(ii * s + jj) * s + ll]);
        }
    return std::exp(r);
  }
};

/// Everything the cost model is fed.
struct calibration {
  std::map<link_class, link_rates> links;
  std::map<dtype, gemm_rates> gemm;
  std::string origin;  ///< the file it came from, or how it was measured

  [[nodiscard]] bool has(link_class l) const { return links.count(l) != 0; }
  [[nodiscard]] bool has(dtype t) const { return gemm.count(t) != 0 && !gemm.at(t).empty(); }

  [[nodiscard]] std::string to_json() const {
    nlohmann::json j;
    j["format"] = "overlap-calibration";
    j["version"] = 1;
    for (const auto& [c, l] : links)
      j["links"][to_string(c)] = {{"latency_us", l.latency_s * 1e6},
                                  {"gbit_per_s", l.bytes_per_s * 8e-9},
                                  {"gbit_per_s_both_directions", l.bytes_per_s_both * 8e-9},
                                  {"gemm_slowdown", l.gemm_slowdown}};
    for (const auto& [t, g] : gemm) {
      std::vector<double> gflops;
      for (double f : g.flops_per_s) gflops.push_back(f * 1e-9);
      j["gemm"][to_string(t)] = {{"sizes", g.sizes}, {"gflops", gflops}};
    }
    return j.dump(1);
  }

  /// Parses to_json()'s format; `origin` names the text in errors.
  [[nodiscard]] static calibration from_json(const std::string& text, const std::string& origin) {
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
    } catch (const nlohmann::json::exception& e) {
      throw bad(e.what());
    }
    return c;
  }

  /// Reads a calibration file (from_json's errors, or one naming the path).
  [[nodiscard]] static calibration load(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::invalid_argument("overlap: calibration " + path + " cannot be read (OVERLAP_CALIBRATION)");
    std::ostringstream s;
    s << in.rdbuf();
    return from_json(s.str(), path);
  }
};

}  // namespace overlap
