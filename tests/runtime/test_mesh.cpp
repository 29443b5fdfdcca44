// The mesh helper: a dp x tp (x pp) mesh over the world, its placement rule
// (the last axis varies fastest: a tensor group is consecutive ranks), the
// communicator along each axis, both ops on the contexts of two axes used in
// turn (uneven shards, every schedule) against the naive reference, and the
// errors of a bad shape on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "ag_cases.hpp"
#include "overlap/runtime/mesh.hpp"
#include "rs_cases.hpp"

using namespace testing_support;

namespace {

/// The world ranks of comm's ranks, in comm's order.
std::vector<int> members(MPI_Comm comm) {
  int n = 1, me = world_rank();
  MPI_Comm_size(comm, &n);
  std::vector<int> all(static_cast<size_t>(n));
  MPI_Allgather(&me, 1, MPI_INT, all.data(), 1, MPI_INT, comm);
  return all;
}

TEST(mesh, dp_x_tp_places_the_tensor_axis_fastest) {
  const int R = world_size(), me = world_rank();
  for (int tp = 1; tp <= R; ++tp) {
    if (R % tp != 0) continue;
    SCOPED_TRACE("dp x tp = " + std::to_string(R / tp) + " x " + std::to_string(tp));
    overlap::mesh m(MPI_COMM_WORLD, {{"dp", 0}, {"tp", tp}});
    EXPECT_EQ(m.size("dp"), R / tp);
    EXPECT_EQ(m.size("tp"), tp);
    EXPECT_EQ(m.coord("dp"), me / tp);
    EXPECT_EQ(m.coord("tp"), me % tp);
    // A tensor group is tp consecutive ranks; a data group strides by tp.
    std::vector<int> tensor, data;
    for (int i = 0; i < tp; ++i) tensor.push_back(me / tp * tp + i);
    for (int i = 0; i < R / tp; ++i) data.push_back(me % tp + i * tp);
    EXPECT_EQ(members(m.comm("tp")), tensor);
    EXPECT_EQ(members(m.comm("dp")), data);
    EXPECT_EQ(members(m.cart()).size(), static_cast<size_t>(R));
  }
}

TEST(mesh, three_axes) {
  const int R = world_size(), me = world_rank();
  const int tp = R % 2 == 0 ? 2 : 1, pp = R % 4 == 0 ? 2 : 1;
  overlap::mesh m(MPI_COMM_WORLD, {{"dp", 0}, {"pp", pp}, {"tp", tp}});
  ASSERT_EQ(m.axes().size(), 3U);
  EXPECT_EQ(m.size("dp") * pp * tp, R);
  EXPECT_EQ(m.coord("tp"), me % tp);
  EXPECT_EQ(m.coord("pp"), me / tp % pp);
  EXPECT_EQ(m.coord("dp"), me / (tp * pp));
  EXPECT_EQ(members(m.comm("pp")).size(), static_cast<size_t>(pp));
}

TEST(mesh, both_ops_on_the_contexts_of_two_axes) {
  const int R = world_size();
  const int tp = R % 2 == 0 ? 2 : R;  // several groups at even counts, one at odd
  overlap::mesh m(MPI_COMM_WORLD, {{"dp", 0, true}, {"tp", tp, true}});
  ASSERT_EQ(m.context("tp").size(), tp);
  ASSERT_EQ(m.context("dp").size(), R / tp);
  EXPECT_EQ(m.context("tp").rank(), m.coord("tp"));
  uint32_t seed = 500;
  for (const plan_choice& choice : plan_choices)
    for (const char* axis : {"tp", "dp"}) {
      overlap::context& ctx = m.context(axis);
      // Each group its own data: the seed depends on the group (the other
      // axis's coordinate), the same on the ranks of one group.
      const auto group = static_cast<uint32_t>(m.coord(std::string(axis) == "tp" ? "dp" : "tp"));
      const uint32_t s = seed + 1000 * group;
      seed += 2;
      SCOPED_TRACE(std::string("axis ") + axis + " of " + std::to_string(ctx.size()) + " ranks");
      ag_case ag{overlap::gathered::lhs_rows, choice.strategy, 19, 8, 13, split::skewed, 1, true, s};
      ag.algorithm = choice.algorithm;
      run_ag_case<float>(ctx, ag);
      rs_case rs{overlap::scattered::rows, choice.strategy, 15, 11, 9, split::first_empty, split::skewed, 0, s + 1};
      rs.algorithm = choice.algorithm;
      run_rs_case<float>(ctx, rs);
    }
}

/// Expects std::invalid_argument whose message contains `part`.
template <class F>
void expect_invalid(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; wanted one containing: " << part;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what() << "\nwanted: " << part;
  }
}

TEST(mesh, bad_shapes_fail_on_every_rank) {
  const int R = world_size();
  using axes = std::vector<overlap::mesh_axis>;
  expect_invalid(
      [&] {
        overlap::mesh m(MPI_COMM_WORLD, axes{{"tp", R + 1}});
      },
      "the shape tp=" + std::to_string(R + 1) + " does not fit the communicator's " + std::to_string(R) + " ranks");
  expect_invalid([&] { overlap::mesh m(MPI_COMM_WORLD, axes{{"dp", 0}, {"tp", R + 1}}); }, "does not fit");
  expect_invalid(
      [&] {
        overlap::mesh m(MPI_COMM_WORLD, axes{{"dp", 0}, {"tp", 0}});
      },
      "axes 'dp' and 'tp' both have size 0");
  expect_invalid([&] { overlap::mesh m(MPI_COMM_WORLD, axes{{"tp", R}, {"tp", 1}}); }, "axis 'tp' is named twice");
  expect_invalid([&] { overlap::mesh m(MPI_COMM_WORLD, axes{{"tp", -1}}); }, "negative size");
  expect_invalid([&] { overlap::mesh m(MPI_COMM_WORLD, axes{{"", R}}); }, "axis 0 has an empty name");
  expect_invalid([&] { overlap::mesh m(MPI_COMM_WORLD, axes{}); }, "at least one axis");
  if (R > 1) {  // one rank names its axis differently: every rank learns it
    const std::string name = world_rank() == R - 1 ? "x" : "tp";
    expect_invalid([&] { overlap::mesh m(MPI_COMM_WORLD, axes{{name, R}}); }, "the ranks gave different axes");
  }
  overlap::mesh m(MPI_COMM_WORLD, axes{{"dp", 0}, {"tp", 1}});
  expect_invalid([&] { (void)m.size("pp"); }, "no axis named 'pp' (axes: dp, tp)");
  expect_invalid([&] { (void)m.context("tp"); }, "axis 'tp' has no context");
}

TEST(mesh, a_context_that_fails_on_some_groups_fails_everywhere) {
  const int R = world_size();
  if (R < 2) GTEST_SKIP() << "needs two groups";
  // The last rank's config is invalid: its tp group (of one rank) fails in
  // the context's constructor, the others would succeed; every rank throws.
  overlap::config cfg;
  if (world_rank() == R - 1) cfg.plan_cache = 0;
  try {
    overlap::mesh m(MPI_COMM_WORLD, {{"dp", 0}, {"tp", 1, true}}, cfg);
    ADD_FAILURE() << "the mesh was created";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(world_rank(), R - 1) << e.what();
    EXPECT_NE(std::string(e.what()).find("the context of axis 'tp'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("plan_cache"), std::string::npos) << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(world_rank(), R - 1) << e.what();
    EXPECT_NE(std::string(e.what()).find("failed on other ranks"), std::string::npos) << e.what();
  }
}

}  // namespace
