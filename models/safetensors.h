// strata/models/safetensors.h — reading and writing the safetensors format.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the
// tensor bytes. The reader maps nothing: it parses the header and reads one tensor at a
// time (pread), so a 6 GB checkpoint is never loaded whole. The writer streams tensors in
// the order they were declared and writes to "FILE.tmp" then renames, so a failed export
// never leaves a half-written file under the final name.
// Not thread-safe; one reader or writer per thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace strata {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin_bytes = 0;  // relative to the start of the data section
  uint64_t end_bytes = 0;
  uint64_t size_bytes() const { return end_bytes - begin_bytes; }
  uint64_t element_count() const;
};

class SafetensorsReader {
 public:
  [[nodiscard]] static Result<SafetensorsReader> open(const std::string& path);
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // Reads the whole tensor into `out` (must hold entry.size_bytes()).
  [[nodiscard]] Status read(const SafetensorsEntry& entry, void* out) const;

 private:
  SafetensorsReader() = default;
  int fd_ = -1;
  std::string path_;
  uint64_t data_offset_bytes_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
};

class SafetensorsWriter {
 public:
  struct TensorSpec {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  // Declares every tensor up front (the header comes first in the file).
  [[nodiscard]] static Result<SafetensorsWriter> create(const std::string& path,
                                                        const std::vector<TensorSpec>& tensors,
                                                        const std::map<std::string, std::string>& metadata);
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;
  ~SafetensorsWriter();  // an unfinished writer removes its temporary file

  // Writes the next declared tensor's bytes, in declaration order.
  [[nodiscard]] Status write_next(const void* data, uint64_t size_bytes);
  // After every tensor: fsync, rename into place.
  [[nodiscard]] Status finish();

 private:
  SafetensorsWriter() = default;
  int fd_ = -1;
  std::string path_;
  std::string temp_path_;
  std::vector<SafetensorsEntry> entries_;
  size_t next_index_ = 0;
  bool finished_ = false;
};

}  // namespace strata
