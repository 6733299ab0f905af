// The NCCL communicator (host side; private to the library, make_communicator() in
// pope/communicator.hpp is the public entry point).
#pragma once

#include <chrono>
#include <memory>

#include "pope/communicator.hpp"

namespace pope {

// Joins the NCCL communicator of `world`: rank 0 creates the unique id and `rendezvous`
// carries it to the others. Collectives run on `backend`'s stream (a CUDA backend on this
// rank's device), so they are ordered with the model's work. Throws CommunicatorError when
// the ranks do not connect within `timeout`.
std::unique_ptr<Communicator> make_nccl_communicator(const World& world, Backend& backend, Rendezvous& rendezvous,
                                                     std::chrono::duration<double> timeout);

}  // namespace pope
