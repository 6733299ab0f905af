// Two data-parallel ranks as threads of one test process, each on its own GPU, connected by
// NCCL through a file rendezvous (the environment launch's path): the NCCL tests' shared setup.
#pragma once
#ifdef POPE_HAVE_NCCL

#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/nccl_communicator.hpp"
#include "pope/distributed.hpp"

namespace pope::testing {

// Runs body(rank, backend, communicator) on ranks 0 and 1 at once; rethrows the first rank's
// exception, if any, once both threads have ended. The rendezvous file is removed before and after.
inline void run_two_nccl_ranks(const std::filesystem::path& rendezvous_path,
                               const std::function<void(int, Backend&, Communicator&)>& body) {
  const std::chrono::duration<double> timeout(60);
  std::filesystem::remove(rendezvous_path);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      try {
        const World world{rank, 2, rank, Launcher::environment};
        auto backend = make_cuda_backend(rank);  // the thread's current device
        FileRendezvous rendezvous(rendezvous_path, world, timeout);
        auto communicator = make_nccl_communicator(world, *backend, rendezvous, timeout);
        body(rank, *backend, *communicator);
      } catch (...) {
        errors[std::size_t(rank)] = std::current_exception();
      }
    });
  for (auto& thread : ranks) thread.join();
  std::filesystem::remove(rendezvous_path);
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);
}

}  // namespace pope::testing

#endif  // POPE_HAVE_NCCL
