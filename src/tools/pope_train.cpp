// pope-train: train a GPT with a pluggable positional encoding from a JSON config, on one
// process or data-parallel over GPUs (mpirun, torchrun-style or Slurm launch; see README).
// With --seeds or --vary, a group of runs in this process (threads sharing its GPU).
// Exit codes: 0 finished, 1 runtime/data/checkpoint/communication error, 2 usage, config or
// launch-environment error, 3 aborted after repeated non-finite steps, 130/143 stopped by
// SIGINT/SIGTERM (SIGHUP: 143; checkpointed).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "pope/checkpoint.hpp"
#include "pope/communicator.hpp"
#include "pope/config.hpp"
#include "pope/data.hpp"
#include "pope/distributed.hpp"
#include "pope/model.hpp"
#include "pope/position.hpp"
#include "pope/train.hpp"
#include "tools/console_log.hpp"
#include "tools/enum_option.hpp"
#include "tools/number_checks.hpp"
#include "tools/text_checks.hpp"
#include "tools/version.hpp"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitConfig = 2;
constexpr int kExitAborted = 3;

// --dry-run: the plan, then every problem the trainer's start-up checks find (exit 2 if one is
// a config problem, else 1), without writing anything.
int print_plan(const pope::RunConfig& config, const std::filesystem::path& run_dir, const pope::World& world,
               const pope::TrainerOptions& options) {
  const auto position = pope::make_position_encoding(config.model);
  const auto layout = pope::build_parameter_layout(config.model, *position);
  const auto& m = config.model;
  std::cout << pope::config_to_json(config).dump(2) << "\n";
  std::printf("model: %d layers, %d heads, n_embd %d, context %d, position %s\n", m.n_layer, m.n_head, m.n_embd,
              m.context_length, m.position.kind.c_str());
  const auto total = pope::count_parameters(m, layout), matrices = pope::count_matrix_parameters(m, layout);
  std::printf("parameters: %lld (%.2fM), of which %.1fM in weight matrices (the paper's count); padded "
              "vocabulary rows excluded\n",
              static_cast<long long>(total), double(total) / 1e6, double(matrices) / 1e6);
  std::printf("batch: %d sequences × %d tokens = %d tokens/step, micro-batch %d, accumulation %d, %d rank%s (%s)\n",
              config.train.batch_size, config.train.seq_len, config.train.batch_size * config.train.seq_len,
              config.train.micro_batch_size, config.grad_accumulation(world.size), world.size,
              world.size == 1 ? "" : "s", pope::launcher_name(world.launcher));
  std::printf("run directory: %s\n", run_dir.string().c_str());
  const std::vector<pope::InputProblem> problems = pope::check_run_inputs(config, options);
  bool config_problem = false;
  for (const pope::InputProblem& problem : problems) {
    spdlog::error("{}{}", problem.config ? "config error: " : "", problem.message);
    config_problem = config_problem || problem.config;
  }
  if (!problems.empty()) return config_problem ? kExitConfig : kExitRuntime;
  std::printf("inputs: every start-up check passed\n");
  return 0;
}

int exit_code(pope::StopReason reason) {
  switch (reason) {
    case pope::StopReason::finished:
    case pope::StopReason::stop_at_step: return 0;
    case pope::StopReason::interrupted: return 128 + SIGINT;
    case pope::StopReason::terminated: return 128 + SIGTERM;
  }
  return 0;
}

// Runs `run`, mapping what it throws to an exit code and a message for `fail`.
template <class Run, class Fail> int guarded(Run&& run, Fail&& fail) {
  try {
    return run();
  } catch (const pope::ConfigError& e) {
    return fail(kExitConfig, std::string("config error: ") + e.what());
  } catch (const pope::LaunchError& e) {
    return fail(kExitConfig, std::string("launch error: ") + e.what());
  } catch (const pope::TrainingAborted& e) {
    return fail(kExitAborted, e.what());
  } catch (const std::bad_alloc&) {
    return fail(kExitRuntime, pope::tools::kOutOfMemory);
  } catch (const std::exception& e) {
    return fail(kExitRuntime, e.what());
  }
}

// One run of a group (--seeds, --vary): its config, options, directory and name.
struct GroupRun {
  pope::RunConfig config;
  pope::TrainerOptions options;
};

// A value as part of a directory name: characters other than letters, digits, '.', '-' become '_'.
std::string directory_part(const std::string& value) {
  std::string part = value;
  for (char& c : part)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  return part;
}

// Every combination of the --vary values (KEY=V1,V2,…, in order, each a directory level
// <last key segment>_<value>), then of the seeds (seed_S): one run each.
std::vector<GroupRun> group_runs(const std::string& config_path, const std::vector<std::string>& overrides,
                                 const std::vector<std::string>& vary, const std::vector<long>& seeds,
                                 const pope::TrainerOptions& options) {
  struct Combination {
    std::vector<std::string> overrides;
    std::filesystem::path dir;
    std::string name;
  };
  std::vector<Combination> combinations{{overrides, options.run_dir, ""}};
  for (const std::string& assignment : vary) {
    const std::size_t equals = assignment.find('=');
    const std::string key = assignment.substr(0, equals);
    std::vector<std::string> values;
    if (equals != std::string::npos) {
      std::string rest = assignment.substr(equals + 1) + ",";
      for (std::size_t at = 0, comma; (comma = rest.find(',', at)) != std::string::npos; at = comma + 1)
        values.push_back(rest.substr(at, comma - at));
    }
    const bool empty_value = std::find(values.begin(), values.end(), "") != values.end();
    if (key.empty() || values.empty() || empty_value)
      throw pope::ConfigError("--vary", fmt::format("'{}': expected KEY=V1,V2,… (e.g. model.position.kind=pope,rope)",
                                                    assignment));
    if (std::set<std::string>(values.begin(), values.end()).size() != values.size())
      throw pope::ConfigError("--vary", fmt::format("'{}': a value is given twice; each run needs its own", assignment));
    const std::string segment = key.substr(key.rfind('.') + 1);
    std::vector<Combination> next;
    for (const Combination& c : combinations)
      for (const std::string& value : values) {
        Combination d = c;
        d.overrides.push_back(key + "=" + value);
        d.dir /= segment + "_" + directory_part(value);
        d.name += (d.name.empty() ? "" : " ") + segment + "=" + value;
        next.push_back(std::move(d));
      }
    combinations = std::move(next);
  }
  if (std::set<long>(seeds.begin(), seeds.end()).size() != seeds.size())
    throw pope::ConfigError("--seeds", "a seed is given twice; each run needs its own");
  std::vector<GroupRun> runs;
  for (const Combination& c : combinations) {
    const pope::RunConfig config = pope::load_config(config_path, c.overrides);
    for (std::size_t i = 0; i < std::max<std::size_t>(seeds.size(), 1); ++i) {
      GroupRun run{config, options};
      run.options.run_dir = c.dir;
      run.options.run_name = c.name;
      if (!seeds.empty()) {
        run.config.train.seed = std::uint64_t(seeds[i]);
        run.options.run_dir /= fmt::format("seed_{}", seeds[i]);
        run.options.run_name += (c.name.empty() ? "" : " ") + fmt::format("seed {}", seeds[i]);
      }
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

// The runs of a group in this process, each in its own thread with its own backend (on the GPU
// its own stream, so that the runs' kernels overlap) and run directory; each computes what it
// computes alone. The first failing run's exit code, in the group's order, is returned.
int train_group(const std::vector<GroupRun>& group) {
  std::vector<int> codes(group.size(), 0);
  std::vector<std::thread> threads;
  pope::Trainer::install_signal_handlers();
  for (std::size_t i = 0; i < group.size(); ++i)
    threads.emplace_back([&, i] {
      const GroupRun& run = group[i];
      codes[i] = guarded(
          [&] {
            pope::Trainer trainer(run.config, run.options,
                                  pope::make_backend(run.config.train.device, "float", run.config.train.threads, 0));
            return exit_code(trainer.train().reason);
          },
          [&](int code, const std::string& message) {
            spdlog::error("{}: {}", run.options.run_name, message);
            return code;
          });
    });
  for (std::thread& thread : threads) thread.join();
  for (int code : codes)
    if (code != 0) return code;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pope::tools::log_to_stderr("pope-train");
  CLI::App app{"pope-train: train a GPT whose attention uses a pluggable positional encoding (RoPE, PoPE, ALiBi, "
               "NoPE).\nConfig keys are documented in configs/README.md."};
  app.footer("Multi-GPU: one process per GPU, e.g. mpirun -np 2 -x NCCL_NVLS_ENABLE=0 pope-train -c CONFIG, or\n"
             "torchrun/srun-style RANK, WORLD_SIZE, LOCAL_RANK (or SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) with\n"
             "POPE_RENDEZVOUS=file:PATH; POPE_NCCL_TIMEOUT_S (default 300) bounds every wait for other ranks.\n"
             "Exit codes: 0 done (or --stop-at reached), 1 data/checkpoint/runtime/communication error, 2 usage,\n"
             "config or launch-environment error, 3 aborted after train.max_nonfinite_steps non-finite steps,\n"
             "130/143 stopped by SIGINT/SIGTERM (SIGHUP: 143, unless ignored by nohup; the step finishes and a\n"
             "checkpoint is written; continue with --resume auto).");
  std::string config_path, out_dir, resume, device, init_from;
  std::vector<std::string> overrides;
  std::vector<long> seeds;
  std::vector<std::string> vary;
  bool dry_run = false, quiet = false, no_checkpoints = false;
  long stop_at = 0;
  app.add_option("-c,--config", config_path, "JSON config file; a bare name resolves in configs/")
      ->required()
      ->check(pope::tools::kNonEmpty);
  app.add_option("-s,--set", overrides, "override a config key, e.g. --set model.position.kind=rope (repeatable)");
  app.add_option("-o,--out", out_dir, "run directory (default: the config's out_dir, else runs/<config name>)")
      ->check(pope::tools::kNonEmpty);
  app.add_option("--resume", resume, "continue a run: 'auto' (newest checkpoint in the run directory, if any) or a "
                                     "checkpoint/run directory")
      ->check(pope::tools::kNonEmpty);
  app.add_option("--init-from", init_from, "start a fresh run from a checkpoint's weights (run or step directory): "
                                           "optimizer state, step and LR schedule start fresh; the tensor shapes "
                                           "must match this config's. Ignored when --resume finds a checkpoint")
      ->check(pope::tools::kNonEmpty);
  app.add_option("--device", device, "auto | cpu | cuda (overrides train.device)")
      ->check(pope::tools::one_of_names<pope::DeviceChoice>());
  app.add_option("--stop-at", stop_at, "checkpoint and exit 0 after this global step (time-sliced jobs; the LR "
                                      "schedule still spans train.steps)")
      ->check(pope::tools::integer_check(stop_at, 1));
  app.add_flag("--no-checkpoints", no_checkpoints,
               "write no checkpoint, not even at the end (benchmark and scaling runs); the run cannot be resumed")
      ->excludes("--stop-at");
  app.add_option("--seeds", seeds, "train one run per seed (train.seed) in this process, sharing its GPU, each in "
                                   "OUT/seed_S, e.g. --seeds 1,2,3,4; one process, one GPU")
      ->delimiter(',')
      ->check(pope::tools::integer_check(seeds, 0L, long(std::numeric_limits<std::int32_t>::max())));
  app.add_option("--vary", vary, "train one run per value of a config key in this process, each in "
                                 "OUT/<key's last part>_<value>, e.g. --vary model.position.kind=pope,rope; repeatable "
                                 "(every combination), and with --seeds every seed of each")
      ->check(pope::tools::kNonEmpty);
  app.add_flag("--dry-run", dry_run,
               "print the resolved config, parameter count and batch plan, run every start-up check of the inputs "
               "(data, run directory, --resume/--init-from, tokenizer) reporting all problems, then exit");
  app.add_flag("-q,--quiet", quiet, "only warnings and errors on the console");
  pope::tools::finish_cli(app, "pope-train");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitConfig;
  }

  // In a world of several ranks every message names its rank, and a rank that fails ends
  // the job: under mpirun through MPI_Abort (mpirun then stops every rank and names this
  // one), otherwise the other ranks' communicators time out or see the abort.
  pope::World world;
  std::unique_ptr<pope::MpiSession> mpi;
  const auto fail = [&](int code, const std::string& message) {
    if (world.size > 1)
      spdlog::error("rank {} of {}: {}", world.rank, world.size, message);
    else
      spdlog::error("{}", message);
    if (mpi && world.size > 1) mpi->abort(code);
    return code;
  };
  return guarded([&]() -> int {
    if (!device.empty()) overrides.push_back("train.device=" + device);
    pope::RunConfig config = pope::load_config(config_path, overrides);
    std::filesystem::path run_dir = out_dir;
    if (run_dir.empty()) run_dir = config.out_dir;
    if (run_dir.empty()) run_dir = std::filesystem::path("runs") / pope::resolve_config_path(config_path).stem();
    const pope::EnvLookup env = pope::process_environment();
    world = pope::detect_world(env);
    const pope::TrainerOptions options{run_dir, resume, quiet, stop_at, init_from, !no_checkpoints};
    if (!seeds.empty() || !vary.empty()) {
      if (world.size > 1)
        throw pope::LaunchError(fmt::format("--seeds and --vary train their runs in one process on one device; this "
                                            "is rank {} of a world of {}", world.rank, world.size));
      if (!resume.empty() && resume != "auto")
        throw pope::ConfigError("--resume", "with --seeds or --vary only 'auto' (each run resumes from its own "
                                            "directory)");
      const std::vector<GroupRun> group = group_runs(config_path, overrides, vary, seeds, options);
      if (!dry_run) return train_group(group);
      for (const GroupRun& run : group)
        if (const int code = print_plan(run.config, run.options.run_dir, world, run.options); code != 0) return code;
      return 0;
    }
    if (dry_run) return print_plan(config, run_dir, world, options);

    std::unique_ptr<pope::Rendezvous> rendezvous = pope::rendezvous_from_environment(world, env);
    if (world.launcher == pope::Launcher::openmpi && pope::MpiSession::available()) {
      mpi = std::make_unique<pope::MpiSession>(world);
      if (!rendezvous) rendezvous = mpi->rendezvous();
    }
    config.grad_accumulation(world.size);  // a global batch the ranks cannot split is a config error
    auto backend = pope::make_backend(config.train.device, "float", config.train.threads, world.local_rank);
    auto communicator =
        pope::make_communicator(world, *backend, rendezvous.get(), pope::communication_timeout(env));

    pope::Trainer::install_signal_handlers();
    pope::Trainer trainer(config, options, std::move(backend),
                          std::move(communicator));
    return exit_code(trainer.train().reason);
  }, fail);
}
