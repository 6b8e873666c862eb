// strata/io/io_config.h — the `io:` section of strata's configuration: how to read and how
// to write (engine, block size, queue depth, threads), separately, as `strata tune` measured
// them. The planner reads `measured_MBps` to predict how long a shard takes to stream.
//
//   io:
//     sqpoll: false          # optional, uring only
//     read:
//       engine: uring        # uring | aio | psync
//       block_size: 1MiB     # 4KiB..64MiB, a multiple of 4KiB
//       queue_depth: 32      # 1..1024 (psync: 1..256)
//       threads: 1           # engines side by side, 1..64
//       measured_MBps: 2100.5  # optional: what tune measured (1e6 bytes/s)
//     write: { ... the same keys ... }
//
// Parsing is strict (common/config_reader.h): an unknown key, a wrong type or a value out of
// range is an `invalid_argument` error naming the file, the key and what is accepted.
// `format_io_settings_yaml` writes exactly what `load_io_settings_file` accepts.
// Pure functions; any thread.
#pragma once

#include <optional>
#include <string>

#include "common/config_reader.h"
#include "common/status.h"
#include "io/io.h"

namespace strata::io {

struct IoDirectionSettings {
  Backend engine = Backend::uring;
  uint64_t block_size_bytes = 1 << 20;
  uint32_t queue_depth = 32;
  uint32_t threads = 1;
  std::optional<double> measured_MBps;  // decimal megabytes per second, when measured

  // An EngineConfig for one of `threads` engines.
  EngineConfig engine_config(bool sqpoll = false) const;
};

struct IoSettings {
  IoDirectionSettings read;
  IoDirectionSettings write;
  bool sqpoll = false;
};

// `io` is the mapping under the `io:` key (a missing section parses as all defaults).
[[nodiscard]] Result<IoSettings> parse_io_settings(ConfigNode& io);
// A file whose top level is `io:` and nothing else (what `strata tune` writes).
[[nodiscard]] Result<IoSettings> load_io_settings_file(const std::string& path);
// The YAML for a whole file: optional `# ` comment lines, then `io:` with both directions.
std::string format_io_settings_yaml(const IoSettings& settings, const std::string& comment = "");

}  // namespace strata::io
