// tests/io/test_io_config.cpp — the `io:` section: what the writer produces loads back
// unchanged, and every kind of mistake is rejected with the key and the accepted values.
#include <fstream>

#include <gtest/gtest.h>

#include "common/size.h"
#include "io/io_config.h"
#include "tests/support/temp_dir.h"

namespace strata::io {
namespace {

Result<IoSettings> parse_text(const std::string& text) {
  Result<ConfigNode> root = ConfigNode::load_string(text, "test.yaml");
  if (!root.ok()) return root.error();
  Result<ConfigNode> io = root->child("io", true);
  if (!io.ok()) return io.error();
  return parse_io_settings(*io);
}

TEST(IoConfig, WriterOutputLoadsBackUnchanged) {
  IoSettings settings;
  settings.read = {Backend::aio, 256 * kKiB, 16, 2, 1234.5};
  settings.write = {Backend::psync, 4 * kMiB, 8, 1, std::nullopt};
  settings.sqpoll = true;
  strata::testing::TempDir dir;
  const std::string path = dir.file("strata-io.yaml");
  std::ofstream(path) << format_io_settings_yaml(settings, "written by a test\nsecond line");
  Result<IoSettings> loaded = load_io_settings_file(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->read.engine, Backend::aio);
  EXPECT_EQ(loaded->read.block_size_bytes, 256 * kKiB);
  EXPECT_EQ(loaded->read.queue_depth, 16u);
  EXPECT_EQ(loaded->read.threads, 2u);
  ASSERT_TRUE(loaded->read.measured_MBps.has_value());
  EXPECT_DOUBLE_EQ(*loaded->read.measured_MBps, 1234.5);
  EXPECT_EQ(loaded->write.engine, Backend::psync);
  EXPECT_EQ(loaded->write.block_size_bytes, 4 * kMiB);
  EXPECT_FALSE(loaded->write.measured_MBps.has_value());
  EXPECT_TRUE(loaded->sqpoll);
  EngineConfig config = loaded->read.engine_config();
  EXPECT_EQ(config.backend, Backend::aio);
  EXPECT_EQ(config.queue_depth, 16u);
}

TEST(IoConfig, DefaultsWhenKeysAreMissing) {
  Result<IoSettings> parsed = parse_text("io:\n  read:\n    queue_depth: 4\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->read.queue_depth, 4u);
  EXPECT_EQ(parsed->write.engine, Backend::uring);
  EXPECT_EQ(parsed->write.block_size_bytes, 1 * kMiB);
}

void expect_rejected(const std::string& text, const std::string& key, const std::string& hint) {
  Result<IoSettings> parsed = parse_text(text);
  ASSERT_FALSE(parsed.ok()) << text;
  EXPECT_EQ(parsed.error().kind, ErrorKind::invalid_argument);
  const std::string message = parsed.error().to_string();
  EXPECT_NE(message.find(key), std::string::npos) << message;
  EXPECT_NE(message.find(hint), std::string::npos) << message;
  EXPECT_NE(message.find("test.yaml"), std::string::npos) << message;
}

TEST(IoConfig, RejectsBadKeysAndValuesNamingThem) {
  expect_rejected("io:\n  read:\n    queue_dept: 4\n", "io.read.queue_dept", "queue_depth");
  expect_rejected("io:\n  reed: {}\n", "io.reed", "read");
  expect_rejected("io:\n  read:\n    engine: spdk\n", "io.read.engine", "uring");
  expect_rejected("io:\n  write:\n    block_size: 1000\n", "io.write.block_size", "4");
  expect_rejected("io:\n  write:\n    block_size: 6KiB\n", "io.write.block_size", "multiple of 4KiB");
  expect_rejected("io:\n  write:\n    block_size: lots\n", "io.write.block_size", "MiB");
  expect_rejected("io:\n  read:\n    queue_depth: 0\n", "io.read.queue_depth", "1");
  expect_rejected("io:\n  read:\n    engine: psync\n    queue_depth: 512\n", "io.read.queue_depth", "256");
  expect_rejected("io:\n  read:\n    threads: many\n", "io.read.threads", "64");
  expect_rejected("io:\n  read:\n    measured_MBps: -3\n", "io.read.measured_MBps", "0");
  expect_rejected("io:\n  sqpoll: maybe\n", "io.sqpoll", "");
  expect_rejected("io:\n  read: 5\n", "io.read", "mapping");
}

TEST(IoConfig, FileMustHoldOnlyTheIoSection) {
  strata::testing::TempDir dir;
  const std::string path = dir.file("extra.yaml");
  std::ofstream(path) << "io:\n  read: {}\nmodel: {}\n";
  Result<IoSettings> loaded = load_io_settings_file(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.error().to_string().find("model"), std::string::npos);
  EXPECT_FALSE(load_io_settings_file(dir.file("missing.yaml")).ok());
}

}  // namespace
}  // namespace strata::io
