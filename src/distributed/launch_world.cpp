// Which launcher started this process and where it sits in the world (see distributed.hpp).
#include <fmt/format.h>

#include <charconv>
#include <cstdlib>

#include "pope/distributed.hpp"

namespace pope {

namespace {

// One launcher's three variables, in the order rank, size, local rank.
struct LauncherVariables {
  Launcher launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
};

constexpr LauncherVariables kLaunchers[] = {
    {Launcher::openmpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {Launcher::environment, "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {Launcher::slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

int whole_number(const EnvLookup& env, const char* name, const char* launcher) {
  const std::optional<std::string> text = env(name);
  if (!text)
    throw LaunchError(fmt::format("{} is not set; a {} launch sets all of its rank variables (see README: "
                                  "multi-GPU training)",
                                  name, launcher));
  int value = 0;
  const char* end = text->data() + text->size();
  const auto [stop, error] = std::from_chars(text->data(), end, value);
  if (text->empty() || error != std::errc() || stop != end)
    throw LaunchError(fmt::format("{}=\"{}\": expected a whole number", name, *text));
  return value;
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::single: return "single process";
    case Launcher::openmpi: return "Open MPI";
    case Launcher::environment: return "RANK/WORLD_SIZE environment";
    case Launcher::slurm: return "Slurm";
  }
  return "?";
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

World detect_world(const EnvLookup& env) {
  for (const LauncherVariables& vars : kLaunchers) {
    // Any one of the three marks the launcher, so that a missing companion is reported
    // instead of silently falling through to a single process.
    if (!env(vars.rank) && !env(vars.size)) continue;
    const char* name = launcher_name(vars.launcher);
    World world;
    world.launcher = vars.launcher;
    world.rank = whole_number(env, vars.rank, name);
    world.size = whole_number(env, vars.size, name);
    world.local_rank = whole_number(env, vars.local_rank, name);
    if (world.size < 1) throw LaunchError(fmt::format("{}={}: expected at least 1", vars.size, world.size));
    if (world.rank < 0 || world.rank >= world.size)
      throw LaunchError(fmt::format("{}={} with {}={}: expected a rank in [0, {})", vars.rank, world.rank, vars.size,
                                    world.size, world.size));
    if (world.local_rank < 0)
      throw LaunchError(fmt::format("{}={}: expected a local rank >= 0", vars.local_rank, world.local_rank));
    return world;
  }
  return World{};
}

std::chrono::duration<double> communication_timeout(const EnvLookup& env) {
  constexpr double kDefaultSeconds = 300.0;
  const std::optional<std::string> text = env("POPE_NCCL_TIMEOUT_S");
  if (!text) return std::chrono::duration<double>(kDefaultSeconds);
  double seconds = 0.0;
  const char* end = text->data() + text->size();
  const auto [stop, error] = std::from_chars(text->data(), end, seconds);
  if (text->empty() || error != std::errc() || stop != end || !(seconds > 0.0))
    throw LaunchError(fmt::format("POPE_NCCL_TIMEOUT_S=\"{}\": expected a positive number of seconds", *text));
  return std::chrono::duration<double>(seconds);
}

}  // namespace pope
