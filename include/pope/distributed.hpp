// Data-parallel launch: who this process is (rank, world size, local rank → GPU), how the
// ranks agree on one value before they can talk (NCCL's unique id), and which part of every
// global batch each rank reads. Launchers supported, in the order they are detected:
//   Open MPI  (mpirun)             OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK
//   torchrun-style environment     RANK, WORLD_SIZE, LOCAL_RANK
//   Slurm (srun)                   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//   none of them                   one process (rank 0 of 1)
// Everything here but MpiSession is host code without MPI or NCCL, so that it is tested on
// the CPU.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace pope {

// An inconsistent launch environment (missing or malformed variable, rank ≥ world size) or a
// failed rendezvous; the message names the variable or file. Tools map the former to exit 2.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Launcher { single, openmpi, environment, slurm };
const char* launcher_name(Launcher launcher);

struct World {
  int rank = 0;        // 0 .. size−1; rank 0 logs, evaluates and writes checkpoints
  int size = 1;
  int local_rank = 0;  // index among the ranks of this node: the CUDA device it uses
  Launcher launcher = Launcher::single;
  bool is_root() const { return rank == 0; }
};

// Reads one environment variable; nullopt when unset. Tests pass a map instead of getenv.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();

// The world this process belongs to, from the first launcher whose variables are set (see
// the top of this file). Throws LaunchError naming the variable when one of a launcher's
// variables is missing or not a whole number, or when rank ≥ size or local rank < 0.
World detect_world(const EnvLookup& env);

// POPE_NCCL_TIMEOUT_S (seconds, default 300): how long a rank waits for the others (in the
// rendezvous, a collective, a barrier) before it gives up with an error. Throws LaunchError
// for a value that is not a positive number.
std::chrono::duration<double> communication_timeout(const EnvLookup& env);

// How ranks that cannot talk yet agree on a value chosen by rank 0.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Rank 0 passes the value and gets it back; the other ranks' argument is ignored and they
  // receive rank 0's. Throws LaunchError when it does not arrive in time.
  virtual std::string share_from_root(const std::string& value) = 0;
  // Called once every rank holds the value (e.g. after the communicator built from it is
  // up), so that a rendezvous can clean up after itself.
  virtual void complete() {}
};

// POPE_RENDEZVOUS=file:PATH on a file system every rank sees. Rank 0 refuses a PATH that
// exists (a stale value of an earlier launch would connect ranks to a dead job), writes the
// value atomically, and removes the file in complete(); the others poll for it until the
// timeout. The value travels as hex text, so any bytes are fine.
class FileRendezvous final : public Rendezvous {
 public:
  FileRendezvous(std::filesystem::path path, const World& world, std::chrono::duration<double> timeout);
  std::string share_from_root(const std::string& value) override;
  void complete() override;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  World world_;
  std::chrono::duration<double> timeout_;
};

// The rendezvous POPE_RENDEZVOUS names ("file:PATH"); nullptr when it is unset. Throws
// LaunchError for any other form.
std::unique_ptr<Rendezvous> rendezvous_from_environment(const World& world, const EnvLookup& env);

// Open MPI's runtime, in a build with MPI (POPE_HAVE_MPI) for a rank that mpirun started:
// MPI_Init on construction, MPI_Finalize on destruction. Its rendezvous broadcasts rank 0's
// value with MPI_Bcast; abort() is MPI_Abort, after which mpirun stops every rank at once
// and names this one.
class MpiSession {
 public:
  static bool available();  // whether this build has MPI
  // Throws LaunchError without MPI, or when MPI's rank and size differ from `world`'s.
  explicit MpiSession(const World& world);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  std::unique_ptr<Rendezvous> rendezvous();
  [[noreturn]] void abort(int exit_code);
};

// Every rank reads a disjoint block of `accumulation` consecutive micro-batches of each
// global batch (micro_batch_size × accumulation × world size sequences, taken in order from
// the one sampler stream): rank r's micro-batch m of the step starting at global sample
// `step_first_sample` starts at sample step_first_sample + (r·accumulation + m)·micro_batch_size.
// So N ranks with accumulation a read exactly the sequences one rank reads with
// accumulation N·a, which makes their loss curves comparable and lets a run resume on
// another number of ranks.
std::uint64_t micro_batch_first_sample(std::uint64_t step_first_sample, int micro_batch_size, int accumulation,
                                       int rank, int micro);

}  // namespace pope
