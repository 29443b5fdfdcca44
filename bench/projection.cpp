// overlap-projection: the cost model's projection of a tensor-parallel MLP
// block (all_gather_matmul lhs_rows up-projection, matmul_reduce_scatter rows
// down-projection) to 8-1024 ranks, one rank per node, on stated link and
// core figures, from the GEMM rates of a calibration file (per core here,
// scaled to a node). Prints one JSON object per (link, cores, ranks) with
// every candidate's predicted time; bench/scaling.sh turns them into
// docs/scaling.md. No MPI communication: it evaluates the same model the
// library chooses with.
#include <nlohmann/json.hpp>
#include "../apps/common/cli.hpp"
#include "../apps/common/cli11.hpp"

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "overlap/ops/all_gather_matmul-inl.hpp"
#include "overlap/ops/matmul_reduce_scatter-inl.hpp"
#include "overlap/overlap.hpp"
#include "overlap/schedule/model.hpp"

namespace {

struct figures {
  double gbit = 10, latency_us = 5, slowdown = 1.1, efficiency = 0.9;
  int cores = 32;
};

/// The candidates of one op (traits Op) on R ranks and their predicted
/// seconds: the plan rank 0 would run (it holds the largest shards of these
/// balanced layouts), built dry as the library's choice builds it.
template <class Op, class ChunksFor>
nlohmann::json candidates(const overlap::link_rates& l, const overlap::gemm_rates& g, int R, const typename Op::args& x,
                          const typename Op::options& opt, const typename Op::global& whole, ChunksFor&& chunks_for) {
  nlohmann::json out;
  const std::pair<overlap::strategy, overlap::algorithm> all[] = {
      {overlap::strategy::bulk, overlap::algorithm::named},
      {overlap::strategy::ring, overlap::algorithm::named},
      {overlap::strategy::bidirectional, overlap::algorithm::named},
      {overlap::strategy::bulk, overlap::algorithm::others}};
  for (const auto& [s, a] : all) {
    overlap::schedule sched;
    sched.strategy = s, sched.algorithm = a;
    sched.lanes = s == overlap::strategy::bidirectional ? 2 : 1;
    // The other operands in one piece; bulk in none.
    sched.chunks = a == overlap::algorithm::others ? 1 : s == overlap::strategy::bulk ? 0 : chunks_for(sched.lanes);
    const std::string name = a == overlap::algorithm::others ? "others" : overlap::to_string(s);
    const overlap::detail::build_site site = overlap::detail::build_site::projected(R, 0);
    out[name] = overlap::detail::predict(l, g, R, overlap::detail::priced<Op>(site, x, opt, whole, sched));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  int64_t tokens = 8192, hidden = 8192;
  std::vector<double> links{10, 25, 100};
  std::vector<int> cores{32, 128};
  figures f;
  CLI::App app{"overlap-projection: the cost model's speedup over bulk for 8-1024 ranks on stated figures"};
  overlap::apps::init_app(app);
  app.add_option("calibration", path, "calibration file whose f32 GEMM grid is one core's rates")->required();
  app.add_option("--tokens", tokens, "rows of the activation (sequence x batch)");
  app.add_option("--hidden", hidden, "hidden size; the MLP's inner size is 4x");
  app.add_option("--gbit", links, "NIC rates (Gbit/s each way; a switched network, full duplex)")->delimiter(',');
  app.add_option("--cores", cores, "cores per node (one rank per node)")->delimiter(',');
  app.add_option("--latency-us", f.latency_us, "per-message latency");
  app.add_option("--slowdown", f.slowdown, "GEMM time factor while the NIC moves data at its full rate both ways");
  app.add_option("--efficiency", f.efficiency, "a node's GEMM rate = cores x one core's x this");
  CLI11_PARSE(app, argc, argv);
  const overlap::calibration cal = overlap::calibration::load(path);
  // A projection is computed, not measured: each line names the GEMM rates'
  // origin (where overlap-calibrate measured them, when the file says) and
  // the version of the model that projected.
  nlohmann::json rates_from{{"file", path}};
  {
    std::ifstream in(path);
    const nlohmann::json file = nlohmann::json::parse(in, nullptr, false);
    if (file.is_object() && file.contains("measured_on")) rates_from["measured_on"] = file["measured_on"];
  }
  if (!cal.has(overlap::dtype::f32)) {
    std::cerr << "overlap-projection: " << path << " has no f32 GEMM rates\n";
    return 1;
  }
  for (double gbit : links)
    for (int c : cores) {
      overlap::gemm_rates g = cal.gemm.at(overlap::dtype::f32);
      for (double& r : g.flops_per_s) r *= c * f.efficiency;
      // A switched network: one NIC per node, full duplex; two lanes share its
      // send side, so each gets half of it.
      overlap::link_rates l{f.latency_us * 1e-6, gbit / 8e-9, gbit / 16e-9, 1, {}};
      // --slowdown is the GEMM's time factor while the NIC moves data at its
      // full rate both ways; the calibration's factor is measured at half that.
      const double per_byte = (f.slowdown - 1) / (f.slowdown * 2 * l.bytes_per_s);
      l.gemm_slowdown = overlap::detail::slowdown_from_seconds_per_byte(per_byte, l.bytes_per_s_both);
      for (int R = 8; R <= 1024; R *= 2) {
        const int64_t ffn = 4 * hidden;
        // Up-projection: AG lhs_rows, A = activation (tokens x hidden) sharded by rows,
        // B = this rank's ffn / R columns of W1.
        const std::vector<int64_t> n_r = overlap::shard_layout::balanced(ffn, R).sizes();
        overlap::detail::ag_global column_parallel;
        column_parallel.full = overlap::detail::ag_geometry(overlap::ag_options{});
        column_parallel.full.layout = overlap::shard_layout::balanced(tokens, R);
        column_parallel.full.x_rows = tokens, column_parallel.full.x_cols = hidden;
        column_parallel.other = n_r;
        // The plan's own chunk choice for these global sizes, on a cluster (not one node).
        auto chunks = [&](overlap::detail::chunk_rule rule, int lanes) {
          overlap::detail::chunk_request r;
          r.rule = rule, r.ranks = R, r.lanes = lanes;
          r.piece_units = tokens / R / lanes, r.bytes_per_unit = hidden * 4;
          return overlap::detail::plan_chunks(r);
        };
        auto ag_chunks = [&](int lanes) { return chunks(overlap::detail::ag_chunk_rule, lanes); };
        // Rank 0's operands (shapes only: a dry plan reads no data).
        const int64_t shard0 = column_parallel.full.layout.size(0), n0 = n_r.front();
        const overlap::detail::ag_args<float> up_x{
            {nullptr, shard0, hidden}, {nullptr, hidden, n0}, {nullptr, tokens, n0}, {}, false};
        const nlohmann::json up =
            candidates<overlap::detail::ag_op<float>>(l, g, R, up_x, overlap::ag_options{}, column_parallel, ag_chunks);
        // Down-projection: RS rows, A = H_r (tokens x ffn / R), B = W2_r (ffn / R x hidden).
        overlap::detail::rs_global row_parallel;
        row_parallel.rows = true, row_parallel.m = tokens, row_parallel.n = hidden;
        row_parallel.layout = overlap::shard_layout::balanced(tokens, R);
        row_parallel.ks = n_r;
        auto rs_chunks = [&](int lanes) { return chunks(overlap::detail::rs_chunk_rule, lanes); };
        const overlap::detail::rs_args<float> down_x{
            {nullptr, tokens, n0}, {nullptr, n0, hidden}, {nullptr, row_parallel.layout.size(0), hidden}};
        const nlohmann::json down =
            candidates<overlap::detail::rs_op<float>>(l, g, R, down_x, overlap::rs_options{}, row_parallel, rs_chunks);
        std::cout << nlohmann::json{{"gbit", gbit},
                                    {"cores", c},
                                    {"ranks", R},
                                    {"tokens", tokens},
                                    {"hidden", hidden},
                                    {"latency_us", f.latency_us},
                                    {"slowdown", f.slowdown},
                                    {"efficiency", f.efficiency},
                                    {"up", up},
                                    {"down", down},
                                    {"gemm_rates_from", rates_from},
                                    {"overlap", overlap::version()}}
                         .dump()
                  << "\n";
      }
    }
  return 0;
}
