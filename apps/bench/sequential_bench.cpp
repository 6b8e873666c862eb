// strata/apps/bench/sequential_bench.cpp — see apps/bench/sequential_bench.h.
#include "apps/bench/sequential_bench.h"


#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <latch>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/pages.h"
#include "common/size.h"

namespace strata::io {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kStampMarker = 0x5354524154410000ull;  // "STRATA\0\0"
constexpr uint64_t kWriteMarker = 0x5752495445000000ull;  // "WRITE\0\0\0"
constexpr uint64_t kStampCheckBytes = 4096;

uint64_t stamp_word(uint64_t logical_offset) { return logical_offset ^ kStampMarker; }
uint64_t write_word(uint64_t buffer_index, uint64_t word_index) {
  return ((buffer_index + 1) << 40) ^ word_index ^ kWriteMarker;
}

void fill_stamp(char* data, uint64_t length_bytes, uint64_t logical_offset) {
  auto* words = reinterpret_cast<uint64_t*>(data);
  for (uint64_t i = 0; i < length_bytes / 8; ++i) words[i] = stamp_word(logical_offset + 8 * i);
}

bool stamp_matches(const char* data, uint64_t length_bytes, uint64_t logical_offset) {
  const auto* words = reinterpret_cast<const uint64_t*>(data);
  for (uint64_t i = 0; i < length_bytes / 8; ++i)
    if (words[i] != stamp_word(logical_offset + 8 * i)) return false;
  return true;
}

// The one buffer region of a run: touched and locked before the clock starts; in huge pages
// when asked (common/pages.h: a 1 MiB buffer is then one segment, not 256 pages split at
// virtio-blk's 254-segment limit). A null data() means the mapping failed.
char* chars(const PageMapping& mapping) { return reinterpret_cast<char*>(mapping.data()); }

PageMapping locked_region(uint64_t length_bytes, bool huge_pages = false) {
  PageMappingOptions options;
  options.huge_pages = huge_pages;
  options.lock = true;
  Result<PageMapping> mapping = PageMapping::map(length_bytes, options, "bench buffers");
  return mapping.ok() ? std::move(*mapping) : PageMapping();
}

Result<Volume> open_volume(const SequentialBenchOptions& options) {
  OpenOptions open_options;
  open_options.create = true;
  return Volume::open(options.paths, options.stripe_bytes, open_options);
}

struct ThreadOutcome {
  Status status;
  uint64_t bytes = 0;
  Clock::time_point end;
  std::vector<uint64_t> last_offset_in_buffer;  // reads: the block each buffer holds last
};

}  // namespace

Status prepare_bench_volume(const SequentialBenchOptions& options, bool stamp, bool* wrote_stamp) {
  *wrote_stamp = false;
  Result<Volume> volume = open_volume(options);
  if (!volume.ok()) return volume.error();
  Result<uint64_t> current = volume->size_bytes();
  if (!current.ok()) return current.error();
  if (*current < options.size_bytes) STRATA_RETURN_IF_ERROR(volume->preallocate(options.size_bytes));
  if (!stamp) return Status();

  EngineConfig config;
  config.backend = available_backends().front();
  config.queue_depth = 8;
  config.block_size_bytes = 1 * kMiB;
  Result<std::unique_ptr<Engine>> engine = make_engine(config);
  if (!engine.ok()) return engine.error();
  const uint64_t chunk_bytes = 8 * kMiB;
  PageMapping buffer = locked_region(2 * chunk_bytes);
  if (buffer.data() == nullptr) return make_errno_error(errno, "allocate buffer", "", 0, 2 * chunk_bytes);
  // Already stamped (a previous run)? Check the first and last 4 KiB.
  const uint64_t last = align_down(options.size_bytes - kStampCheckBytes, kStampCheckBytes);
  if (*current >= options.size_bytes &&
      read_exact(**engine, *volume, chars(buffer), kStampCheckBytes, 0).ok() &&
      stamp_matches(chars(buffer), kStampCheckBytes, 0) &&
      read_exact(**engine, *volume, chars(buffer), kStampCheckBytes, last).ok() &&
      stamp_matches(chars(buffer), kStampCheckBytes, last))
    return Status();
  spdlog::info("writing the offset stamp over {} of {} (once; later runs reuse it)",
               format_size(options.size_bytes), volume->describe());
  // Two chunks alternate so stamping the next one overlaps writing the last.
  std::optional<RequestId> in_flight[2];
  for (uint64_t offset = 0, index = 0; offset < options.size_bytes; offset += chunk_bytes, ++index) {
    char* chunk = chars(buffer) + (index % 2) * chunk_bytes;
    if (in_flight[index % 2]) STRATA_RETURN_IF_ERROR((*engine)->wait(*in_flight[index % 2]));
    const uint64_t length = std::min(chunk_bytes, options.size_bytes - offset);
    fill_stamp(chunk, length, offset);
    Result<RequestId> id = (*engine)->submit(Op::write, *volume, chunk, length, offset);
    if (!id.ok()) return id.error();
    in_flight[index % 2] = *id;
  }
  STRATA_RETURN_IF_ERROR((*engine)->wait_all());
  STRATA_RETURN_IF_ERROR(volume->sync());
  *wrote_stamp = true;
  return Status();
}

Result<SequentialBenchResult> run_sequential_bench(const SequentialBenchOptions& options) {
  const uint64_t block_bytes = options.engine.block_size_bytes;
  const uint32_t queue_depth = options.engine.queue_depth;
  const uint32_t threads = options.threads;
  if (threads < 1 || threads > 64)
    return make_error(ErrorKind::invalid_argument, fmt::format("threads {} is out of range; accepted: 1 to 64", threads));
  if (block_bytes == 0 || block_bytes % 8 != 0)
    return make_error(ErrorKind::invalid_argument, "block size must be a multiple of 4 KiB");
  const uint64_t slice_bytes = align_down(options.size_bytes / threads, block_bytes);
  if (slice_bytes == 0)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("size {} is too small for {} thread(s) of {} blocks",
                                  format_size(options.size_bytes), threads, format_size(block_bytes)));

  SequentialBenchResult result;
  STRATA_RETURN_IF_ERROR(prepare_bench_volume(options, options.op == Op::read, &result.prepared_volume));
  Result<Volume> opened = open_volume(options);
  if (!opened.ok()) return opened.error();
  Volume& volume = *opened;
  result.volume_description = volume.describe();
  result.direct = volume.is_direct();
  result.alignment_bytes = volume.alignment_bytes();

  // Everything the timed loop touches is made here, before the clock starts.
  const uint64_t buffers = static_cast<uint64_t>(threads) * queue_depth;
  result.buffer_region_bytes = buffers * block_bytes;
  PageMapping region = locked_region(result.buffer_region_bytes, options.huge_pages);
  result.huge_page_bytes = region.huge_page_bytes();
  if (region.data() == nullptr)
    return make_errno_error(errno, "allocate buffers", "", 0, result.buffer_region_bytes);
  result.buffers_locked = region.locked();
  if (!region.locked())
    spdlog::warn("could not mlock the {} buffer region (RLIMIT_MEMLOCK?); measuring anyway",
                 format_size(result.buffer_region_bytes));
  if (options.op == Op::write) {
    for (uint64_t b = 0; b < buffers; ++b) {
      auto* words = reinterpret_cast<uint64_t*>(chars(region) + b * block_bytes);
      for (uint64_t w = 0; w < block_bytes / 8; ++w) words[w] = write_word(b, w);
    }
  }
  std::vector<std::unique_ptr<Engine>> engines;
  result.buffers_registered = options.register_buffers && options.engine.backend == Backend::uring;
  for (uint32_t t = 0; t < threads; ++t) {
    EngineConfig config = options.engine;
    config.max_requests = std::max<uint32_t>(queue_depth, 1);
    Result<std::unique_ptr<Engine>> engine = make_engine(config);
    if (!engine.ok()) return engine.error();
    if (result.buffers_registered) {
      Status registered = (*engine)->register_buffer(
          chars(region) + static_cast<uint64_t>(t) * queue_depth * block_bytes, queue_depth * block_bytes);
      if (!registered.ok()) {
        spdlog::warn("{}", registered.to_string());
        result.buffers_registered = false;
      }
    }
    engines.push_back(std::move(engine).value());
  }
  result.engine_description = engines.front()->describe();
  const uint64_t blocks_per_slice = slice_bytes / block_bytes;
  // Writes: which buffer wrote each block last, for the check after the run.
  std::vector<uint32_t> last_writer(options.op == Op::write ? blocks_per_slice * threads : 0, UINT32_MAX);

  std::vector<ThreadOutcome> outcomes(threads);
  std::latch ready(threads + 1);
  const auto duration = std::chrono::duration<double>(options.seconds);
  std::atomic<int64_t> deadline_ns{0};
  std::vector<std::jthread> workers;
  for (uint32_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      ThreadOutcome& out = outcomes[t];
      Engine& engine = *engines[t];
      char* base = chars(region) + static_cast<uint64_t>(t) * queue_depth * block_bytes;
      out.last_offset_in_buffer.assign(queue_depth, UINT64_MAX);
      std::vector<RequestId> ids(queue_depth);
      const uint64_t slice_start = t * slice_bytes;
      uint64_t next_block = 0;       // within the slice, wrapping
      uint64_t submitted = 0, completed = 0;
      const bool one_pass = options.seconds <= 0;
      ready.arrive_and_wait();
      const Clock::time_point deadline{Clock::duration(deadline_ns.load())};
      auto submit_into = [&](uint32_t slot) -> Status {
        const uint64_t offset = slice_start + next_block * block_bytes;
        Result<RequestId> id = engine.queue(options.op, volume, base + slot * block_bytes, block_bytes, offset);
        if (!id.ok()) return id.error();
        ids[slot] = *id;
        out.last_offset_in_buffer[slot] = offset;
        if (options.op == Op::write)
          last_writer[t * blocks_per_slice + next_block] = t * queue_depth + slot;
        next_block = (next_block + 1) % blocks_per_slice;
        ++submitted;
        return Status();
      };
      bool stop = false;
      for (uint32_t slot = 0; slot < queue_depth && !(one_pass && submitted == blocks_per_slice); ++slot) {
        out.status = submit_into(slot);
        if (!out.status.ok()) return;
      }
      out.status = engine.flush();
      if (!out.status.ok()) return;
      // Whichever request finishes first gets its buffer refilled at once (waiting for the
      // oldest would idle the queue whenever the device completes out of order), and every
      // request reaped in the same tick is refilled before one flush hands them all over.
      auto refill = [&](const Engine::Finished& finished) -> Status {
        if (!finished.status.ok()) return finished.status;
        const uint32_t slot =
            static_cast<uint32_t>(std::find(ids.begin(), ids.end(), finished.id) - ids.begin());
        ++completed;
        out.bytes += block_bytes;
        if (!stop) stop = one_pass ? submitted == blocks_per_slice : Clock::now() >= deadline;
        return stop ? Status() : submit_into(slot);
      };
      while (completed < submitted) {
        Result<Engine::Finished> finished = engine.wait_any();
        out.status = finished.ok() ? refill(*finished) : Status(finished.error());
        while (out.status.ok()) {
          std::optional<Engine::Finished> more = engine.take_finished();
          if (!more) break;
          out.status = refill(*more);
        }
        if (out.status.ok()) out.status = engine.flush();
        if (!out.status.ok()) {
          (void)engine.wait_all();
          return;
        }
      }
      out.end = Clock::now();
    });
  }
  // The clock starts as the barrier opens; the threads read the deadline after it.
  const Clock::time_point start = Clock::now();
  deadline_ns.store(std::chrono::duration_cast<Clock::duration>(start.time_since_epoch() + duration).count());
  ready.arrive_and_wait();
  workers.clear();  // joins

  Clock::time_point end = start;
  for (const ThreadOutcome& out : outcomes) {
    if (!out.status.ok()) return out.status.error();
    result.bytes += out.bytes;
    end = std::max(end, out.end);
  }
  result.seconds = std::chrono::duration<double>(end - start).count();
  result.MBps = result.seconds > 0 ? result.bytes / result.seconds / 1e6 : 0;
  for (const auto& engine : engines) result.fixed_buffer_ops += engine->stats().fixed_buffer_ops;

  // The data check, outside the timed window.
  if (options.op == Op::read) {
    for (uint32_t t = 0; t < threads; ++t) {
      for (uint32_t slot = 0; slot < queue_depth; ++slot) {
        const uint64_t offset = outcomes[t].last_offset_in_buffer[slot];
        if (offset == UINT64_MAX) continue;
        const char* data = chars(region) + (static_cast<uint64_t>(t) * queue_depth + slot) * block_bytes;
        if (!stamp_matches(data, block_bytes, offset)) {
          Error error = make_error(ErrorKind::corrupt, "the bytes read do not carry their offset stamp");
          error.op = "read";
          error.path = volume.describe();
          error.offset_bytes = offset;
          error.length_bytes = block_bytes;
          error.has_range = true;
          return error;
        }
        ++result.verified_blocks;
      }
    }
  } else {
    STRATA_RETURN_IF_ERROR(volume.sync());
    EngineConfig config;
    config.backend = Backend::psync;
    config.queue_depth = 1;
    config.block_size_bytes = block_bytes;
    Result<std::unique_ptr<Engine>> checker = make_engine(config);
    if (!checker.ok()) return checker.error();
    PageMapping check = locked_region(block_bytes);
    const uint64_t blocks = last_writer.size();
    const uint64_t samples = std::min<uint64_t>(blocks, 16);
    for (uint64_t i = 0; i < samples; ++i) {
      const uint64_t block = i * blocks / samples;
      if (last_writer[block] == UINT32_MAX) continue;
      const uint64_t offset = (block / blocks_per_slice) * slice_bytes + (block % blocks_per_slice) * block_bytes;
      STRATA_RETURN_IF_ERROR(read_exact(**checker, volume, chars(check), block_bytes, offset));
      if (std::memcmp(chars(check), chars(region) + last_writer[block] * block_bytes, block_bytes) != 0) {
        Error error = make_error(ErrorKind::corrupt, "a block read back differs from what was written");
        error.op = "write";
        error.path = volume.describe();
        error.offset_bytes = offset;
        error.length_bytes = block_bytes;
        error.has_range = true;
        return error;
      }
      ++result.verified_blocks;
    }
  }
  return result;
}

}  // namespace strata::io
