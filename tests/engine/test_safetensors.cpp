// tests/engine/test_safetensors.cpp — the safetensors reader refuses every malformed header
// with one error naming the file and the entry, never an exception or a wrapped size (issue
// 12), and round-trips what the writer wrote byte for byte. Also the 64-bit batch indexing
// of TokenData and the int check before cuBLAS calls.
//
// How: headers are built by hand (the 8-byte length + JSON + data), each with one defect; the
// reader must return a `corrupt` error. Before the fix, a wrong JSON type threw
// nlohmann::type_error out of `open` (this binary aborted) and a negative or overflowing shape
// was accepted.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/narrow.h"
#include "data/token_stream.h"
#include "models/safetensors.h"
#include "tests/support/temp_dir.h"

namespace strata {
namespace {

std::string write_raw(const strata::testing::TempDir& temp, const std::string& header, uint64_t data_bytes) {
  const std::string path = temp.file("t.safetensors");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t length = header.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header << std::string(data_bytes, '\x5a');
  return path;
}

// One defect per header; each must be a `corrupt` error that names the file.
TEST(Safetensors, MalformedHeadersAreRefusedWithAnError) {
  strata::testing::TempDir temp;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"dtype of the wrong JSON type", R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})"},
      {"shape of the wrong JSON type", R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})"},
      {"a dimension that is a string", R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})"},
      {"a negative dimension", R"({"w":{"dtype":"F32","shape":[-2,-1],"data_offsets":[0,8]}})"},
      {"a fractional dimension", R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})"},
      {"offsets that are strings", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}})"},
      {"negative offsets", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})"},
      {"offsets past the data", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})"},
      // 2^62 · 4 elements of 4 bytes is 2^66 bytes, which wraps to 0 in 64 bits: it matched
      // empty offsets before element_count saturated.
      {"a shape whose size wraps to 0", R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})"},
      // [2^62 + 1, 2] F32 wraps to exactly 8 bytes.
      {"a shape whose size wraps to 8", R"({"w":{"dtype":"F32","shape":[4611686018427387905,2],"data_offsets":[0,8]}})"},
      {"an entry that is not an object", R"({"w":[1,2,3]})"},
      {"a header that is an array", R"([1,2])"},
      {"an unknown dtype", R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})"},
  };
  for (const auto& [what, header] : cases) {
    const std::string path = write_raw(temp, header, 8);
    Result<SafetensorsReader> reader = SafetensorsReader::open(path);
    ASSERT_FALSE(reader.ok()) << what << " was accepted";
    EXPECT_EQ(reader.error().kind, ErrorKind::corrupt) << what << ": " << reader.error().to_string();
    EXPECT_NE(reader.error().to_string().find(path), std::string::npos) << what << ": " << reader.error().to_string();
  }
}

TEST(Safetensors, WriterOutputReadsBackByteForByte) {
  strata::testing::TempDir temp;
  const std::string path = temp.file("ok.safetensors");
  std::vector<float> a(6), b(1);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 1.0f;
  b[0] = 3.5f;
  {
    Result<SafetensorsWriter> writer = SafetensorsWriter::create(
        path, {{"a", DType::f32, {2, 3}}, {"b", DType::f32, {1}}}, {{"k", "v"}});
    ASSERT_TRUE(writer.ok()) << writer.error().to_string();
    ASSERT_TRUE(writer->write_next(a.data(), a.size() * 4).ok());
    ASSERT_TRUE(writer->write_next(b.data(), 4).ok());
    ASSERT_TRUE(writer->finish().ok());
  }
  Result<SafetensorsReader> reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.ok()) << reader.error().to_string();
  const SafetensorsEntry* entry = reader->find("a");
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> back(6);
  ASSERT_TRUE(reader->read(*entry, back.data()).ok());
  EXPECT_EQ(std::memcmp(back.data(), a.data(), a.size() * 4), 0);
}

TEST(Safetensors, ElementCountSaturatesInsteadOfWrapping) {
  SafetensorsEntry entry;
  entry.shape = {int64_t{1} << 32, int64_t{1} << 32};
  EXPECT_EQ(entry.element_count(), UINT64_MAX);
  entry.shape = {-1};
  EXPECT_EQ(entry.element_count(), UINT64_MAX);
  entry.shape = {3, 0, int64_t{1} << 62};
  EXPECT_EQ(entry.element_count(), 0u);
  entry.shape = {7, 11};
  EXPECT_EQ(entry.element_count(), 77u);
}

// Today's bounds (batch_size and seq_len at most 65536) keep the largest index at exactly
// 2^32 - 1, one short of wrapping a 32-bit product: the index is 64-bit so that any wider bound
// cannot wrap it onto row 0. Row 65536 of a 65536-token window starts at 2^32 (0 in 32 bits).
TEST(TokenData, RowOffsetIsSixtyFourBit) {
  EXPECT_EQ(TokenData::row_offset(65535, 65536), uint64_t{65535} * 65536);
  EXPECT_EQ(TokenData::row_offset(65536, 65536), uint64_t{1} << 32);
  EXPECT_EQ(TokenData::row_offset(UINT32_MAX, UINT32_MAX), uint64_t{UINT32_MAX} * UINT32_MAX);
}

TEST(Narrow, AllFitIntRefusesNegativeAndHugeSizes) {
  EXPECT_TRUE(all_fit_int({0, 1, 2147483647}));
  EXPECT_FALSE(all_fit_int({1, 2147483648}));
  EXPECT_FALSE(all_fit_int({-1}));
  EXPECT_FALSE(all_fit_int({int64_t{1} << 40, 3}));
}

}  // namespace
}  // namespace strata
