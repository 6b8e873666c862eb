// strata/io/io_config.cpp — strict parsing and writing of the `io:` section.
#include "io/io_config.h"

#include <fmt/format.h>

#include "common/size.h"

namespace strata::io {
namespace {

constexpr uint64_t kMinBlockBytes = 4 * kKiB;
constexpr uint64_t kMaxBlockBytes = 64 * kMiB;

Result<IoDirectionSettings> parse_direction(ConfigNode& io, const char* key) {
  Result<ConfigNode> node = io.child(key);
  if (!node.ok()) return node.error();
  IoDirectionSettings out;
  Result<std::string> engine = node->choice("engine", {"uring", "aio", "psync"}, "uring");
  if (!engine.ok()) return engine.error();
  out.engine = parse_backend(*engine).value();
  Result<uint64_t> block = node->size("block_size", 1 * kMiB, kMinBlockBytes, kMaxBlockBytes);
  if (!block.ok()) return block.error();
  if (*block % kMinBlockBytes != 0)
    return node->error_at("block_size", fmt::format("{} is not a multiple of 4KiB; accepted: a "
                                                    "multiple of 4KiB from 4KiB to 64MiB", *block));
  out.block_size_bytes = *block;
  const int64_t max_depth = out.engine == Backend::psync ? 256 : 1024;
  Result<int64_t> depth = node->integer("queue_depth", 32, 1, max_depth);
  if (!depth.ok()) return depth.error();
  out.queue_depth = static_cast<uint32_t>(*depth);
  Result<int64_t> threads = node->integer("threads", 1, 1, 64);
  if (!threads.ok()) return threads.error();
  out.threads = static_cast<uint32_t>(*threads);
  if (node->has("measured_MBps")) {
    Result<double> measured = node->number("measured_MBps", std::nullopt, 0.0, 1e9);
    if (!measured.ok()) return measured.error();
    out.measured_MBps = *measured;
  } else {
    (void)node->number("measured_MBps", 0.0, 0.0, 1e9);  // marks the key as known
  }
  STRATA_RETURN_IF_ERROR(node->finish());
  return out;
}

std::string size_text(uint64_t bytes) {
  if (bytes % kMiB == 0) return fmt::format("{}MiB", bytes / kMiB);
  if (bytes % kKiB == 0) return fmt::format("{}KiB", bytes / kKiB);
  return std::to_string(bytes);
}

}  // namespace

EngineConfig IoDirectionSettings::engine_config(bool sqpoll) const {
  EngineConfig config;
  config.backend = engine;
  config.block_size_bytes = block_size_bytes;
  config.queue_depth = queue_depth;
  config.threads = threads;
  config.sqpoll = sqpoll && engine == Backend::uring;
  return config;
}

Result<IoSettings> parse_io_settings(ConfigNode& io) {
  IoSettings out;
  Result<bool> sqpoll = io.boolean("sqpoll", false);
  if (!sqpoll.ok()) return sqpoll.error();
  out.sqpoll = *sqpoll;
  Result<IoDirectionSettings> read = parse_direction(io, "read");
  if (!read.ok()) return read.error();
  Result<IoDirectionSettings> write = parse_direction(io, "write");
  if (!write.ok()) return write.error();
  out.read = *read;
  out.write = *write;
  STRATA_RETURN_IF_ERROR(io.finish());
  return out;
}

Result<IoSettings> load_io_settings_file(const std::string& path) {
  Result<ConfigNode> root = ConfigNode::load_file(path);
  if (!root.ok()) return root.error();
  Result<ConfigNode> io = root->child("io", /*required=*/true);
  if (!io.ok()) return io.error();
  STRATA_RETURN_IF_ERROR(root->finish());
  return parse_io_settings(*io);
}

std::string format_io_settings_yaml(const IoSettings& settings, const std::string& comment) {
  std::string out;
  size_t start = 0;
  while (start < comment.size()) {
    size_t end = comment.find('\n', start);
    if (end == std::string::npos) end = comment.size();
    out += "# " + comment.substr(start, end - start) + "\n";
    start = end + 1;
  }
  out += "io:\n";
  out += fmt::format("  sqpoll: {}\n", settings.sqpoll ? "true" : "false");
  for (const auto& [name, direction] :
       {std::pair{"read", &settings.read}, std::pair{"write", &settings.write}}) {
    out += fmt::format("  {}:\n", name);
    out += fmt::format("    engine: {}\n", backend_name(direction->engine));
    out += fmt::format("    block_size: {}\n", size_text(direction->block_size_bytes));
    out += fmt::format("    queue_depth: {}\n", direction->queue_depth);
    out += fmt::format("    threads: {}\n", direction->threads);
    if (direction->measured_MBps) out += fmt::format("    measured_MBps: {:.1f}\n", *direction->measured_MBps);
  }
  return out;
}

}  // namespace strata::io
