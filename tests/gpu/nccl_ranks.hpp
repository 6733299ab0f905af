// Two data-parallel ranks as threads of one test process, each on its own GPU, connected by
// NCCL through a file rendezvous (the environment launch's path): the NCCL tests' shared setup.
#pragma once
#ifdef POPE_HAVE_NCCL

#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/nccl_communicator.hpp"
#include "pope/distributed.hpp"

namespace pope::testing {

// Runs body(rank, backend, communicator) on ranks 0 and 1 at once; once both threads have ended,
// throws if either failed, with both ranks' messages (a rank that fails makes its peer time out
// in a collective, so the peer's message alone would hide the cause). The rendezvous file is
// removed before and after.
inline void run_two_nccl_ranks(const std::filesystem::path& rendezvous_path,
                               const std::function<void(int, Backend&, Communicator&)>& body) {
  const std::chrono::duration<double> timeout(30);  // the tests take seconds; a hang costs this per test
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
  std::string messages;
  for (int rank = 0; rank < 2; ++rank) {
    if (!errors[std::size_t(rank)]) continue;
    try {
      std::rethrow_exception(errors[std::size_t(rank)]);
    } catch (const std::exception& e) {
      messages += "\n  rank " + std::to_string(rank) + ": " + e.what();
    } catch (...) {
      messages += "\n  rank " + std::to_string(rank) + ": a non-standard exception";
    }
  }
  if (!messages.empty()) throw std::runtime_error("two-rank NCCL run failed:" + messages);
}

}  // namespace pope::testing

#endif  // POPE_HAVE_NCCL
