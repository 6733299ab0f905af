// The data-parallel bootstrap on the CPU: launcher detection and its errors, the
// communication timeout, the shared-file rendezvous and the batch partition.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "pope/distributed.hpp"

using namespace pope;

namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The LaunchError message of detect_world, or "" when it succeeds.
std::string launch_error(std::map<std::string, std::string> vars) {
  try {
    detect_world(env_of(std::move(vars)));
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "";
}

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("pope_" + name + "_" + std::to_string(::getpid()));
}

}  // namespace

TEST(LaunchWorld, NoLauncherIsOneProcess) {
  const World world = detect_world(env_of({}));
  EXPECT_EQ(world.rank, 0);
  EXPECT_EQ(world.size, 1);
  EXPECT_EQ(world.local_rank, 0);
  EXPECT_EQ(world.launcher, Launcher::single);
}

TEST(LaunchWorld, ReadsEachLauncher) {
  World w = detect_world(env_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  EXPECT_EQ(w.launcher, Launcher::openmpi);
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.size, 4);
  EXPECT_EQ(w.local_rank, 1);
  w = detect_world(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}}));
  EXPECT_EQ(w.launcher, Launcher::environment);
  EXPECT_EQ(w.rank, 1);
  EXPECT_FALSE(w.is_root());
  w = detect_world(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"}}));
  EXPECT_EQ(w.launcher, Launcher::slurm);
  EXPECT_EQ(w.size, 8);
  EXPECT_TRUE(w.is_root());
}

// mpirun inside a Slurm allocation, torchrun inside one: the launcher that started the
// process wins over the allocation's variables.
TEST(LaunchWorld, OpenMpiThenEnvironmentThenSlurm) {
  const std::map<std::string, std::string> slurm{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}};
  auto with_env = slurm;
  with_env.insert({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  EXPECT_EQ(detect_world(env_of(with_env)).launcher, Launcher::environment);
  auto with_mpi = with_env;
  with_mpi.insert({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  EXPECT_EQ(detect_world(env_of(with_mpi)).launcher, Launcher::openmpi);
}

TEST(LaunchWorld, InconsistentEnvironmentsNameTheVariable) {
  EXPECT_NE(launch_error({{"RANK", "0"}, {"LOCAL_RANK", "0"}}).find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(launch_error({{"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}).find("RANK is not set"), std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("LOCAL_RANK is not set"), std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}})
                .find("RANK=2 with WORLD_SIZE=2: expected a rank in [0, 2)"),
            std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "x1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}})
                .find("RANK=\"x1\": expected a whole number"),
            std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "1 "}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}).find("whole number"),
            std::string::npos);
  EXPECT_NE(launch_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}, {"SLURM_LOCALID", "0"}})
                .find("SLURM_NTASKS=0: expected at least 1"),
            std::string::npos);
  EXPECT_NE(launch_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}})
                .find("OMPI_COMM_WORLD_LOCAL_RANK=-1"),
            std::string::npos);
}

TEST(LaunchWorld, CommunicationTimeout) {
  EXPECT_DOUBLE_EQ(communication_timeout(env_of({})).count(), 300.0);
  EXPECT_DOUBLE_EQ(communication_timeout(env_of({{"POPE_NCCL_TIMEOUT_S", "2.5"}})).count(), 2.5);
  for (const char* bad : {"0", "-3", "", "10s"}) {
    try {
      communication_timeout(env_of({{"POPE_NCCL_TIMEOUT_S", bad}}));
      FAIL() << "accepted POPE_NCCL_TIMEOUT_S=" << bad;
    } catch (const LaunchError& e) {
      EXPECT_NE(std::string(e.what()).find("POPE_NCCL_TIMEOUT_S"), std::string::npos) << e.what();
    }
  }
}

TEST(FileRendezvousTest, TheOtherRanksReceiveRankZerosBytes) {
  const auto path = temp_path("rendezvous_share");
  std::filesystem::remove(path);
  std::string value(128, '\0');  // NCCL's id is raw bytes, zeros included
  for (std::size_t i = 0; i < value.size(); ++i) value[i] = char(i * 37 + 11);
  const std::chrono::duration<double> timeout(10.0);
  std::string received_1, received_2;
  // The others start polling before rank 0 writes.
  std::thread rank1([&] { received_1 = FileRendezvous(path, World{1, 3, 1}, timeout).share_from_root("ignored"); });
  std::thread rank2([&] { received_2 = FileRendezvous(path, World{2, 3, 2}, timeout).share_from_root(""); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  FileRendezvous root(path, World{0, 3, 0}, timeout);
  EXPECT_EQ(root.share_from_root(value), value);
  rank1.join();
  rank2.join();
  EXPECT_EQ(received_1, value);
  EXPECT_EQ(received_2, value);
  root.complete();
  EXPECT_FALSE(std::filesystem::exists(path)) << "rank 0 removes the file once every rank has the value";
}

TEST(FileRendezvousTest, RootRefusesAStaleFile) {
  const auto path = temp_path("rendezvous_stale");
  std::ofstream(path) << "pope-rendezvous v1\nabcd\n";
  try {
    FileRendezvous(path, World{0, 2, 0}, std::chrono::duration<double>(1.0)).share_from_root("id");
    FAIL() << "expected LaunchError";
  } catch (const LaunchError& e) {
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(FileRendezvousTest, OtherRanksTimeOutNamingThemselvesAndThePath) {
  const auto path = temp_path("rendezvous_missing");
  std::filesystem::remove(path);
  const auto start = std::chrono::steady_clock::now();
  try {
    FileRendezvous(path, World{1, 2, 1}, std::chrono::duration<double>(0.2)).share_from_root("");
    FAIL() << "expected LaunchError";
  } catch (const LaunchError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(FileRendezvousTest, RejectsAFileThatIsNotARendezvous) {
  const auto path = temp_path("rendezvous_garbage");
  std::ofstream(path) << "hello\nworld\n";
  EXPECT_THROW(FileRendezvous(path, World{1, 2, 1}, std::chrono::duration<double>(1.0)).share_from_root(""),
               LaunchError);
  std::filesystem::remove(path);
}

TEST(FileRendezvousTest, FromTheEnvironment) {
  const World world{1, 2, 1, Launcher::environment};
  EXPECT_EQ(rendezvous_from_environment(world, env_of({})), nullptr);
  const auto rendezvous = rendezvous_from_environment(world, env_of({{"POPE_RENDEZVOUS", "file:/tmp/x"}}));
  ASSERT_NE(dynamic_cast<FileRendezvous*>(rendezvous.get()), nullptr);
  EXPECT_EQ(dynamic_cast<FileRendezvous*>(rendezvous.get())->path(), "/tmp/x");
  for (const char* bad : {"tcp://host:29500", "file:", "/tmp/x"})
    EXPECT_THROW(rendezvous_from_environment(world, env_of({{"POPE_RENDEZVOUS", bad}})), LaunchError) << bad;
}

// N ranks with accumulation a read, together, exactly the samples one rank reads with
// accumulation N·a, step after step, each sample once.
TEST(BatchPartition, RanksSplitTheGlobalBatchOfOneRank) {
  const int micro = 3;
  for (const int ranks : {1, 2, 4}) {
    const int accumulation = 2;
    const int global = micro * accumulation * ranks;
    for (std::uint64_t step_start : {std::uint64_t(0), std::uint64_t(global), std::uint64_t(7) * global}) {
      std::multiset<std::uint64_t> one_rank, many_ranks;
      for (int m = 0; m < accumulation * ranks; ++m) {
        const std::uint64_t first = micro_batch_first_sample(step_start, micro, accumulation * ranks, 0, m);
        for (int b = 0; b < micro; ++b) one_rank.insert(first + std::uint64_t(b));
      }
      for (int r = 0; r < ranks; ++r)
        for (int m = 0; m < accumulation; ++m) {
          const std::uint64_t first = micro_batch_first_sample(step_start, micro, accumulation, r, m);
          for (int b = 0; b < micro; ++b) many_ranks.insert(first + std::uint64_t(b));
        }
      EXPECT_EQ(many_ranks, one_rank) << ranks << " ranks";
      EXPECT_EQ(std::set<std::uint64_t>(many_ranks.begin(), many_ranks.end()).size(), std::size_t(global));
      EXPECT_EQ(*many_ranks.begin(), step_start);
      EXPECT_EQ(*many_ranks.rbegin(), step_start + std::uint64_t(global) - 1);
    }
  }
}

TEST(BatchPartition, RejectsOutOfRangeArguments) {
  EXPECT_THROW(micro_batch_first_sample(0, 4, 2, 0, 2), std::invalid_argument);
  EXPECT_THROW(micro_batch_first_sample(0, 0, 2, 0, 0), std::invalid_argument);
  EXPECT_THROW(micro_batch_first_sample(0, 4, 2, -1, 0), std::invalid_argument);
}
