// The settings table (config.hpp): reading the environment, validation, the
// help text and the verbose description all derive from it; and the enum
// name tables behind to_string and parsing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "overlap/overlap.hpp"

namespace {

TEST(settings, every_variable_is_read_checked_and_described) {
  const overlap::config defaults;
  const std::string help = overlap::env_help(), banner = overlap::describe(defaults);
  std::set<std::string> seen;
  for (const overlap::setting& s : overlap::settings()) {
    EXPECT_TRUE(seen.insert(s.field).second) << "field listed twice: " << s.field;
    EXPECT_EQ(s.check(defaults), "") << s.field << ": the default breaks its own range";
    if (s.variable == nullptr) continue;
    const std::string v(s.variable);
    EXPECT_NE(help.find(v + "=" + s.allowed()), std::string::npos) << v << " missing from env_help:\n" << help;
    EXPECT_NE(help.find("(" + s.fallback() + ")"), std::string::npos) << v;
    if (!s.fallback().empty()) {
      EXPECT_NE(banner.find(v + "=" + s.fallback()), std::string::npos) << banner;
    }
    // Setting the variable to its default's text reads back the default.
    if (!s.fallback().empty()) {
      setenv(s.variable, s.fallback().c_str(), 1);
      EXPECT_EQ(s.text(overlap::config::from_env()), s.fallback()) << v;
    }
    setenv(s.variable, "not-a-value", 1);
    if (s.allowed() != "path") {
      // Recorded, not thrown: the context refuses it on every rank.
      const overlap::config c = overlap::config::from_env();
      EXPECT_NE(c.problems.find(v + "='not-a-value' must be"), std::string::npos) << v << ": " << c.problems;
      EXPECT_EQ(s.text(c), s.fallback()) << v << ": a refused value must leave the default";
      EXPECT_NE(overlap::detail::config_problem(c).find(v), std::string::npos) << v;
    }
    unsetenv(s.variable);
  }
  EXPECT_GE(seen.size(), 12u);
}

// docs/cluster.md's table of settings names every variable with its default
// as the code has it (the docs cannot drift from settings()).
// The source tree comes from the environment (CTest sets OVERLAP_SOURCE_DIR),
// not a compiled-in path, so that the object is the same in every clone and
// the compiler cache keeps it.
TEST(settings, the_docs_table_matches_the_code) {
  const char* src = std::getenv("OVERLAP_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "OVERLAP_SOURCE_DIR (the source tree) is not set; ctest sets it";
  std::ifstream in(std::string(src) + "/docs/cluster.md");
  ASSERT_TRUE(in) << "docs/cluster.md not found under " << src;
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  for (const overlap::setting& s : overlap::settings()) {
    if (s.variable == nullptr) continue;
    const std::string row = "| `" + std::string(s.variable) + "` | ";
    const size_t at = doc.find(row);
    ASSERT_NE(at, std::string::npos) << s.variable << " has no row in docs/cluster.md's settings table";
    const std::string cell = doc.substr(at + row.size(), doc.find(" |", at + row.size()) - at - row.size());
    const std::string want = s.fallback().empty() ? "(none)" : "`" + s.fallback() + "`";
    EXPECT_EQ(cell.rfind(want, 0), 0U) << s.variable << ": the docs give the default '" << cell << "', the code '"
                                       << want << "'";
  }
}

TEST(settings, ranges_come_from_the_table) {
  setenv("OVERLAP_PLAN_CACHE", "70000", 1);
  setenv("OVERLAP_ON_FATAL", "explode", 1);
  const std::string problems = overlap::config::from_env().problems;
  EXPECT_NE(problems.find("OVERLAP_PLAN_CACHE='70000' must be from 1 to 65536"), std::string::npos) << problems;
  EXPECT_NE(problems.find("OVERLAP_ON_FATAL='explode' must be one of abort, throw"), std::string::npos) << problems;
  unsetenv("OVERLAP_PLAN_CACHE");
  unsetenv("OVERLAP_ON_FATAL");
  overlap::config c;
  c.rs_chunks = 1;
  EXPECT_EQ(overlap::detail::config_problem(c), "config.rs_chunks (1) must be 0 or from 2 to 1024");
  c = {};
  c.bf16 = static_cast<overlap::bf16_gemm>(7);
  EXPECT_EQ(overlap::detail::config_problem(c), "config.bf16 has an invalid value 7");
  c = {};
  c.phases = overlap::ring_phases::comm_only;
  EXPECT_NE(overlap::describe(c).find("phases=comm_only"), std::string::npos) << overlap::describe(c);
}

template <class E>
void round_trip() {
  for (const auto& entry : overlap::enum_names<E>::entries) {
    E parsed{};
    EXPECT_TRUE(overlap::parse_enum(entry.name, parsed)) << entry.name;
    EXPECT_EQ(parsed, entry.value);
    EXPECT_STREQ(overlap::to_string(entry.value), entry.name);
    EXPECT_TRUE(overlap::is_valid(entry.value));
  }
  E untouched = overlap::enum_names<E>::entries.front().value;
  EXPECT_FALSE(overlap::parse_enum("no-such-name", untouched));
  EXPECT_EQ(untouched, overlap::enum_names<E>::entries.front().value);
  EXPECT_FALSE(overlap::is_valid(static_cast<E>(99)));
  EXPECT_STREQ(overlap::to_string(static_cast<E>(99)), "?");
}

TEST(enum_names, every_table_round_trips) {
  round_trip<overlap::strategy>();
  round_trip<overlap::algorithm>();
  round_trip<overlap::gathered>();
  round_trip<overlap::scattered>();
  round_trip<overlap::activation>();
  round_trip<overlap::backend_kind>();
  round_trip<overlap::progress_policy>();
  round_trip<overlap::fatal_policy>();
  round_trip<overlap::bf16_gemm>();
  round_trip<overlap::ring_phases>();
  round_trip<overlap::dtype>();
  round_trip<overlap::link_class>();
  EXPECT_EQ(overlap::enum_choices<overlap::strategy>(), "bulk|ring|bidirectional|automatic|hierarchical|pairwise");
}

}  // namespace

// A program's own config, with a job's variables on top (config::from_env(base)):
// what the environment sets wins, the rest is the program's.
TEST(settings, the_environment_overrides_a_given_config_only_where_set) {
  overlap::config mine;
  mine.timeout_s = 7;
  mine.plan_cache = 5;
  setenv("OVERLAP_VERBOSE", "1", 1);
  overlap::config c = overlap::config::from_env(mine);
  EXPECT_EQ(c.timeout_s, 7);
  EXPECT_EQ(c.plan_cache, 5);
  EXPECT_EQ(c.verbose, 1);
  EXPECT_TRUE(c.problems.empty()) << c.problems;
  setenv("OVERLAP_TIMEOUT_S", "9", 1);
  c = overlap::config::from_env(mine);
  EXPECT_EQ(c.timeout_s, 9);
  unsetenv("OVERLAP_VERBOSE");
  unsetenv("OVERLAP_TIMEOUT_S");
}
