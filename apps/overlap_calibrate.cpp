// overlap-calibrate: measures what the cost model needs on the ranks it runs
// on and writes a calibration file (OVERLAP_CALIBRATION=FILE makes contexts
// use it). Run it the way the ops run: one rank per core or per socket, over
// the nodes and network the jobs use. The ring links it measures are of the
// class of its ranks: all on one node (shared) or spread over nodes
// (network); --update adds them to an existing file, so one file can hold
// both classes.
#include <fmt/format.h>
#include "common/cli11.hpp"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "overlap/calibrate/measure.hpp"
#include "overlap/overlap.hpp"

#include "common/cli.hpp"
#include "common/provenance.hpp"

namespace {

overlap::dtype dtype_named(const std::string& s) {
  return s == "f64" ? overlap::dtype::f64 : s == "bf16" ? overlap::dtype::bf16 : overlap::dtype::f32;
}

}  // namespace

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string output = "overlap-calibration.json";
  std::vector<std::string> types{"f32", "bf16"};
  std::vector<int64_t> sizes = overlap::detail::calibration_sizes();
  bool update = false, links_only = false;
  CLI::App app{"overlap-calibrate: measure link and GEMM rates for the cost model and write a calibration file"};
  overlap::apps::init_app(app);
  app.add_option("-o,--output", output, "the calibration file to write (rank 0)");
  app.add_option("--dtypes", types, "element types whose GEMM rates to measure")
      ->check(CLI::IsMember({"f32", "bf16", "f64"}))
      ->delimiter(',');
  app.add_option("--sizes", sizes, "GEMM grid extents (ascending), every m x n x k of them is measured")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->delimiter(',');
  app.add_flag("--update", update, "keep what the existing file holds and replace only what this run measures");
  app.add_flag("--links-only", links_only,
               "measure the ring links only, no GEMM rates (with --update: a file's GEMM rates, measured once, "
               "serve several networks)");
  app.footer("Library settings come from the environment:\n" + overlap::env_help());
  if (auto done = overlap::apps::parse(app, argc, argv, rank)) return *done;
  try {
    if (!std::is_sorted(sizes.begin(), sizes.end()) || std::adjacent_find(sizes.begin(), sizes.end()) != sizes.end())
      throw std::invalid_argument("--sizes must be ascending and distinct");
    if (links_only) types.clear();
    overlap::config cfg = overlap::config::from_env();
    cfg.calibration.clear();  // measure, do not read
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    overlap::calibration cal;
    if (update && rank == 0) {
      std::ifstream in(output);
      if (in) cal = overlap::calibration::load(output);
    }
    const double t0 = MPI_Wtime();
    for (const std::string& t : types)
      cal.gemm[dtype_named(t)] = overlap::detail::measure_gemm(ctx, dtype_named(t), sizes);
    if (ctx.size() >= 2) cal.links[ctx.links()] = overlap::detail::measure_link_class(ctx, overlap::dtype::f32);
    const double took = MPI_Wtime() - t0;
    if (rank == 0) {
      // Where it was measured travels with the rates (the library ignores the
      // field): a file carried to another machine says whose rates it holds.
      nlohmann::json file = nlohmann::json::parse(cal.to_json());
      file["measured_on"] = overlap::apps::provenance();
      std::ofstream(output) << file.dump(2) << "\n";
      fmt::print("overlap-calibrate: {} ranks{}, {:.1f} s; wrote {}\n", ctx.size(),
                 ctx.one_node() ? " on one node" : "", took, output);
      for (const auto& [c, l] : cal.links)
        fmt::print(
            "  links {:<8} latency {:8.1f} us, {:7.3f} Gbit/s one way, {:7.3f} Gbit/s each way both busy, "
            "GEMM slowdown {:.3f}\n",
            overlap::to_string(c), l.latency_s * 1e6, l.bytes_per_s * 8e-9, l.bytes_per_s_both * 8e-9, l.gemm_slowdown);
      for (const auto& [c, l] : cal.links) {
        if (l.collectives.ranks == 0) continue;
        fmt::print("  collectives {} on {} ranks, Gbit/s as the model prices them, per block size:\n",
                   overlap::to_string(c), l.collectives.ranks);
        overlap::detail::for_each_collective(l.collectives, [](const char* name, const overlap::collective_rate& r) {
          std::string cells;
          for (size_t i = 0; i < r.block_bytes.size(); ++i)
            cells += fmt::format("  {:.0f} KiB {:.3f}", r.block_bytes[i] / 1024, r.bytes_per_s[i] * 8e-9);
          fmt::print("    {:<15}{}\n", name, cells);
        });
      }
      for (const auto& [t, g] : cal.gemm) {
        const int64_t lo = g.sizes.front(), hi = g.sizes.back();
        fmt::print("  gemm {:<5} GFLOP/s: {}^3 {:.1f}, {}^3 {:.1f}, {}x{}x{} {:.1f} (grid of {} shapes)\n",
                   overlap::to_string(t), lo, g.at(lo, lo, lo) * 1e-9, hi, g.at(hi, hi, hi) * 1e-9, lo, hi, hi,
                   g.at(lo, hi, hi) * 1e-9, g.flops_per_s.size());
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "overlap-calibrate (rank {}): {}\n", rank, e.what());
    return 1;
  }
  return 0;
}
