#pragma once
// Command-line handling shared by the apps (CLI11): the library settings'
// footer, parsing on every rank with one rank printing, and the transport
// label of a report.
#include <cstdlib>
#include <optional>
#include <string>

#include <overlap/config.hpp>
#include <overlap/core/version.hpp>
#include <overlap/mpi/simulator.hpp>

#include "cli11.hpp"

namespace overlap::apps {

/// What every app does first, before adding its options: `--version` prints
/// overlap::version() (the headers the app was built with), and `--help`
/// shows every option's default (CLI11 captures a default only when told).
inline void init_app(CLI::App& app) {
  app.set_version_flag("--version", overlap::version(), "print the version of overlap and exit");
  app.option_defaults()->always_capture_default();
}

/// The footer listing the OVERLAP_* settings and the --transport option
/// (into `transport`; see transport_label).
inline void add_common_options(CLI::App& app, std::string& transport, std::string* save_calibration = nullptr) {
  app.add_option("--transport", transport, "label of the transport for the report (default: $OVERLAP_TRANSPORT)");
  if (save_calibration != nullptr)
    app.add_option("--save-calibration", *save_calibration,
                   "write the calibration, with the schedules automatic measured, to FILE (rank 0) for a later "
                   "run's OVERLAP_CALIBRATION: its calls start from them instead of measuring");
  app.footer("Library settings come from the environment:\n" + overlap::env_help());
}

/// Parses argv on every rank; rank 0 alone prints help or the error. Returns
/// the exit status when the program should end there.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv, int rank) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return rank == 0 ? (app.exit)(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  return std::nullopt;
}

/// The transport a report names: --transport, else $OVERLAP_TRANSPORT, else
/// `fallback`. Under SimGrid SMPI it starts with "smpi" (the platform's
/// description follows, or "simulated platform"), so a simulated figure is
/// never mistaken for a measured one.
inline std::string transport_label(const std::string& given, const char* fallback) {
  const char* env = std::getenv("OVERLAP_TRANSPORT");
  std::string label = !given.empty() ? given : (env != nullptr ? env : "");
  if (overlap::mpi::simulated) {
    if (label.empty()) return "smpi (SimGrid, simulated platform)";
    return label.rfind("smpi", 0) == 0 ? label : "smpi, " + label;
  }
  return label.empty() ? fallback : label;
}

}  // namespace overlap::apps
