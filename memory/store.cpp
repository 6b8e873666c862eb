// strata/memory/store.cpp — the NVMe store: extents, checksums, the versioned manifest.
#include "memory/store.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <numeric>
#include <unordered_map>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <xxhash.h>
// After xxhash.h: XXH3_64bits and XXH3_64bits_update become the runtime-dispatched versions.
#include <xxh_x86dispatch.h>

#include "common/size.h"
#include "memory/allocator.h"

namespace strata::memory {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormatName = "strata-store";
constexpr uint64_t kMinGranuleBytes = 4096;

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

std::string hex64(uint64_t value) { return fmt::format("{:016x}", value); }

// Saturates at UINT64_MAX (a negative or overflowing shape): that never equals a real size,
// so a tampered shape whose product would wrap cannot pass the size check.
uint64_t shape_elements(std::span<const int64_t> shape) {
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return UINT64_MAX;
    if (dim != 0 && count > UINT64_MAX / static_cast<uint64_t>(dim)) return UINT64_MAX;
    count *= static_cast<uint64_t>(dim);
  }
  return count;
}

// A small RAII fd for the manifest and the directory (data files are io::DirectFile).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

[[nodiscard]] Status fsync_dir(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return make_errno_error(errno, "open", dir.string());
  if (::fsync(fd.get()) != 0) return make_errno_error(errno, "fsync", dir.string());
  return Status();
}

// Writes `text` to `path` (0600), fsyncs it and closes it.
[[nodiscard]] Status write_file_durably(const fs::path& path, const std::string& text) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (fd.get() < 0) return make_errno_error(errno, "open", path.string());
  uint64_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_errno_error(errno, "write", path.string(), done, text.size() - done);
    }
    done += static_cast<uint64_t>(n);
  }
  if (::fsync(fd.get()) != 0) return make_errno_error(errno, "fsync", path.string());
  return Status();
}

// Reads a whole file of at most `max_bytes` (a regular file: a FIFO or device would block
// or never end); a larger one is refused before anything is read.
[[nodiscard]] Result<std::string> read_small_file(const fs::path& path, uint64_t max_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    Error error = make_errno_error(errno, "open", path.string());
    return error;
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) return make_errno_error(errno, "stat", path.string());
  if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) > max_bytes) {
    Error error = make_error(ErrorKind::corrupt,
                             S_ISREG(info.st_mode)
                                 ? "file is " + std::to_string(info.st_size) + " bytes, over the limit of " +
                                       std::to_string(max_bytes) + " for it"
                                 : std::string("not a regular file"));
    error.op = "open";
    error.path = path.string();
    return error;
  }
  std::string text;
  char chunk[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_errno_error(errno, "read", path.string(), text.size(), sizeof chunk);
    }
    if (n == 0) break;
    text.append(chunk, static_cast<size_t>(n));
    if (text.size() > max_bytes) {  // grew while being read
      Error error = make_error(ErrorKind::corrupt, "file grew past the limit of " + std::to_string(max_bytes));
      error.op = "read";
      error.path = path.string();
      return error;
    }
  }
  return text;
}

// The manifest's integer fields are read only when they are integers of the right sign:
// nlohmann's get<uint64_t>() / get<int64_t>() convert a floating-point number with a plain cast,
// undefined when it is out of range (clang's UBSan stopped the manifest fuzzer on 4.4e30), and
// a negative number wraps. load_manifest reports this as a corrupt manifest, like a type error.
struct ManifestFieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

uint64_t unsigned_at(const json& object, const char* key) {
  const json& value = object.at(key);
  if (!value.is_number_unsigned()) throw ManifestFieldError(std::string("'") + key + "' is not a non-negative integer");
  return value.get<uint64_t>();
}

std::vector<int64_t> integers_at(const json& object, const char* key) {
  const json& values = object.at(key);
  if (!values.is_array()) throw ManifestFieldError(std::string("'") + key + "' is not an array");
  std::vector<int64_t> out;
  for (const json& value : values) {
    if (!value.is_number_integer()) throw ManifestFieldError(std::string("'") + key + "' holds a non-integer");
    // An unsigned value past INT64_MAX would wrap: read it as negative's refusal does.
    if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX}) out.push_back(-1);
    else out.push_back(value.get<int64_t>());
  }
  return out;
}

Error corrupt_manifest(const fs::path& path, const std::string& why) {
  Error error = make_error(ErrorKind::corrupt,
                           "store manifest is unusable: " + why +
                               " — refusing to open the store (nothing was changed)");
  error.op = "open";
  error.path = path.string();
  return error;
}

}  // namespace

uint64_t extent_checksum(const void* data, uint64_t size_bytes) { return XXH3_64bits(data, size_bytes); }

const char* verify_reads_name(VerifyReads mode) { return mode == VerifyReads::once ? "once" : "always"; }

std::optional<VerifyReads> parse_verify_reads(std::string_view name) {
  if (name == "always") return VerifyReads::always;
  if (name == "once") return VerifyReads::once;
  return std::nullopt;
}

// ------------------------------------------------------------------------------------------

struct Store::Impl {
  struct Staged {
    std::optional<TensorRecord> record;  // nullopt: a staged removal
    uint64_t write_ticket = 0;           // nonzero while its write is in flight
  };
  // One tensor read or write: its extents go to the engine as separate requests, in
  // waves when the engine's request slots are scarce (see `advance`).
  struct PendingOp {
    bool is_write = false;
    std::string tensor;
    std::vector<Extent> extents;
    std::vector<uint64_t> extent_starts;     // offset of each extent in the caller's buffer
    std::vector<io::RequestId> request_ids;  // of the extents submitted so far
    std::byte* data = nullptr;               // the caller's buffer
    size_t next_wait = 0;                    // extents [0, next_wait) are complete
    bool submit_failed = false;
    bool done = false;
    Status status;                           // the first error
  };

  // A commit between prepare_commit and finish_commit: the version the renamed manifest names.
  struct PreparedCommit {
    std::map<std::string, TensorRecord, std::less<>> next;
    std::vector<Extent> to_free;
    uint64_t step = 0;
    std::map<std::string, std::string> metadata;
  };
  std::optional<PreparedCommit> prepared;

  fs::path dir;
  std::string dir_text;  // dir as a string, for dir()
  StoreOptions options;
  std::vector<std::string> manifest_paths;  // as written in the manifest
  std::unique_ptr<io::Volume> volume;
  std::unique_ptr<io::Engine> engine;
  std::unique_ptr<RangeAllocator> space;
  uint64_t capacity_bytes = 0;
  uint64_t granule_bytes = kMinGranuleBytes;

  uint64_t generation = 0;
  uint64_t step = 0;
  std::map<std::string, std::string> metadata;
  std::map<std::string, TensorRecord, std::less<>> committed;
  std::map<std::string, Staged, std::less<>> staged;

  uint64_t next_ticket = 1;
  std::map<uint64_t, PendingOp> ops;  // by ticket: oldest first
  uint32_t requests_in_flight = 0;     // submitted to the engine and not yet waited for
  uint32_t request_slots = 0;          // the engine's max_requests

  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t checksum_ns = 0;
  uint64_t bytes_read_trusted = 0;
  XXH3_state_t* hash_state = XXH3_createState();  // once per store, reused by every hash

  ~Impl() {
    // Buffers named by in-flight requests belong to callers who may free them right after
    // this; make sure the kernel is done with them first.
    if (engine != nullptr && !ops.empty()) (void)engine->wait_all();
    XXH3_freeState(hash_state);
  }

  // Lets the engine reap completions and issue the next pieces of any request in flight.
  // Without it the queue would drain while this thread hashes (uring completions are only
  // reaped when the owner thread calls into the engine).
  void poke_engine() {
    for (auto& [value, op] : ops) {
      if (op.next_wait < op.request_ids.size()) {
        (void)engine->is_done(op.request_ids[op.next_wait]);
        return;
      }
    }
  }

  // XXH3-64 of `length` bytes (the same value as one-shot XXH3_64bits), hashed in slices with
  // the engine kept busy in between, so hashing overlaps the disk instead of pausing it.
  uint64_t hash_overlapped(const std::byte* data, uint64_t length) {
    constexpr uint64_t kSliceBytes = 1 << 20;
    const uint64_t start = now_ns();
    uint64_t digest = 0;
    if (length <= kSliceBytes || hash_state == nullptr) {
      digest = extent_checksum(data, length);
    } else {
      XXH3_64bits_reset(hash_state);
      for (uint64_t done = 0; done < length; done += kSliceBytes) {
        XXH3_64bits_update(hash_state, data + done, std::min(kSliceBytes, length - done));
        poke_engine();
      }
      digest = XXH3_64bits_digest(hash_state);
    }
    checksum_ns += now_ns() - start;
    return digest;
  }

  fs::path manifest_path() const { return dir / kStoreManifestName; }

  // --- extents -------------------------------------------------------------------------
  void free_extents(const std::vector<Extent>& extents) {
    for (const Extent& extent : extents) {
      space->free(Block{extent.offset_bytes, align_up(extent.length_bytes, granule_bytes)});
    }
  }

  // Where the first byte of a logical range lives: (file path, file offset).
  std::pair<std::string, uint64_t> locate(uint64_t logical_offset_bytes, uint64_t length_bytes) const {
    std::vector<io::Volume::Piece> pieces;
    volume->split(logical_offset_bytes, std::max<uint64_t>(length_bytes, 1), pieces);
    assert(!pieces.empty());
    return {volume->file(pieces.front().file_index).path(), pieces.front().file_offset_bytes};
  }

  Error checksum_error(const std::string& tensor, const Extent& extent, uint64_t actual) const {
    auto [path, file_offset] = locate(extent.offset_bytes, extent.length_bytes);
    Error error = make_error(ErrorKind::corrupt,
                             "checksum mismatch: extent xxh3 should be " + hex64(extent.xxh3) +
                                 ", data hashes to " + hex64(actual));
    error.op = "verify";
    error.tensor = tensor;
    error.path = path;
    error.offset_bytes = file_offset;
    error.length_bytes = extent.length_bytes;
    error.has_range = true;
    return error;
  }

  // --- submitting and completing operations ----------------------------------------------
  // The engine holds a bounded number of requests (EngineConfig::max_requests). The store owns
  // its engine, so it counts its requests and never asks for a slot that is not free: an op
  // submits what fits and tops itself up as its own requests complete, and a new op that finds
  // no slot completes the oldest ops first. Large tensors thus keep the queue full without
  // ever failing for lack of slots.
  void submit_pending(PendingOp& op) {
    while (!op.submit_failed && op.request_ids.size() < op.extents.size() && requests_in_flight < request_slots) {
      const size_t i = op.request_ids.size();
      const Extent& extent = op.extents[i];
      Result<io::RequestId> id = engine->submit(op.is_write ? io::Op::write : io::Op::read, *volume,
                                                op.data + op.extent_starts[i], extent.length_bytes,
                                                extent.offset_bytes);
      if (!id.ok()) {
        op.submit_failed = true;
        if (op.status.ok()) {
          op.status = id.error();
          op.status.error().tensor = op.tensor;
        }
        return;
      }
      op.request_ids.push_back(*id);
      ++requests_in_flight;
    }
  }

  // Completes ops, oldest first, until a request slot is free.
  void make_room(uint64_t except_ticket) {
    while (requests_in_flight >= request_slots) {
      auto victim = std::find_if(ops.begin(), ops.end(), [&](const auto& entry) {
        return entry.first != except_ticket && entry.second.next_wait < entry.second.request_ids.size();
      });
      assert(victim != ops.end() && "request slots held by no operation");
      if (victim == ops.end()) return;
      advance(victim->first, victim->second, Blocking::all);
    }
  }

  // How long `advance` may block: not at all, for one extent (then only what has finished), or
  // until the op is done.
  enum class Blocking { none, one_extent, all };

  // Moves an op forward: waits its requests in extent order, hashing each read extent while
  // later ones are still in flight. Returns whether the op is done.
  bool advance(uint64_t ticket_value, PendingOp& op, Blocking blocking) {
    bool blocked = false;  // Blocking::one_extent has used its one wait
    auto may_block = [&] { return blocking == Blocking::all || (blocking == Blocking::one_extent && !blocked); };
    while (!op.done && op.next_wait < op.extents.size()) {
      if (op.next_wait == op.request_ids.size()) {
        if (op.submit_failed) break;
        if (!may_block()) return false;
        blocked = true;
        make_room(ticket_value);
        submit_pending(op);
        if (op.next_wait == op.request_ids.size()) break;  // the submit failed
      }
      const size_t i = op.next_wait;
      if (blocking != Blocking::all && !engine->is_done(op.request_ids[i])) {
        if (!may_block()) return false;
        blocked = true;
      }
      Status status = engine->wait(op.request_ids[i]);
      --requests_in_flight;
      ++op.next_wait;
      submit_pending(op);
      const Extent& extent = op.extents[i];
      if (!status.ok()) {
        if (op.status.ok()) {
          op.status = status;
          op.status.error().tensor = op.tensor;
        }
        continue;
      }
      if (op.is_write) {
        bytes_written += extent.length_bytes;
        continue;
      }
      bytes_read += extent.length_bytes;
      if (options.verify_reads == VerifyReads::once && extent.seen_intact) {
        bytes_read_trusted += extent.length_bytes;
        continue;
      }
      const uint64_t actual = hash_overlapped(op.data + op.extent_starts[i], extent.length_bytes);
      if (actual != extent.xxh3) {
        if (op.status.ok()) op.status = checksum_error(op.tensor, extent, actual);
      } else if (options.verify_reads == VerifyReads::once) {
        mark_seen_intact(op.tensor, extent);
      }
    }
    if (!op.done) {
      // Requests of a failed submit that were never issued leave nothing to wait for.
      assert(op.next_wait == op.request_ids.size());
      op.done = true;
      if (op.is_write) finish_write(ticket_value, op);
    }
    return true;
  }

  // After a verified read: the visible record's extent, if it is still the one read (same
  // place, same sum), need not be hashed again under VerifyReads::once. A commit in progress
  // holds its own copy of the records; a mark missed there only costs one more hash.
  void mark_seen_intact(const std::string& tensor, const Extent& read) {
    auto mark = [&](TensorRecord& record) {
      for (Extent& extent : record.extents)
        if (extent.offset_bytes == read.offset_bytes && extent.xxh3 == read.xxh3) extent.seen_intact = true;
    };
    if (auto s = staged.find(tensor); s != staged.end()) {
      if (s->second.record) mark(*s->second.record);
      return;
    }
    if (auto c = committed.find(tensor); c != committed.end()) mark(c->second);
  }

  void finish_write(uint64_t ticket_value, const PendingOp& op) {
    auto it = staged.find(op.tensor);
    if (it == staged.end() || it->second.write_ticket != ticket_value) return;
    it->second.write_ticket = 0;
    if (!op.status.ok()) {
      // The new version never fully reached the disk: forget it, the committed version (if
      // any) is visible again.
      free_extents(it->second.record->extents);
      staged.erase(it);
    }
  }

  void complete(uint64_t ticket_value, PendingOp& op) { advance(ticket_value, op, Blocking::all); }

  void complete_all() {
    for (auto& [value, op] : ops) complete(value, op);
  }

  // Completes in-flight operations on `tensor` (its extents are about to be freed or read).
  void complete_for(std::string_view tensor) {
    for (auto& [value, op] : ops) {
      if (op.tensor == tensor) complete(value, op);
    }
  }

  // Registers and starts an op; returns its ticket.
  uint64_t start(PendingOp op) {
    uint64_t offset = 0;
    for (const Extent& extent : op.extents) {
      op.extent_starts.push_back(offset);
      offset += extent.length_bytes;
    }
    op.request_ids.reserve(op.extents.size());
    const uint64_t ticket = next_ticket++;
    make_room(ticket);
    PendingOp& stored = ops.emplace(ticket, std::move(op)).first->second;
    submit_pending(stored);
    return ticket;
  }

  // Read-your-writes: a staged version still being written is completed first. Null: no
  // such tensor.
  const TensorRecord* readable(std::string_view name) {
    if (auto it = staged.find(name); it != staged.end() && it->second.write_ticket != 0) {
      complete(it->second.write_ticket, ops.at(it->second.write_ticket));
    }
    return visible(name);
  }

  Error not_found(std::string_view name, std::string what) const {
    Error error = make_error(ErrorKind::not_found, std::move(what));
    error.tensor = std::string(name);
    error.path = dir.string();
    return error;
  }

  // Submits the reads of `extents` (all of `record`'s, or one) into `data`, back to back.
  uint64_t start_read(const TensorRecord& record, std::vector<Extent> extents, void* data) {
    PendingOp op;
    op.is_write = false;
    op.tensor = record.name;
    op.data = static_cast<std::byte*>(data);
    op.extents = std::move(extents);
    return start(std::move(op));
  }

  const TensorRecord* visible(std::string_view name) const {
    auto s = staged.find(name);
    if (s != staged.end()) return s->second.record ? &*s->second.record : nullptr;
    auto c = committed.find(name);
    return c != committed.end() ? &c->second : nullptr;
  }

  // --- manifest ------------------------------------------------------------------------
  json manifest_json(uint64_t new_generation, uint64_t new_step,
                     const std::map<std::string, std::string>& new_metadata,
                     const std::map<std::string, TensorRecord, std::less<>>& tensors) const {
    json files = json::array();
    for (const std::string& path : manifest_paths) files.push_back(path);
    json tensor_map = json::object();
    for (const auto& [name, record] : tensors) {
      json extents = json::array();
      for (const Extent& extent : record.extents) {
        extents.push_back({{"offset", extent.offset_bytes},
                           {"length", extent.length_bytes},
                           {"xxh3", hex64(extent.xxh3)}});
      }
      tensor_map[name] = {{"dtype", dtype_name(record.dtype)},
                          {"shape", record.shape},
                          {"size_bytes", record.size_bytes},
                          {"extents", std::move(extents)}};
    }
    return json{{"format", kFormatName},
                {"format_version", kStoreFormatVersion},
                {"generation", new_generation},
                {"step", new_step},
                {"capacity_bytes", capacity_bytes},
                {"granule_bytes", granule_bytes},
                {"stripe_bytes", volume->stripe_bytes()},
                {"files", std::move(files)},
                {"metadata", new_metadata},
                {"tensors", std::move(tensor_map)}};
  }

  // tmp file → fsync → rename → fsync dir: after this returns ok the new manifest is the one
  // any reader (or a restart after a crash) sees.
  [[nodiscard]] Status publish_manifest(const json& manifest) const {
    const fs::path temp = dir / kStoreManifestTempName;
    STRATA_RETURN_IF_ERROR(write_file_durably(temp, manifest.dump(1) + "\n"));
    if (::rename(temp.c_str(), manifest_path().c_str()) != 0) {
      return make_errno_error(errno, "rename", manifest_path().string());
    }
    return fsync_dir(dir);
  }

  // Where a data file the manifest names lives. The manifest is untrusted: a plain name is a
  // file in the store folder; an absolute path must be normalized and, for a writable open,
  // one the caller's configuration names; either must already be a regular file. Anything
  // else (a '/' or '..' in a relative name, a symlink to a device...) is refused.
  [[nodiscard]] Result<std::string> resolve_data_path(const std::string& named) const {
    const fs::path path(named);
    fs::path resolved;
    if (path.is_absolute()) {
      if (path.lexically_normal() != path || !path.has_filename())
        return corrupt_manifest(manifest_path(), "data file '" + named + "' is not a normalized absolute path");
      if (!options.read_only) {
        bool listed = false;
        for (const std::string& allowed : options.external_data_paths)
          listed = listed || fs::absolute(allowed).lexically_normal() == path;
        if (!listed)
          return corrupt_manifest(manifest_path(), "data file '" + named +
                                                       "' lies outside the store folder and is not one of the "
                                                       "configured data paths");
      }
      resolved = path;
    } else {
      if (named.empty() || named.find('/') != std::string::npos || named == "." || named == "..")
        return corrupt_manifest(manifest_path(), "data file '" + named + "' is not a plain file name in the store folder");
      resolved = dir / path;
    }
    struct stat info {};
    if (::stat(resolved.c_str(), &info) == 0 && !S_ISREG(info.st_mode))
      return corrupt_manifest(manifest_path(), "data file '" + resolved.string() + "' is not a regular file");
    return resolved.string();
  }

  // Parses and validates a manifest; fills this Impl's committed state. Writes nothing.
  [[nodiscard]] Status load_manifest(const std::string& text, std::vector<std::string>& data_paths,
                                     uint64_t& stripe_bytes) {
    const fs::path path = manifest_path();
    json manifest = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (manifest.is_discarded()) return corrupt_manifest(path, "it is not valid JSON (truncated or garbled?)");
    try {
      if (!manifest.is_object() || manifest.value("format", std::string()) != kFormatName) {
        return corrupt_manifest(path, std::string("it is not a strata store manifest (no \"format\": \"") +
                                          kFormatName + "\")");
      }
      const uint64_t version = unsigned_at(manifest, "format_version");
      if (version != static_cast<uint64_t>(kStoreFormatVersion)) {
        Error error = corrupt_manifest(
            path, "it has store format version " + std::to_string(version) +
                      " and this strata reads version " + std::to_string(kStoreFormatVersion));
        error.kind = ErrorKind::unsupported;
        return error;
      }
      generation = unsigned_at(manifest, "generation");
      step = unsigned_at(manifest, "step");
      capacity_bytes = unsigned_at(manifest, "capacity_bytes");
      granule_bytes = unsigned_at(manifest, "granule_bytes");
      stripe_bytes = unsigned_at(manifest, "stripe_bytes");
      if (!is_power_of_two(granule_bytes) || capacity_bytes == 0 || capacity_bytes % granule_bytes != 0) {
        return corrupt_manifest(path, "its geometry (capacity " + std::to_string(capacity_bytes) +
                                          ", granule " + std::to_string(granule_bytes) + ") is invalid");
      }
      data_paths = manifest.at("files").get<std::vector<std::string>>();
      if (data_paths.empty()) return corrupt_manifest(path, "it names no data files");
      metadata = manifest.at("metadata").get<std::map<std::string, std::string>>();
      for (const auto& [name, entry] : manifest.at("tensors").items()) {
        TensorRecord record;
        record.name = name;
        record.committed = true;
        Result<DType> dtype = parse_dtype(entry.at("dtype").get<std::string>());
        if (!dtype.ok()) return corrupt_manifest(path, "tensor '" + name + "': " + dtype.error().message);
        record.dtype = *dtype;
        record.shape = integers_at(entry, "shape");
        record.size_bytes = unsigned_at(entry, "size_bytes");
        for (int64_t dim : record.shape) {
          if (dim < 0) return corrupt_manifest(path, "tensor '" + name + "' has a negative dimension");
        }
        const uint64_t elements = shape_elements(record.shape);
        if (elements > UINT64_MAX / 4 || elements * dtype_size_bytes(record.dtype) != record.size_bytes) {
          return corrupt_manifest(path, "tensor '" + name + "': size does not match dtype and shape");
        }
        uint64_t total = 0;
        for (const json& e : entry.at("extents")) {
          Extent extent;
          extent.offset_bytes = unsigned_at(e, "offset");
          extent.length_bytes = unsigned_at(e, "length");
          const std::string sum = e.at("xxh3").get<std::string>();
          char* end = nullptr;
          extent.xxh3 = std::strtoull(sum.c_str(), &end, 16);
          if (sum.size() != 16 || end != sum.c_str() + 16) {
            return corrupt_manifest(path, "tensor '" + name + "' has a malformed checksum '" + sum + "'");
          }
          if (extent.length_bytes == 0) return corrupt_manifest(path, "tensor '" + name + "' has an empty extent");
          if (extent.length_bytes > capacity_bytes || extent.offset_bytes > capacity_bytes - extent.length_bytes)
            return corrupt_manifest(path, "tensor '" + name + "' has an extent outside the store's capacity");
          total += extent.length_bytes;
          record.extents.push_back(extent);
        }
        if (total != record.size_bytes) {
          return corrupt_manifest(path, "tensor '" + name + "': extents hold " + std::to_string(total) +
                                            " bytes, size says " + std::to_string(record.size_bytes));
        }
        committed.emplace(name, std::move(record));
      }
    } catch (const json::exception& e) {
      return corrupt_manifest(path, std::string("a field is missing or has the wrong type: ") + e.what());
    } catch (const ManifestFieldError& e) {
      return corrupt_manifest(path, std::string("a field has the wrong type: ") + e.what());
    }
    return Status();
  }

  // Rebuilds free space: everything the committed manifest does not name is free.
  [[nodiscard]] Status rebuild_space() {
    space = std::make_unique<RangeAllocator>(capacity_bytes, granule_bytes);
    for (const auto& [name, record] : committed) {
      for (const Extent& extent : record.extents) {
        Result<Block> block = space->reserve(extent.offset_bytes, extent.length_bytes);
        if (!block.ok()) {
          return corrupt_manifest(manifest_path(), "tensor '" + name + "': " + block.error().message);
        }
      }
    }
    return Status();
  }

  [[nodiscard]] Status make_engine() {
    Result<std::unique_ptr<io::Engine>> made =
        options.engine_factory ? options.engine_factory(options.engine) : io::make_engine(options.engine);
    if (!made.ok()) return made.error();
    engine = std::move(made).value();
    request_slots = std::max<uint32_t>(1, engine->config().max_requests);
    return Status();
  }
};

// ------------------------------------------------------------------------------------------

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::Store(Store&&) noexcept = default;
Store& Store::operator=(Store&&) noexcept = default;
Store::~Store() = default;

Result<Store> Store::create(const std::string& dir, const std::vector<std::string>& data_paths,
                            uint64_t capacity_bytes, StoreOptions options) {
  assert(!options.read_only);
  auto impl = std::make_unique<Impl>();
  impl->dir = fs::absolute(dir);
  impl->dir_text = impl->dir.string();
  impl->options = std::move(options);
  if (capacity_bytes == 0) return make_error(ErrorKind::invalid_argument, "store capacity must be more than 0 bytes");
  if (impl->options.max_extent_bytes < kMinGranuleBytes) {
    return make_error(ErrorKind::invalid_argument, "max_extent_bytes must be at least 4 KiB");
  }

  std::error_code ec;
  if (fs::exists(impl->manifest_path(), ec)) {
    Error error = make_error(ErrorKind::invalid_argument,
                             "a store already exists here; open it instead (nothing was changed)");
    error.op = "create";
    error.path = impl->manifest_path().string();
    return error;
  }
  fs::create_directories(impl->dir, ec);
  if (ec) return make_errno_error(ec.value(), "mkdir", impl->dir.string());

  std::vector<std::string> paths;
  if (data_paths.empty()) {
    paths.push_back((impl->dir / kStoreDefaultDataName).string());
    impl->manifest_paths.push_back(kStoreDefaultDataName);
  } else {
    for (const std::string& path : data_paths) {
      // Normalized as the manifest's contract wants it (resolve_data_path): a caller's
      // "/run/configs/../data/strata.data" would otherwise make a store that open refuses.
      const fs::path absolute = fs::absolute(path).lexically_normal();
      paths.push_back(absolute.string());
      // Files inside the store directory are named relative to it, so the directory can move.
      impl->manifest_paths.push_back(absolute.parent_path() == impl->dir ? absolute.filename().string()
                                                                          : absolute.string());
    }
  }
  for (const std::string& path : paths) {
    if (fs::exists(path, ec)) {
      Error error = make_error(ErrorKind::invalid_argument,
                               "data file already exists; a store never overwrites one (nothing was changed)");
      error.op = "create";
      error.path = path;
      return error;
    }
  }

  // From here on, undo what was created if a step fails.
  auto remove_created = [&paths] {
    std::error_code ignored;
    for (const std::string& path : paths) fs::remove(path, ignored);
  };
  io::OpenOptions open_options;
  open_options.create = true;
  open_options.allow_buffered_fallback = impl->options.allow_buffered_fallback;
  Result<io::Volume> volume = io::Volume::open(paths, impl->options.stripe_bytes, open_options);
  if (!volume.ok()) {
    remove_created();
    return volume.error();
  }
  impl->volume = std::make_unique<io::Volume>(std::move(volume).value());
  impl->granule_bytes = std::max<uint64_t>(kMinGranuleBytes, impl->volume->alignment_bytes());
  uint64_t round_bytes = impl->granule_bytes;
  if (paths.size() > 1) round_bytes = std::lcm(round_bytes, impl->options.stripe_bytes * paths.size());
  impl->capacity_bytes = align_up(capacity_bytes, round_bytes);

  Status status = impl->volume->preallocate(impl->capacity_bytes);
  if (status.ok()) status = impl->volume->sync();
  for (size_t i = 0; status.ok() && i < paths.size(); ++i) status = fsync_dir(fs::path(paths[i]).parent_path());
  if (status.ok()) status = impl->make_engine();
  if (status.ok()) {
    impl->space = std::make_unique<RangeAllocator>(impl->capacity_bytes, impl->granule_bytes);
    status = impl->publish_manifest(impl->manifest_json(0, 0, {}, {}));
  }
  if (!status.ok()) {
    impl->volume.reset();
    remove_created();
    std::error_code ignored;
    fs::remove(impl->dir / kStoreManifestTempName, ignored);
    return status.error();
  }
  return Store(std::move(impl));
}

Result<Store> Store::open(const std::string& dir, StoreOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->dir = fs::absolute(dir);
  impl->dir_text = impl->dir.string();
  impl->options = std::move(options);
  Result<std::string> text = read_small_file(impl->manifest_path(), kMaxManifestBytes);
  if (!text.ok()) {
    Error error = text.error();
    if (error.errno_value == ENOENT) {
      error.kind = ErrorKind::not_found;
      error.message = "no store here (manifest.json is missing)";
    } else if (error.kind == ErrorKind::corrupt) {
      return corrupt_manifest(impl->manifest_path(), error.message);
    }
    return error;
  }
  std::vector<std::string> manifest_paths;
  uint64_t stripe_bytes = 0;
  STRATA_RETURN_IF_ERROR(impl->load_manifest(*text, manifest_paths, stripe_bytes));
  impl->manifest_paths = manifest_paths;

  std::vector<std::string> paths;
  for (const std::string& path : manifest_paths) {
    Result<std::string> resolved = impl->resolve_data_path(path);
    if (!resolved.ok()) return resolved.error();
    paths.push_back(*resolved);
  }
  io::OpenOptions open_options;
  open_options.create = false;
  open_options.read_only = impl->options.read_only;
  open_options.allow_buffered_fallback = impl->options.allow_buffered_fallback;
  Result<io::Volume> volume = io::Volume::open(paths, stripe_bytes, open_options);
  if (!volume.ok()) {
    Error error = volume.error();
    error.message = "cannot open a data file of the store: " + error.message;
    return error;
  }
  impl->volume = std::make_unique<io::Volume>(std::move(volume).value());
  STRATA_ASSIGN_OR_RETURN(uint64_t volume_bytes, impl->volume->size_bytes());
  if (volume_bytes < impl->capacity_bytes) {
    Error error = make_error(ErrorKind::corrupt,
                             "data files hold " + std::to_string(volume_bytes) + " bytes but the manifest says " +
                                 std::to_string(impl->capacity_bytes) +
                                 " (truncated data file?) — refusing to open the store (nothing was changed)");
    error.op = "open";
    error.path = impl->volume->describe();
    return error;
  }
  STRATA_RETURN_IF_ERROR(impl->rebuild_space());
  STRATA_RETURN_IF_ERROR(impl->make_engine());
  if (!impl->options.read_only) {
    // A temp manifest is a commit that never got renamed into place: it is not the store's
    // state, and the next commit overwrites it anyway.
    std::error_code ignored;
    fs::remove(impl->dir / kStoreManifestTempName, ignored);
  }
  return Store(std::move(impl));
}

Result<StoreTicket> Store::write_tensor_async(std::string_view name, DType dtype,
                                              std::span<const int64_t> shape, const void* data,
                                              uint64_t size_bytes) {
  Impl& s = *impl_;
  assert(!s.options.read_only && "write to a store opened read-only");
  if (name.empty()) return make_error(ErrorKind::invalid_argument, "a tensor needs a name");
  for (int64_t dim : shape) {
    if (dim < 0) return make_error(ErrorKind::invalid_argument, "tensor '" + std::string(name) + "' has a negative dimension");
  }
  const uint64_t elements = shape_elements(shape);
  if (elements > UINT64_MAX / 4 || elements * dtype_size_bytes(dtype) != size_bytes || size_bytes == 0) {
    return make_error(ErrorKind::invalid_argument,
                      "tensor '" + std::string(name) + "': " + std::to_string(size_bytes) +
                          " bytes do not match its dtype and shape (or are 0)");
  }

  // A staged version this write replaces was never committed: its extents can go now —
  // after anything still reading or writing them is done.
  s.complete_for(name);
  if (auto it = s.staged.find(name); it != s.staged.end()) {
    if (it->second.record) s.free_extents(it->second.record->extents);
    s.staged.erase(it);
  }

  // Fresh extents, never the committed ones: the committed version must survive a crash.
  TensorRecord record;
  record.name = std::string(name);
  record.dtype = dtype;
  record.shape.assign(shape.begin(), shape.end());
  record.size_bytes = size_bytes;
  const uint64_t max_extent = align_down(s.options.max_extent_bytes, s.granule_bytes);
  for (uint64_t done = 0; done < size_bytes;) {
    uint64_t length = std::min(max_extent, size_bytes - done);
    Result<Block> block = s.space->allocate(length);
    if (!block.ok()) {
      // Free space shattered into holes smaller than an extent: a shorter extent in the
      // largest hole still makes progress. Only when the space itself runs out is it full.
      const uint64_t largest_free_bytes = s.space->stats().largest_free_bytes;
      if (largest_free_bytes > 0 && largest_free_bytes < length) {
        length = largest_free_bytes;
        block = s.space->allocate(length);
      }
    }
    if (!block.ok()) {
      s.free_extents(record.extents);
      Error error = block.error();
      error.message = "store is full: " + error.message;
      error.tensor = record.name;
      error.op = "write";
      error.path = s.volume->describe();
      return error;
    }
    record.extents.push_back(Extent{block->offset_bytes, length, 0});
    done += length;
  }

  Impl::PendingOp op;
  op.is_write = true;
  op.tensor = record.name;
  op.data = const_cast<std::byte*>(static_cast<const std::byte*>(data));  // only read from
  op.extents = record.extents;
  const uint64_t ticket = s.next_ticket;  // what start() will hand out
  std::string name_key = record.name;
  TensorRecord& staged = *(s.staged[name_key] = Impl::Staged{std::move(record), ticket}).record;
  const uint64_t started = s.start(std::move(op));
  assert(started == ticket);
  (void)started;
  // Hash while the writes are in flight (the buffer may not change until wait, so the disk
  // and the hash see the same bytes); the staged record is complete when this call returns.
  const std::byte* bytes = static_cast<const std::byte*>(data);
  uint64_t offset_in_tensor = 0;
  for (Extent& extent : staged.extents) {
    extent.xxh3 = s.hash_overlapped(bytes + offset_in_tensor, extent.length_bytes);
    extent.seen_intact = true;  // hashed from the caller's memory, the bytes the disk gets
    offset_in_tensor += extent.length_bytes;
  }
  return StoreTicket{ticket};
}

Result<StoreTicket> Store::read_tensor_async(std::string_view name, void* data, uint64_t capacity_bytes) {
  Impl& s = *impl_;
  const TensorRecord* record = s.readable(name);
  if (record == nullptr) return s.not_found(name, "no such tensor in the store");
  if (capacity_bytes < record->size_bytes) {
    return make_error(ErrorKind::invalid_argument,
                      "tensor '" + record->name + "' needs " + std::to_string(record->size_bytes) +
                          " bytes, the buffer holds " + std::to_string(capacity_bytes));
  }
  return StoreTicket{s.start_read(*record, record->extents, data)};
}

Result<StoreTicket> Store::read_extent_async(std::string_view name, size_t extent_index, void* data,
                                             uint64_t capacity_bytes) {
  Impl& s = *impl_;
  const TensorRecord* record = s.readable(name);
  if (record == nullptr) return s.not_found(name, "no such tensor in the store");
  if (extent_index >= record->extents.size())
    return s.not_found(name, "tensor has no extent " + std::to_string(extent_index));
  const Extent& extent = record->extents[extent_index];
  if (capacity_bytes < extent.length_bytes) {
    return make_error(ErrorKind::invalid_argument,
                      "extent " + std::to_string(extent_index) + " of tensor '" + record->name + "' needs " +
                          std::to_string(extent.length_bytes) + " bytes, the buffer holds " +
                          std::to_string(capacity_bytes));
  }
  return StoreTicket{s.start_read(*record, {extent}, data)};
}

Status Store::wait(StoreTicket ticket) {
  Impl& s = *impl_;
  auto it = s.ops.find(ticket.value);
  assert(it != s.ops.end() && "wait on an unknown or already waited ticket");
  if (it == s.ops.end()) return make_error(ErrorKind::internal, "unknown store ticket");
  s.complete(it->first, it->second);
  Status status = std::move(it->second.status);
  s.ops.erase(it);
  return status;
}

bool Store::is_done(StoreTicket ticket) {
  Impl& s = *impl_;
  auto it = s.ops.find(ticket.value);
  assert(it != s.ops.end());
  return s.advance(it->first, it->second, Impl::Blocking::none);
}

bool Store::wait_some(StoreTicket ticket) {
  Impl& s = *impl_;
  auto it = s.ops.find(ticket.value);
  assert(it != s.ops.end());
  return s.advance(it->first, it->second, Impl::Blocking::one_extent);
}

Status Store::remove_tensor(std::string_view name) {
  Impl& s = *impl_;
  assert(!s.options.read_only);
  s.complete_for(name);
  const bool is_committed = s.committed.find(name) != s.committed.end();
  auto it = s.staged.find(name);
  const bool has_staged_version = it != s.staged.end() && it->second.record.has_value();
  if (!is_committed && !has_staged_version) return s.not_found(name, "no such tensor in the store");
  // A staged version was never committed: its space is free at once.
  if (has_staged_version) {
    s.free_extents(it->second.record->extents);
    s.staged.erase(it);
  }
  // The committed version stays readable on disk until the removal is committed.
  if (is_committed) s.staged[std::string(name)] = Impl::Staged{std::nullopt, 0};
  return Status();
}

Status Store::commit(uint64_t step, const std::map<std::string, std::string>& metadata) {
  STRATA_RETURN_IF_ERROR(prepare_commit(step, metadata));
  return finish_commit();
}

Status Store::prepare_commit(uint64_t step, const std::map<std::string, std::string>& metadata) {
  Impl& s = *impl_;
  assert(!s.options.read_only);
  // Every staged write must be complete before the data is synced; a write that fails here
  // fails the commit (the caller decides to rewrite it or to commit without it).
  Status failed_write;
  for (auto& [value, op] : s.ops) {
    if (!op.is_write || op.done) continue;
    s.complete(value, op);
    if (!op.status.ok() && failed_write.ok()) failed_write = op.status;
  }
  if (!failed_write.ok()) return failed_write;
  // Reads of extents this commit frees must be finished too.
  s.complete_all();

  STRATA_RETURN_IF_ERROR(s.volume->sync());

  std::map<std::string, TensorRecord, std::less<>> next = s.committed;
  std::vector<Extent> to_free;
  for (auto& [name, staged] : s.staged) {
    auto old = next.find(name);
    if (old != next.end()) {
      to_free.insert(to_free.end(), old->second.extents.begin(), old->second.extents.end());
      next.erase(old);
    }
    if (staged.record) {
      TensorRecord record = *staged.record;
      record.committed = true;
      next.emplace(name, std::move(record));
    }
  }
  // Until finish_commit has renamed it into place, nothing is freed and nothing changes in
  // memory: both versions stay allocated and a retried commit starts over.
  const fs::path temp = s.dir / kStoreManifestTempName;
  STRATA_RETURN_IF_ERROR(write_file_durably(temp, s.manifest_json(s.generation + 1, step, metadata, next).dump(1) + "\n"));
  s.prepared = Impl::PreparedCommit{std::move(next), std::move(to_free), step, metadata};
  return Status();
}

Status Store::finish_commit() {
  Impl& s = *impl_;
  assert(s.prepared.has_value());
  const fs::path temp = s.dir / kStoreManifestTempName;
  if (::rename(temp.c_str(), s.manifest_path().c_str()) != 0) return make_errno_error(errno, "rename", s.manifest_path().string());
  STRATA_RETURN_IF_ERROR(fsync_dir(s.dir));
  Impl::PreparedCommit prepared = std::move(*s.prepared);
  s.prepared.reset();
  s.free_extents(prepared.to_free);
  s.committed = std::move(prepared.next);
  s.staged.clear();
  s.generation += 1;
  s.step = prepared.step;
  s.metadata = std::move(prepared.metadata);
  return Status();
}

Result<std::optional<uint64_t>> Store::prepared_commit_step(const std::string& dir) {
  const fs::path temp = fs::path(dir) / kStoreManifestTempName;
  std::error_code error;
  if (!fs::exists(temp, error)) return std::optional<uint64_t>();
  std::ifstream in(temp);
  std::stringstream text;
  text << in.rdbuf();
  // A prepared manifest was fsynced whole before any rank went on (prepare_commit); one that
  // does not parse was being written when the process died: it was never prepared.
  json manifest = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || !manifest.contains("step") || !manifest["step"].is_number_unsigned())
    return std::optional<uint64_t>();
  return std::optional<uint64_t>(manifest["step"].get<uint64_t>());
}

Status Store::roll_forward_prepared_commit(const std::string& dir) {
  const fs::path temp = fs::path(dir) / kStoreManifestTempName;
  const fs::path manifest = fs::path(dir) / kStoreManifestName;
  if (::rename(temp.c_str(), manifest.c_str()) != 0) return make_errno_error(errno, "rename", manifest.string());
  return fsync_dir(fs::path(dir));
}

Result<VerifyReport> Store::verify() {
  Impl& s = *impl_;
  s.complete_all();
  VerifyReport report;
  uint64_t largest = 0;
  for (const auto& [name, record] : s.committed) {
    for (const Extent& extent : record.extents) largest = std::max(largest, extent.length_bytes);
  }
  if (largest == 0) return report;
  const uint64_t buffer_bytes = align_up(largest, s.granule_bytes);
  std::byte* buffer = static_cast<std::byte*>(std::aligned_alloc(s.granule_bytes, buffer_bytes));
  if (buffer == nullptr) return make_error(ErrorKind::no_space, "verify: cannot allocate a read buffer");
  std::unique_ptr<std::byte, decltype(&std::free)> owner(buffer, &std::free);

  for (const auto& [name, record] : s.committed) {
    ++report.tensor_count;
    for (const Extent& extent : record.extents) {
      ++report.extent_count;
      auto [path, file_offset] = s.locate(extent.offset_bytes, extent.length_bytes);
      StoreDamage damage{name, path, file_offset, extent.offset_bytes, extent.length_bytes, ""};
      // Read the whole reservation: aligned, so it takes the direct path.
      Status status = io::read_exact(*s.engine, *s.volume, buffer, align_up(extent.length_bytes, s.granule_bytes),
                                     extent.offset_bytes);
      if (!status.ok()) {
        damage.what = status.to_string();
        report.damages.push_back(std::move(damage));
        continue;
      }
      const uint64_t actual = extent_checksum(buffer, extent.length_bytes);
      report.bytes_checked += extent.length_bytes;
      if (actual != extent.xxh3) {
        damage.what = "checksum mismatch: extent xxh3 should be " + hex64(extent.xxh3) +
                      ", data hashes to " + hex64(actual);
        report.damages.push_back(std::move(damage));
      }
    }
  }
  return report;
}

std::optional<TensorRecord> Store::find(std::string_view name) const {
  const TensorRecord* record = impl_->visible(name);
  if (record == nullptr) return std::nullopt;
  return *record;
}

std::vector<TensorRecord> Store::list() const {
  const Impl& s = *impl_;
  std::vector<TensorRecord> out;
  for (const auto& [name, record] : s.committed) {
    if (s.staged.count(name) == 0) out.push_back(record);
  }
  for (const auto& [name, staged] : s.staged) {
    if (staged.record) out.push_back(*staged.record);
  }
  std::sort(out.begin(), out.end(), [](const TensorRecord& a, const TensorRecord& b) { return a.name < b.name; });
  return out;
}

uint64_t Store::committed_step() const { return impl_->step; }
const std::map<std::string, std::string>& Store::committed_metadata() const { return impl_->metadata; }
uint32_t Store::alignment_bytes() const { return static_cast<uint32_t>(impl_->granule_bytes); }
io::Engine& Store::engine() { return *impl_->engine; }
const std::string& Store::dir() const { return impl_->dir_text; }

void Store::set_verify_reads(VerifyReads mode) { impl_->options.verify_reads = mode; }

StoreStats Store::stats() const {
  const Impl& s = *impl_;
  StoreStats stats;
  stats.dir = s.dir.string();
  for (size_t i = 0; i < s.volume->file_count(); ++i) {
    const io::DirectFile& file = s.volume->file(i);
    Result<uint64_t> size = file.size_bytes();
    stats.files.push_back(StoreFileInfo{file.path(), size.ok() ? *size : 0});
  }
  stats.stripe_bytes = s.volume->stripe_bytes();
  stats.alignment_bytes = static_cast<uint32_t>(s.granule_bytes);
  stats.direct_io = s.volume->is_direct();
  const AllocatorStats space = s.space->stats();
  stats.capacity_bytes = space.capacity_bytes;
  stats.used_bytes = space.used_bytes;
  stats.free_bytes = space.free_bytes;
  stats.largest_free_bytes = space.largest_free_bytes;
  stats.fragmentation = space.fragmentation;
  stats.committed_step = s.step;
  stats.generation = s.generation;
  stats.tensor_count = list().size();
  stats.staged_tensor_count = s.staged.size();
  stats.bytes_written = s.bytes_written;
  stats.bytes_read = s.bytes_read;
  stats.checksum_ns = s.checksum_ns;
  stats.bytes_read_trusted = s.bytes_read_trusted;
  return stats;
}

Result<std::string> read_manifest_text(const std::string& dir) {
  return read_small_file(fs::path(dir) / kStoreManifestName, kMaxManifestBytes);
}

}  // namespace strata::memory
