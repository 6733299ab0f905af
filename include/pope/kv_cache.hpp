// The key/value cache of incremental decoding: for each layer the encoded keys and the values of
// up to `capacity` positions of `batch` sequences (pope/backend.hpp's KvCacheLayer), the
// buffers of one decode call and the recording of a one-token step. Model::make_kv_cache makes one for its model, Model::decode fills
// it; the cache belongs to that model and backend.
#pragma once

#include <memory>
#include <vector>

#include "pope/backend.hpp"

namespace pope {

class KvCache {
 public:
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache();

  int batch() const { return batch_; }
  int capacity() const { return capacity_; }
  int length() const { return length_; }  // positions cached, the same for every sequence
  // Forgets the cached positions (the storage is kept and overwritten).
  void clear() {
    length_ = 0;
    greedy_fed_ = false;
  }
  // Whether one-token decode steps are recorded and replayed on backends that record work
  // (a CUDA graph; the default). Off, every step is queued eagerly: the same numbers, slower.
  // A cache with raw keys (dynamic NTK) queues every step eagerly either way.
  void set_record_steps(bool on) { record_steps_ = on; }

 private:
  friend class Model;
  struct Buffers;
  struct GreedySlot;
  KvCache(int batch, int capacity);

  int batch_ = 0, capacity_ = 0, length_ = 0;
  bool record_steps_ = true;
  bool greedy_fed_ = false;  // the next call's tokens are in backend memory, chosen by Model::queue_greedy
  std::vector<OwnedTensor> keys_, values_, raw_keys_;  // per layer; raw_keys_ only where re-encoded
  std::unique_ptr<Buffers> buffers_;                   // sized for the largest call so far
};

}  // namespace pope
