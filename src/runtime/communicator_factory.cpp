// Picks the communicator for a world: nothing to do for one rank, NCCL for more.
#include <fmt/format.h>

#include "pope/communicator.hpp"
#ifdef POPE_HAVE_NCCL
#include "cuda/nccl_communicator.hpp"
#endif

namespace pope {

std::unique_ptr<Communicator> make_communicator(const World& world, Backend& backend, Rendezvous* rendezvous,
                                                std::chrono::duration<double> timeout) {
  if (world.size == 1) return std::make_unique<SingleProcessCommunicator>();
  if (backend.device() != DeviceKind::cuda)
    throw LaunchError(fmt::format("rank {}: a world of {} ranks reduces gradients with NCCL, which needs the CUDA "
                                  "backend; this rank runs {} (set train.device=cuda)",
                                  world.rank, world.size, backend.description()));
  if (rendezvous == nullptr)
    throw LaunchError(fmt::format("rank {}: a world of {} ranks needs a rendezvous for NCCL's id: launch with "
                                  "mpirun (a build with MPI) or set POPE_RENDEZVOUS=file:PATH",
                                  world.rank, world.size));
#ifdef POPE_HAVE_NCCL
  return make_nccl_communicator(world, backend, *rendezvous, timeout);
#else
  (void)timeout;
  throw LaunchError(fmt::format("rank {}: a world of {} ranks needs NCCL, and this build has none (install NCCL "
                                "with the CUDA toolkit and reconfigure)",
                                world.rank, world.size));
#endif
}

}  // namespace pope
