// Every CPU allocation and free of this process, on every thread, counted exactly.
//
// Installed in front of torch's CPU allocator (c10::SetCPUAllocator at the highest
// priority): each allocation is handed to the allocator that was there before and
// recorded under its address with its size and the kind of thread that asked for it; its
// free takes it off. Live and peak bytes change under one lock, so the peak is the
// largest total the process held at any instant, not a sum of per-thread peaks.
//
// Threads are told apart by a tag the caller sets on its own thread: 0 (any other thread,
// gloo's workers among them), 1 (the step's thread), 2 (the step's thread inside a
// collective). Each tag has its own live and peak bytes, by where a block was allocated
// (whichever thread frees it).
//
// Each block also carries its serial number (allocations so far when it was made), so that
// what was allocated since a point and is still live can be summed; and a limit can be set
// on what the process holds: an allocation by the step's thread (tag 1) that would take
// the live bytes past it throws c10::OutOfMemoryError (torch.OutOfMemoryError in Python)
// before anything is allocated, as the CUDA allocator refuses past a card's memory. Other
// threads are never refused (an exception on an intra-op worker would end the process).
//
// The blocks it hands out look like the default allocator's (the context is the data
// pointer), so raw_allocate / raw_deallocate and is_simple_data_ptr behave as before.
// Plain C functions (ctypes): no pybind11 and no ATen headers, so it builds in seconds.

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr int kTags = 3;

struct Block {
  int64_t size;
  int tag;
  int64_t serial;
  c10::DataPtr inner;  // the previous allocator's block, freed when this is erased
};

struct Counts {
  int64_t live = 0;
  int64_t peak = 0;
  int64_t allocations = 0;
  int64_t tag_live[kTags] = {0, 0, 0};
  int64_t tag_peak[kTags] = {0, 0, 0};
  int64_t tag_allocations[kTags] = {0, 0, 0};
};

std::mutex mutex;
std::unordered_map<void*, Block>* blocks = nullptr;  // never destroyed: frees outlive exit
Counts counts;
std::vector<Counts>* enclosing = nullptr;  // the counts that nested ones restarted
c10::Allocator* previous = nullptr;
thread_local int thread_tag = 0;
int64_t next_serial = 0;
int64_t live_limit = -1;  // no limit
constexpr int kStepTag = 1;

void counted_delete(void* data) {
  Block block;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = blocks->find(data);
    if (found == blocks->end()) {
      return;  // not ours (cannot happen: only our blocks carry this deleter)
    }
    block = std::move(found->second);
    blocks->erase(found);
    counts.live -= block.size;
    counts.tag_live[block.tag] -= block.size;
  }
  // block.inner goes out of scope here, outside the lock: the previous allocator frees.
}

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    const int tag = thread_tag;
    const auto size = static_cast<int64_t>(n);
    if (tag == kStepTag) {
      int64_t live = 0;
      int64_t limit = -1;
      {
        std::lock_guard<std::mutex> lock(mutex);
        live = counts.live;
        limit = live_limit;
      }
      TORCH_CHECK_WITH(
          OutOfMemoryError,
          limit < 0 || live + size <= limit,
          "CPU memory limit exceeded: allocating ", size, " bytes with ", live,
          " bytes live would pass the limit of ", limit, " bytes live");
    }
    c10::DataPtr inner = previous->allocate(n);
    void* data = inner.get();
    if (data == nullptr) {
      return inner;  // zero bytes: nothing held, and every such block shares one address
    }
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mutex);
      blocks->emplace(data, Block{size, tag, next_serial++, std::move(inner)});
      counts.live += size;
      counts.allocations += 1;
      if (counts.live > counts.peak) {
        counts.peak = counts.live;
      }
      counts.tag_live[tag] += size;
      counts.tag_allocations[tag] += 1;
      if (counts.tag_live[tag] > counts.tag_peak[tag]) {
        counts.tag_peak[tag] = counts.tag_live[tag];
      }
    }
    return {data, data, &counted_delete, device};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &counted_delete;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingAllocator* installed = nullptr;

}  // namespace

extern "C" {

// Idempotent. Returns 1 once installed (now or before).
int tuner_count_install() {
  std::lock_guard<std::mutex> lock(mutex);
  if (installed == nullptr) {
    blocks = new std::unordered_map<void*, Block>();
    enclosing = new std::vector<Counts>();
    previous = c10::GetCPUAllocator();
    installed = new CountingAllocator();
    c10::SetCPUAllocator(installed, /*priority=*/UINT8_MAX);
  }
  return c10::GetCPUAllocator() == installed ? 1 : 0;
}

void tuner_count_set_thread_tag(int tag) {
  thread_tag = (tag >= 0 && tag < kTags) ? tag : 0;
}

int tuner_count_thread_tag() {
  return thread_tag;
}

// Opens a nested count: every peak restarts from what is live now, and what they were is
// kept for tuner_count_pop.
void tuner_count_push() {
  std::lock_guard<std::mutex> lock(mutex);
  enclosing->push_back(counts);
  counts.peak = counts.live;
  counts.allocations = 0;
  for (int tag = 0; tag < kTags; ++tag) {
    counts.tag_peak[tag] = counts.tag_live[tag];
    counts.tag_allocations[tag] = 0;
  }
}

// Closes the innermost count: the enclosing one's peaks and allocations take in the
// inner's, as if it had never restarted them.
void tuner_count_pop() {
  std::lock_guard<std::mutex> lock(mutex);
  if (enclosing->empty()) {
    return;
  }
  const Counts outer = enclosing->back();
  enclosing->pop_back();
  counts.peak = std::max(counts.peak, outer.peak);
  counts.allocations += outer.allocations;
  for (int tag = 0; tag < kTags; ++tag) {
    counts.tag_peak[tag] = std::max(counts.tag_peak[tag], outer.tag_peak[tag]);
    counts.tag_allocations[tag] += outer.tag_allocations[tag];
  }
}

// Fills out[0..2 + 3 * kTags): live, peak, allocations, then per tag live, peak,
// allocations, read together under the lock.
void tuner_count_read(int64_t* out) {
  std::lock_guard<std::mutex> lock(mutex);
  out[0] = counts.live;
  out[1] = counts.peak;
  out[2] = counts.allocations;
  for (int tag = 0; tag < kTags; ++tag) {
    out[3 + 3 * tag] = counts.tag_live[tag];
    out[4 + 3 * tag] = counts.tag_peak[tag];
    out[5 + 3 * tag] = counts.tag_allocations[tag];
  }
}

// The serial number the next allocation will carry.
int64_t tuner_count_serial() {
  std::lock_guard<std::mutex> lock(mutex);
  return next_serial;
}

// Bytes of the live blocks allocated from serial number `since` on by threads tagged `tag`.
int64_t tuner_count_live_since(int64_t since, int tag) {
  std::lock_guard<std::mutex> lock(mutex);
  int64_t total = 0;
  for (const auto& entry : *blocks) {
    if (entry.second.serial >= since && entry.second.tag == tag) {
      total += entry.second.size;
    }
  }
  return total;
}

// The serial number of the live block at `data` if a thread tagged `tag` allocated it, or
// -1 where none such starts there.
int64_t tuner_count_serial_of(void* data, int tag) {
  std::lock_guard<std::mutex> lock(mutex);
  auto found = blocks->find(data);
  if (found == blocks->end() || found->second.tag != tag) {
    return -1;
  }
  return found->second.serial;
}

// The most the process may hold live once an allocation of the step's thread is counted;
// negative: no limit.
void tuner_count_set_limit(int64_t limit) {
  std::lock_guard<std::mutex> lock(mutex);
  live_limit = limit;
}

}  // extern "C"
