// Proves the foundation's input handling: sizes parse in every documented form and reject
// everything else, and the strict config reader names the key, the file and what is
// accepted for unknown keys, wrong types and out-of-range values (and says how to quote a
// bare `{rank}` in a [ ] list); config paths resolve absolute and normalized.
#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "common/config_reader.h"
#include "common/size.h"
#include "tests/support/temp_dir.h"

namespace strata {
namespace {

TEST(ParseSize, AcceptsPlainBytesAndBinaryUnits) {
  EXPECT_EQ(parse_size("4096").value(), 4096u);
  EXPECT_EQ(parse_size("512KiB").value(), 512u * 1024);
  EXPECT_EQ(parse_size("1MiB").value(), 1u << 20);
  EXPECT_EQ(parse_size("4GiB").value(), 4ull << 30);
  EXPECT_EQ(parse_size("1.5GiB").value(), 3ull << 29);
  EXPECT_EQ(parse_size(" 64 MiB ").value(), 64u << 20);
  EXPECT_EQ(parse_size("1m").value(), 1u << 20);
  EXPECT_EQ(parse_size("0").value(), 0u);
}

TEST(ParseSize, RejectsGarbageWithTheAcceptedForms) {
  for (const char* bad : {"", "MiB", "12XB", "-1", "1.5", "1 2", "0.3B", "99999999999999999999"}) {
    Result<uint64_t> parsed = parse_size(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.error().kind, ErrorKind::invalid_argument);
    EXPECT_NE(parsed.error().message.find("GiB"), std::string::npos) << parsed.error().message;
  }
}

TEST(FormatSize, PicksTheLargestWholeUnit) {
  EXPECT_EQ(format_size(64u << 20), "64 MiB");
  EXPECT_EQ(format_size(3ull << 29), "1.50 GiB");
  EXPECT_EQ(format_size(100), "100 B");
}

TEST(ConfigReader, ReadsTypedValuesAndDefaults) {
  auto root = ConfigNode::load_string(
      "device: {kind: cpu, memory: 256MiB}\nsteps: 20\nbetas: [0.9, 0.95]\nname: demo\n",
      "demo.yaml");
  ASSERT_TRUE(root.ok()) << root.error().to_string();
  auto device = root->child("device", true);
  ASSERT_TRUE(device.ok());
  EXPECT_EQ(device->choice("kind", {"cpu", "cuda"}, std::nullopt).value(), "cpu");
  EXPECT_EQ(device->size("memory", std::nullopt).value(), 256u << 20);
  EXPECT_TRUE(device->finish().ok());
  EXPECT_EQ(root->integer("steps", 1, 1, 1000).value(), 20);
  EXPECT_EQ(root->integer("batch_size", 8, 1, 1000).value(), 8);  // default
  auto betas = root->number_list("betas", 2, std::nullopt, 0.0, 1.0);
  ASSERT_TRUE(betas.ok());
  EXPECT_DOUBLE_EQ((*betas)[1], 0.95);
  EXPECT_EQ(root->string("name", std::nullopt).value(), "demo");
  EXPECT_TRUE(root->finish().ok());
}

TEST(ConfigReader, UnknownKeyNamesKeyFileAndAcceptedKeys) {
  auto root = ConfigNode::load_string("device: {kind: cpu, memroy: 1GiB}\n", "train.yaml");
  ASSERT_TRUE(root.ok());
  auto device = root->child("device");
  ASSERT_TRUE(device.ok());
  ASSERT_TRUE(device->choice("kind", {"cpu", "cuda"}, "cpu").ok());
  ASSERT_TRUE(device->size("memory", 1u << 30).ok());
  Status status = device->finish();
  ASSERT_FALSE(status.ok());
  const std::string& message = status.error().message;
  EXPECT_NE(message.find("train.yaml"), std::string::npos) << message;
  EXPECT_NE(message.find("device.memroy"), std::string::npos) << message;
  EXPECT_NE(message.find("memory"), std::string::npos) << message;
}

TEST(ConfigReader, WrongTypeAndOutOfRangeNameTheKeyAndTheRange) {
  auto root = ConfigNode::load_string("steps: many\nbatch_size: 0\nkind: gpu\nmemory: lots\n", "x.yaml");
  ASSERT_TRUE(root.ok());
  auto steps = root->integer("steps", 1, 1, 1000);
  ASSERT_FALSE(steps.ok());
  EXPECT_NE(steps.error().message.find("'steps'"), std::string::npos);
  EXPECT_NE(steps.error().message.find("an integer from 1 to 1000"), std::string::npos);
  auto batch = root->integer("batch_size", 1, 1, 64);
  ASSERT_FALSE(batch.ok());
  EXPECT_NE(batch.error().message.find("out of range"), std::string::npos);
  auto kind = root->choice("kind", {"cpu", "cuda"}, "cpu");
  ASSERT_FALSE(kind.ok());
  EXPECT_NE(kind.error().message.find("cpu, cuda"), std::string::npos);
  auto memory = root->size("memory", 0);
  ASSERT_FALSE(memory.ok());
  EXPECT_NE(memory.error().message.find("x.yaml: key 'memory'"), std::string::npos)
      << memory.error().message;
}

TEST(ConfigReader, MissingRequiredKeyAndBadYamlAreErrors) {
  auto root = ConfigNode::load_string("a: 1\n", "r.yaml");
  ASSERT_TRUE(root.ok());
  auto missing = root->size("memory", std::nullopt);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("is required"), std::string::npos);
  EXPECT_FALSE(ConfigNode::load_string("a: [1, 2\n", "bad.yaml").ok());
  EXPECT_FALSE(ConfigNode::load_string("- 1\n- 2\n", "list.yaml").ok());
  auto no_file = ConfigNode::load_file("/nonexistent/strata.yaml");
  ASSERT_FALSE(no_file.ok());
  EXPECT_EQ(no_file.error().kind, ErrorKind::not_found);
}

// Issue 12: a config names other files (nvme.io_file). A FIFO there blocked yaml-cpp's read
// forever (this test hung before the fix), /dev/zero read without end; both are refused now,
// as is a regular file over kMaxConfigBytes, with one error naming the path.
TEST(ConfigReader, LoadFileRefusesNonRegularAndHugeFiles) {
  strata::testing::TempDir temp;
  const std::string fifo = temp.file("io.yaml");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero")}) {
    auto loaded = ConfigNode::load_file(path);
    ASSERT_FALSE(loaded.ok()) << path;
    EXPECT_NE(loaded.error().to_string().find("not a regular file"), std::string::npos) << loaded.error().to_string();
  }
  const std::string huge = temp.file("huge.yaml");
  { std::ofstream out(huge); out << "a: 1\n"; }
  ASSERT_EQ(::truncate(huge.c_str(), static_cast<off_t>(ConfigNode::kMaxConfigBytes + 1)), 0);
  auto loaded = ConfigNode::load_file(huge);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.error().to_string().find(huge), std::string::npos) << loaded.error().to_string();
  // A regular file within the limit still reads.
  const std::string fine = temp.file("fine.yaml");
  { std::ofstream out(fine); out << "a: 1\n"; }
  EXPECT_TRUE(ConfigNode::load_file(fine).ok());
}

// Issue 29: a bare `{rank}` in a flow list (docs/parallel.md's old example) is one error naming
// the line and the dotted key and showing the quoted form; a quoted one reads as the string.
TEST(ConfigReader, BareRankTemplateInFlowListSaysHowToQuote) {
  auto bare = ConfigNode::load_string("steps: 3\nnvme:\n  # one store per rank\n  paths: [/nvme/a, /nvme/run/rank{rank}]\n",
                                      "zero.yaml");
  ASSERT_FALSE(bare.ok());
  EXPECT_EQ(bare.error().kind, ErrorKind::invalid_argument);
  EXPECT_EQ(bare.error().message,
            "zero.yaml: line 4: key 'nvme.paths': a bare '{rank}' inside [ ] opens a YAML mapping; quote the path: "
            "paths: [\"/nvme/a\", \"/nvme/run/rank{rank}\"]");
  // In a flow mapping the key is not guessed; the line and the quoted list still are.
  auto nested = ConfigNode::load_string("nvme: {paths: [/nvme/{rank}]}\n", "zero.yaml");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.error().message.find("line 1: a bare '{rank}'"), std::string::npos) << nested.error().message;
  EXPECT_NE(nested.error().message.find("[\"/nvme/{rank}\"]"), std::string::npos) << nested.error().message;
  // `[{rank}]` parses, as a list holding a mapping: the list getter says to quote.
  auto as_map = ConfigNode::load_string("paths: [{rank}]\n", "zero.yaml");
  ASSERT_TRUE(as_map.ok());
  auto listed = as_map->string_list("paths", std::nullopt);
  ASSERT_FALSE(listed.ok());
  EXPECT_NE(listed.error().message.find("key 'paths'"), std::string::npos) << listed.error().message;
  EXPECT_NE(listed.error().message.find("quote the item"), std::string::npos) << listed.error().message;
  // Other bad YAML keeps yaml-cpp's own words; the quoted and block forms read.
  auto other = ConfigNode::load_string("a: [1, 2\n", "bad.yaml");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find("not valid YAML"), std::string::npos) << other.error().message;
  for (const char* text : {"paths: [\"/nvme/run/rank{rank}\"]\n", "paths:\n  - /nvme/run/rank{rank}\n"}) {
    auto good = ConfigNode::load_string(text, "zero.yaml");
    ASSERT_TRUE(good.ok()) << text;
    auto paths = good->string_list("paths", std::nullopt);
    ASSERT_TRUE(paths.ok()) << text;
    EXPECT_EQ(*paths, std::vector<std::string>{"/nvme/run/rank{rank}"});
  }
}

// Issue 29: a config's relative path is made absolute and normalized against the config's
// folder at read time, so the store never sees "configs/../data" (it refuses such a name).
TEST(ConfigReader, ResolvePathIsAbsoluteAndNormalized) {
  auto root = ConfigNode::load_string("a: 1\n", "configs/demo.yaml");
  ASSERT_TRUE(root.ok());
  const std::filesystem::path cwd = std::filesystem::current_path();
  EXPECT_EQ(root->resolve_path("../strata-data/demo"), (cwd / "strata-data/demo").string());
  EXPECT_EQ(root->resolve_path("./corpus.txt"), (cwd / "configs/corpus.txt").string());
  EXPECT_EQ(root->resolve_path("/nvme/x/../run/rank{rank}"), "/nvme/run/rank{rank}");
  auto bare_name = ConfigNode::load_string("a: 1\n", "demo.yaml");
  ASSERT_TRUE(bare_name.ok());
  EXPECT_EQ(bare_name->resolve_path("../data"), (cwd.parent_path() / "data").string());
}

TEST(ErrorText, NamesOpPathOffsetLengthAndTensor) {
  Error error = make_errno_error(EIO, "read", "/nvme/a.strata", 4096, 1 << 20);
  error.tensor = "h.3.attn.c_attn.weight";
  std::string line = error.to_string();
  EXPECT_NE(line.find("read of 1048576 bytes at offset 4096 in /nvme/a.strata"), std::string::npos) << line;
  EXPECT_NE(line.find("h.3.attn.c_attn.weight"), std::string::npos) << line;
  EXPECT_NE(line.find("Input/output error"), std::string::npos) << line;
  EXPECT_EQ(error.kind, ErrorKind::io);
  EXPECT_EQ(error_kind_from_errno(ENOSPC), ErrorKind::no_space);
  EXPECT_EQ(error_kind_from_errno(EINTR), ErrorKind::retryable);
}

}  // namespace
}  // namespace strata
