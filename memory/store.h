// strata/memory/store.h — the NVMe store: crash-safe, checksummed tensors in preallocated files.
//
// What it owns: a store directory holding `manifest.json` (the committed version) and the
// data files — one preallocated file per configured path (fallocate; several paths are
// striped by io::Volume), never a file per tensor. Files are created with mode 0600. The
// store also owns the io::Engine all of its I/O goes through (built from the options, or by
// an injected factory — tests use a fault-injecting engine).
//
// Layout: the data files form one logical byte space of `capacity_bytes`. A tensor is one
// or more extents in it (at most `max_extent_bytes` each), every extent starting on the
// volume's direct-I/O alignment; free space is kept by a coalescing best-fit RangeAllocator
// (memory/allocator.h). Each extent carries the XXH3-64 of its bytes, computed when it is
// written and verified when it is read; a mismatch is a `corrupt` error naming the tensor,
// the file and the file offset. `StoreOptions::verify_reads` says which reads: every one (the
// default), or an extent's bytes only until this Store has seen them intact once — it hashed
// them itself when writing them, or verified a read of them — so a weight read every token is
// hashed on its first read after open, not on each. `verify` always checks everything.
//
// Versions and crash safety: writing a tensor always goes to FRESH extents; the committed
// extents of that tensor are untouched until the next commit has made the new ones durable.
// `commit(step, metadata)` = wait for outstanding writes → fdatasync the data files → write
// the new manifest to `manifest.json.tmp`, fsync it → rename it over `manifest.json` → fsync
// the directory → only then free the replaced extents. A crash at any instant therefore
// leaves the last committed manifest and every extent it names intact; on open, all space
// the manifest does not name is free again (writes of an uncommitted version are forgotten).
// The manifest is JSON: format name and version, generation, step, geometry, the files, a
// small string→string metadata map (step counter, data position, rng state...) and every
// tensor's dtype, shape, size and extents (logical offset, length, xxh3).
//
// Refusal: `open` refuses — with a clear message and without writing anything — a
// directory whose manifest does not parse, has another format version, or whose data files
// are missing or shorter than the manifest says. `create` refuses a directory or data path
// that already holds a store (nothing is overwritten). A manifest names each data file either
// by a plain file name (in the store folder) or by a normalized absolute path; a relative
// name with a '/' or '..', an absolute path not in `external_data_paths` (writable opens), a
// data file that is not a regular file, or a manifest over kMaxManifestBytes is refused.
//
// Async I/O and buffer lifetimes: `write_tensor_async` / `read_tensor_async` submit every
// extent to the engine and return a ticket at once; the caller's buffer must stay valid (and,
// for writes, unchanged) until `wait(ticket)` has returned. A read's checksums are verified
// inside `wait`, extent by extent while later extents are still in flight. Buffers should
// come from the pinned host arena (aligned and registered with `engine()`); other buffers
// work, with the engine bouncing any unaligned head and tail. Reads see the newest version
// of a tensor whose write has completed, committed or not.
//
// Threads: a Store belongs to one thread at a time (its engine does): every method, stats
// and list included, must be called from that thread or under the caller's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "io/io.h"

namespace strata::memory {

inline constexpr int kStoreFormatVersion = 1;
inline constexpr const char* kStoreManifestName = "manifest.json";
// The other names a store writes in its folder: a commit's manifest before its rename, and the
// data file of a store created without data paths.
inline constexpr const char* kStoreManifestTempName = "manifest.json.tmp";
inline constexpr const char* kStoreDefaultDataName = "data.strata";
// A manifest holds a few hundred bytes per extent: 256 MiB is ~10^6 extents (16 TiB of state at
// the default 16 MiB extents). Anything larger is refused before it is read into memory.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

// The checksum every extent carries: XXH3-64 of its bytes, through libxxhash's x86 dispatch
// (AVX2 where the CPU has it: ~3× the SSE2 build's rate on cached data, ~1.5× streaming from
// DRAM — measured on this box 55 vs 16 and 24 vs 16 GB/s). Same value on every CPU. `strata plan`
// times this function to predict the store's hashing cost.
uint64_t extent_checksum(const void* data, uint64_t size_bytes);

// Which reads hash their extents (see the contract above). `once` trades the detection of damage
// that appears on the drive while this Store is open, after an extent was last seen intact, for
// the CPU time of re-hashing: on a two-core box ~9 ms of a core per 64 MiB read (docs/memory.md).
enum class VerifyReads { always, once };
const char* verify_reads_name(VerifyReads mode);
// "always" / "once" → the mode; nullopt for anything else (callers name their key or flag).
std::optional<VerifyReads> parse_verify_reads(std::string_view name);

using EngineFactory = std::function<Result<std::unique_ptr<io::Engine>>(const io::EngineConfig&)>;

struct StoreOptions {
  io::EngineConfig engine;                 // the store's own engine
  EngineFactory engine_factory;            // empty: io::make_engine
  uint64_t stripe_bytes = 1 << 20;         // striping unit over several paths (create only)
  uint64_t max_extent_bytes = 16 << 20;    // tensors are cut into extents of at most this
  bool allow_buffered_fallback = true;     // filesystems without O_DIRECT, with a warning
  bool read_only = false;                  // open only: inspect / verify; writes assert
  VerifyReads verify_reads = VerifyReads::always;
  // open, writable: the absolute data-file paths the caller's own configuration names (one
  // per NVMe drive). A manifest is untrusted input: a writable open refuses one that names a
  // data file outside the store folder unless it is listed here, so a tampered manifest can
  // never make strata write anywhere else. Read-only opens write nothing and accept them.
  std::vector<std::string> external_data_paths;
};

struct Extent {
  uint64_t offset_bytes = 0;  // logical offset in the volume, aligned
  uint64_t length_bytes = 0;  // bytes of tensor data (the reservation is rounded up)
  uint64_t xxh3 = 0;          // XXH3_64bits of those bytes
  // Not in the manifest: this Store has seen these bytes intact (hashed them when writing,
  // or verified a read). Reads skip the hash of such an extent under VerifyReads::once.
  bool seen_intact = false;
};

struct TensorRecord {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t size_bytes = 0;
  std::vector<Extent> extents;  // in tensor order
  bool committed = false;       // false: written since the last commit
};

// A pending read or write. Waited for exactly once.
struct StoreTicket {
  uint64_t value = 0;
};

struct StoreFileInfo {
  std::string path;
  uint64_t size_bytes = 0;
};

struct StoreStats {
  std::string dir;
  std::vector<StoreFileInfo> files;
  uint64_t stripe_bytes = 0;
  uint32_t alignment_bytes = 0;
  bool direct_io = false;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;            // committed and staged extents, rounded to the alignment
  uint64_t free_bytes = 0;
  uint64_t largest_free_bytes = 0;
  double fragmentation = 0.0;         // 1 − largest_free / free
  uint64_t committed_step = 0;
  uint64_t generation = 0;            // commits since the store was created
  uint64_t tensor_count = 0;          // visible tensors (committed or staged)
  uint64_t staged_tensor_count = 0;   // written or removed since the last commit
  uint64_t bytes_written = 0;         // tensor bytes since open
  uint64_t bytes_read = 0;
  uint64_t checksum_ns = 0;           // time spent hashing since open
  uint64_t bytes_read_trusted = 0;    // of bytes_read: not re-hashed (VerifyReads::once)
};

struct StoreDamage {
  std::string tensor;
  std::string path;               // file holding the extent's first byte
  uint64_t file_offset_bytes = 0;
  uint64_t logical_offset_bytes = 0;
  uint64_t length_bytes = 0;
  std::string what;               // "checksum mismatch: ..." or the I/O error
};

struct VerifyReport {
  uint64_t tensor_count = 0;
  uint64_t extent_count = 0;
  uint64_t bytes_checked = 0;
  std::vector<StoreDamage> damages;
  bool ok() const { return damages.empty(); }
};

class Store {
 public:
  // Creates `dir` (if needed) and its data files, preallocated to hold `capacity_bytes`;
  // `data_paths` empty means one file `dir/data.strata`. Writes the empty generation-0
  // manifest (step 0) before returning.
  [[nodiscard]] static Result<Store> create(const std::string& dir,
                                            const std::vector<std::string>& data_paths,
                                            uint64_t capacity_bytes, StoreOptions options);
  // Opens an existing store at its last committed version.
  [[nodiscard]] static Result<Store> open(const std::string& dir, StoreOptions options);

  Store(Store&&) noexcept;
  Store& operator=(Store&&) noexcept;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store();  // waits for anything still in flight; does not commit

  // Stages a new version of `name`: allocates fresh extents and submits their writes.
  // `size_bytes` must equal the product of `shape` times the dtype size. `no_space` when the
  // store is full (nothing staged then). A tensor written twice before a commit keeps only
  // the newer staged version: the older one is dropped when the new write starts, even if
  // the new one then fails (the committed version is never touched).
  [[nodiscard]] Result<StoreTicket> write_tensor_async(std::string_view name, DType dtype,
                                                       std::span<const int64_t> shape,
                                                       const void* data, uint64_t size_bytes);
  // Submits the reads of every extent of `name` into `data` (`capacity_bytes` ≥ its size).
  [[nodiscard]] Result<StoreTicket> read_tensor_async(std::string_view name, void* data,
                                                      uint64_t capacity_bytes);
  // Submits the read of one whole extent of `name` (`extent_index` into its record's extents,
  // `find(name)->extents`) into `data` (`capacity_bytes` ≥ that extent's length): a few rows of
  // a large tensor for the price of the extents that hold them, still verified by checksum.
  [[nodiscard]] Result<StoreTicket> read_extent_async(std::string_view name, size_t extent_index, void* data,
                                                      uint64_t capacity_bytes);
  // Completes a ticket: for a read, verifies every extent's checksum. A failed write
  // un-stages its tensor (the committed version stays visible).
  [[nodiscard]] Status wait(StoreTicket ticket);
  bool is_done(StoreTicket ticket);
  // Blocks until one more extent of the ticket's op has finished (then takes, without
  // blocking, any others that have), or until it is done; returns whether it is done — `wait`
  // then returns at once. Lets a thread that waits on one op notice other work between extents.
  bool wait_some(StoreTicket ticket);

  // Stages the removal of `name`; its extents are freed after the next commit.
  [[nodiscard]] Status remove_tensor(std::string_view name);
  // Makes every staged write and removal durable as one new version (see the contract).
  // On error nothing new is committed and the previous version stays the one on disk.
  [[nodiscard]] Status commit(uint64_t step, const std::map<std::string, std::string>& metadata);
  // commit() in two phases, for a job whose stores commit together (train/zero/zero.h): prepare
  // does everything up to a fsynced `manifest.json.tmp` (readers still see the old version);
  // finish renames it into place and frees the replaced extents. Nothing else may run between.
  [[nodiscard]] Status prepare_commit(uint64_t step, const std::map<std::string, std::string>& metadata);
  [[nodiscard]] Status finish_commit();
  // Before open (which discards it): the step of a prepared, unfinished commit in `dir`, if any;
  // and finishing it — what a job does when another of its stores already finished that step.
  [[nodiscard]] static Result<std::optional<uint64_t>> prepared_commit_step(const std::string& dir);
  [[nodiscard]] static Status roll_forward_prepared_commit(const std::string& dir);

  // Reads every committed extent and checks its checksum (uses its own aligned buffer).
  [[nodiscard]] Result<VerifyReport> verify();

  std::optional<TensorRecord> find(std::string_view name) const;  // newest visible version
  std::vector<TensorRecord> list() const;                         // visible tensors, by name
  uint64_t committed_step() const;
  const std::map<std::string, std::string>& committed_metadata() const;
  StoreStats stats() const;
  // Changes StoreOptions::verify_reads from the next read on (the C API's setter). What this
  // Store wrote is seen intact either way; reads verified under `always` were not marked.
  void set_verify_reads(VerifyReads mode);
  uint32_t alignment_bytes() const;
  // The store's engine: register the host arena with it (HostArena::register_with).
  io::Engine& engine();
  const std::string& dir() const;

 private:
  struct Impl;
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads just the manifest of `dir` (no data files opened): for tools.
[[nodiscard]] Result<std::string> read_manifest_text(const std::string& dir);

}  // namespace strata::memory
