#pragma once
// Where a figure was measured, as the apps record it beside every JSON line
// and above every table they print: the CPU and the ISA oneDNN runs on, the
// MPI library, oneDNN, overlap and the date (the transport is the apps' own
// field). A result file carried to
// another machine (or read a year later) says what produced it; the SMPI
// sweep once reused GEMM rates measured on another CPU without anything in
// its files showing it.

#include <mpi.h>
#include <oneapi/dnnl/dnnl.h>

#include <ctime>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <overlap/backend/onednn.hpp>
#include <overlap/core/version.hpp>
#include <overlap/mpi/simulator.hpp>

namespace overlap::apps {

/// The CPU's model name from /proc/cpuinfo, with its family and model
/// numbers where it gives them ("unknown" elsewhere): one name can cover
/// generations whose cores differ by 2x ("AMD EPYC" is Zen 4, family 25, or
/// Zen 5, family 26, on this project's machines).
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string name, family, model;
  auto value = [](const std::string& line) {
    const size_t at = line.find_first_not_of(" \t", line.find(':') + 1);
    return at == std::string::npos ? std::string() : line.substr(at);
  };
  for (std::string line; std::getline(in, line) && !line.empty();) {  // the first processor's block
    if (line.find(':') == std::string::npos) continue;
    if (line.rfind("model name", 0) == 0)
      name = value(line);
    else if (line.rfind("cpu family", 0) == 0)
      family = value(line);
    else if (line.rfind("model", 0) == 0 && line.find_first_of(" \t") == 5)
      model = value(line);
  }
  if (name.empty()) return "unknown";
  return family.empty() || model.empty() ? name : fmt::format("{} (family {}, model {})", name, family, model);
}

/// The first line of MPI_Get_library_version ("Open MPI v4.1.4, ...", "MPICH
/// Version: ...", SimGrid's under SMPI).
inline std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "unknown";
  std::string s(text, static_cast<size_t>(len));
  s = s.substr(0, s.find('\n'));
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0' || s.back() == ',')) s.pop_back();
  return s;
}

/// The oneDNN library the program runs with (not the headers it was built with).
inline std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
}

/// Today's date, UTC, as YYYY-MM-DD.
inline std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[16];
  return std::strftime(buf, sizeof buf, "%Y-%m-%d", &utc) > 0 ? buf : "unknown";
}

/// The fields every JSON line of the apps carries: cpu, isa (oneDNN's, after
/// ONEDNN_MAX_CPU_ISA), mpi, onednn, overlap and date.
inline nlohmann::json provenance() {
  nlohmann::json j{{"cpu", cpu_model()},         {"isa", overlap::backend::cpu_isa()}, {"mpi", mpi_library()},
                   {"onednn", onednn_version()}, {"overlap", overlap::version()},      {"date", utc_date()}};
  // Under SMPI, what a second of this machine's computation was charged:
  // smpi/host-speed against the simulated host's speed (docs/smpi.md).
  if (overlap::mpi::simulated)
    j["smpi_host_speed_flops"] = overlap::mpi::host_speed(),
    j["smpi_platform_speed_flops"] = overlap::mpi::platform_speed();
  return j;
}

/// The same as one line above a printed table (the MPI library's name and
/// version only: its first comma-separated field).
inline std::string provenance_line() {
  const std::string mpi = mpi_library();
  return fmt::format("machine: {}, ISA {}; {}; oneDNN {}; overlap {}; {}", cpu_model(), overlap::backend::cpu_isa(),
                     mpi.substr(0, mpi.find(',')), onednn_version(), overlap::version(), utc_date());
}

}  // namespace overlap::apps
