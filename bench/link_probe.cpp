// The link's own rates, without the library: every rank exchanges `bytes`
// with its ring neighbours in raw MPI, one way (all to rank p - 1) and both
// ways (half to p - 1, half to p + 1), all transfers posted at once. Their
// ratio is what any bidirectional schedule can gain on this network; the
// bench compares the engine's comm-only times with it. Prints one JSON line
// (rank 0), medians over iterations of the slowest rank.
//
//   mpirun -np R overlap-link-probe [--bytes N] [--iters N] [--transport TEXT]
#include <mpi.h>

#include <cstdint>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include "../apps/common/cli11.hpp"

#include "../apps/common/cli.hpp"
#include "../apps/common/measure.hpp"
#include "../apps/common/provenance.hpp"
#include "overlap/core/error.hpp"
#include "overlap/mpi/environment.hpp"
#include "overlap/mpi/request.hpp"

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  int p = 0, R = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &p);
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  int64_t bytes = 8 << 20;
  int iters = 9;
  std::string transport;
  CLI::App app{"overlap-link-probe: one-way and two-way ring exchange in raw MPI"};
  overlap::apps::init_app(app);
  app.add_option("--bytes", bytes, "bytes each rank sends per exchange (even)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  app.add_option("--iters", iters, "measured iterations (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--transport", transport, "label of the transport for the report");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return p == 0 ? (app.exit)(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  bytes -= bytes % 2;
  const int count = static_cast<int>(bytes), half = count / 2;
  std::vector<char> out(static_cast<size_t>(bytes), static_cast<char>(p + 1)), in(static_cast<size_t>(bytes));
  const int left = (p + R - 1) % R, right = (p + 1) % R;
  overlap::mpi::request_group reqs;
  auto one_way = [&] {
    OVERLAP_MPI(MPI_Irecv, in.data(), count, MPI_BYTE, right, 0, MPI_COMM_WORLD, reqs.add());
    OVERLAP_MPI(MPI_Isend, out.data(), count, MPI_BYTE, left, 0, MPI_COMM_WORLD, reqs.add());
    reqs.wait_all();
  };
  auto both_ways = [&] {
    OVERLAP_MPI(MPI_Irecv, in.data(), half, MPI_BYTE, right, 0, MPI_COMM_WORLD, reqs.add());
    OVERLAP_MPI(MPI_Irecv, in.data() + half, half, MPI_BYTE, left, 1, MPI_COMM_WORLD, reqs.add());
    OVERLAP_MPI(MPI_Isend, out.data(), half, MPI_BYTE, left, 0, MPI_COMM_WORLD, reqs.add());
    OVERLAP_MPI(MPI_Isend, out.data() + half, half, MPI_BYTE, right, 1, MPI_COMM_WORLD, reqs.add());
    reqs.wait_all();
  };
  // Interleaved so that a slow phase of a shared machine hits both alike.
  std::vector<double> t1, t2;
  for (int it = 0; it < iters; ++it) {
    t1.push_back(overlap::apps::median_max_ms(MPI_COMM_WORLD, it == 0 ? 1 : 0, 1, one_way));
    t2.push_back(overlap::apps::median_max_ms(MPI_COMM_WORLD, it == 0 ? 1 : 0, 1, both_ways));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  if (p == 0) {
    const double a = median(t1), b = median(t2);
    nlohmann::json row{{"probe", "ring_exchange"}, {"ranks", R},     {"bytes", bytes},         {"one_way_ms", a},
                       {"both_ways_ms", b},        {"ratio", b / a}, {"transport", transport}, {"iterations", iters}};
    row.update(overlap::apps::provenance());
    std::cout << row.dump() << "\n";
  }
  return 0;
}
