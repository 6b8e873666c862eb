// fuzz/fuzz_safetensors.cpp — libFuzzer harness: any bytes as a whole .safetensors file.
// The reader must return a value or an error; a crash, sanitizer report, hang or exception
// is a finding. The input goes through a memfd, so the reader's real file path is fuzzed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    const ssize_t put = ::write(fd, data + done, size - done);
    if (put <= 0) break;
    done += static_cast<size_t>(put);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  strata::Result<strata::SafetensorsReader> reader = strata::SafetensorsReader::open(path);
  if (reader.ok()) {
    // Whatever was accepted must be readable within the file: read every entry (bounded).
    for (const auto& [name, entry] : reader->entries()) {
      if (entry.size_bytes() > (1u << 20)) continue;
      std::vector<unsigned char> out(entry.size_bytes());
      (void)reader->read(entry, out.data());
    }
  }
  ::close(fd);
  return 0;
}
