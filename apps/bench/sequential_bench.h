// strata/apps/bench/sequential_bench.h — timed sequential direct I/O through strata's own engine:
// what `strata io-bench` reports and what `strata tune` sweeps.
//
// How it measures: N engines (`threads`), each on its own thread over its own slice of the
// volume, keep `queue_depth` requests of `block_size` in flight, sequentially, wrapping
// around their slice until `seconds` pass (or once over the slice when `seconds` is 0).
// Buffers come from one page-aligned region, allocated and mlocked before the clock starts
// and registered with each uring engine (fixed buffers). By default the region asks for
// transparent huge pages: a 1 MiB buffer is then one physically contiguous segment, which a
// device with a 254-segment limit (virtio-blk) takes as one request instead of two. Every thread starts on a barrier;
// the time runs from the barrier to the last completion.
//
// Data check (after the timed window, outside it): for reads the volume carries a stamp
// (each 8-byte word holds its logical offset), written when the volume is created or
// extended, and the last block read into every buffer is checked against it; for writes
// every buffer holds its own pattern, and a sample of blocks is read back and compared with
// the buffer that wrote them last. A mismatch is a `corrupt` error, never a figure.
//
// Threads: `run_sequential_bench` is called from one thread and starts its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/io.h"

namespace strata::io {

struct SequentialBenchOptions {
  std::vector<std::string> paths;   // several: striped
  uint64_t stripe_bytes = 1 << 20;  // with several paths
  uint64_t size_bytes = 1ull << 30; // logical bytes the run covers
  Op op = Op::read;
  EngineConfig engine;              // backend, queue_depth, block_size_bytes, sqpoll, iopoll
  uint32_t threads = 1;
  double seconds = 0;               // 0: one pass over the size
  bool register_buffers = true;
  bool huge_pages = true;           // madvise(MADV_HUGEPAGE) on the buffer region
};

struct SequentialBenchResult {
  uint64_t bytes = 0;
  double seconds = 0;
  double MBps = 0;                  // 1e6 bytes per second
  std::string engine_description;   // of the first engine
  std::string volume_description;
  bool direct = false;
  uint32_t alignment_bytes = 0;
  uint64_t buffer_region_bytes = 0;
  bool buffers_locked = false;      // mlock succeeded
  bool buffers_registered = false;  // every engine registered its part (uring)
  uint64_t huge_page_bytes = 0;     // of the buffer region in transparent huge pages, after set-up
  uint64_t fixed_buffer_ops = 0;
  uint64_t verified_blocks = 0;
  bool prepared_volume = false;     // the run had to write the stamp first (reads)
};

// Makes sure the volume exists, is preallocated to `size_bytes`, and — for reads — carries
// the offset stamp, writing it when missing. Part of every run; exposed for tune, which
// prepares once and then runs many points.
[[nodiscard]] Status prepare_bench_volume(const SequentialBenchOptions& options, bool stamp,
                                          bool* wrote_stamp);

[[nodiscard]] Result<SequentialBenchResult> run_sequential_bench(const SequentialBenchOptions& options);

}  // namespace strata::io
