// Open MPI for ranks started by mpirun (see distributed.hpp); without MPI in the build every
// entry point reports that it is missing.
#include <fmt/format.h>

#include <cstdlib>

#include "pope/distributed.hpp"
#ifdef POPE_HAVE_MPI
#include <mpi.h>
#endif

namespace pope {

#ifdef POPE_HAVE_MPI

namespace {

class MpiRendezvous final : public Rendezvous {
 public:
  explicit MpiRendezvous(int rank) : rank_(rank) {}
  std::string share_from_root(const std::string& value) override {
    // The length first, so that the other ranks can size their buffers.
    unsigned long long length = rank_ == 0 ? value.size() : 0;
    check(MPI_Bcast(&length, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD), "MPI_Bcast (length)");
    std::string shared = rank_ == 0 ? value : std::string(length, '\0');
    check(MPI_Bcast(shared.data(), int(length), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast (value)");
    return shared;
  }

 private:
  void check(int status, const char* what) const {
    if (status != MPI_SUCCESS) throw LaunchError(fmt::format("rank {}: {} failed (MPI error {})", rank_, what, status));
  }
  int rank_;
};

}  // namespace

bool MpiSession::available() { return true; }

MpiSession::MpiSession(const World& world) {
  if (MPI_Init(nullptr, nullptr) != MPI_SUCCESS) throw LaunchError("MPI_Init failed");
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != world.rank || size != world.size)
    throw LaunchError(fmt::format("MPI reports rank {} of {}, the environment (OMPI_COMM_WORLD_*) rank {} of {}; "
                                  "was this binary built against another MPI than the mpirun that started it?",
                                  rank, size, world.rank, world.size));
}

MpiSession::~MpiSession() { MPI_Finalize(); }

std::unique_ptr<Rendezvous> MpiSession::rendezvous() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return std::make_unique<MpiRendezvous>(rank);
}

void MpiSession::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

#else

bool MpiSession::available() { return false; }

MpiSession::MpiSession(const World&) {
  throw LaunchError("this build has no MPI (install libopenmpi-dev and reconfigure), so mpirun's ranks need "
                    "POPE_RENDEZVOUS=file:PATH");
}

MpiSession::~MpiSession() = default;

std::unique_ptr<Rendezvous> MpiSession::rendezvous() { return nullptr; }

void MpiSession::abort(int exit_code) { std::exit(exit_code); }

#endif

}  // namespace pope
