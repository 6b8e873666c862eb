// Proves the store's two-phase commit (issue 15, the global commit of a ZeRO job): after
// prepare_commit the committed version is still the old one for every reader; a store dropped
// between prepare and finish (a rank killed at the barrier) reopens at the old step and
// byte-exact old data, unless roll_forward_prepared_commit is run first — then it opens at the
// prepared step with the new data; finish_commit makes the prepared step the committed one.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "memory/store.h"
#include "store_test_util.h"
#include "tests/support/temp_dir.h"

namespace strata::memory {
namespace {

using testing::AlignedBuffer;
using testing::fill_pattern;
using testing::matches_pattern;
using testing::read_and_wait;
using testing::test_store_options;
using testing::write_and_wait;

constexpr uint64_t kSize = 777 * 4;
const std::vector<int64_t> kShape{777};

// A store with "t" committed at step 1 (version 1) and prepared at step 2 (version 2).
Store prepared_store(const std::string& dir) {
  Result<Store> made = Store::create(dir, {}, 16 << 20, test_store_options());
  EXPECT_TRUE(made.ok());
  Store store = std::move(made).value();
  AlignedBuffer v1(kSize), v2(kSize);
  fill_pattern(v1.data, kSize, 0, 1);
  fill_pattern(v2.data, kSize, 0, 2);
  EXPECT_TRUE(write_and_wait(store, "t", DType::f32, kShape, v1.data, kSize).ok());
  EXPECT_TRUE(store.commit(1, {{"k", "one"}}).ok());
  EXPECT_TRUE(write_and_wait(store, "t", DType::f32, kShape, v2.data, kSize).ok());
  EXPECT_TRUE(store.prepare_commit(2, {{"k", "two"}}).ok());
  return store;
}

void expect_version(const std::string& dir, uint64_t step, uint64_t version) {
  Result<Store> reader = Store::open(dir, test_store_options());
  ASSERT_TRUE(reader.ok()) << reader.error().to_string();
  EXPECT_EQ(reader->committed_step(), step);
  AlignedBuffer back(kSize);
  ASSERT_TRUE(read_and_wait(*reader, "t", back.data, kSize).ok());
  EXPECT_TRUE(matches_pattern(back.data, kSize, 0, version));
}

TEST(StoreTwoPhase, PreparedIsInvisibleAndFinishCommits) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  Store store = prepared_store(dir);
  Result<std::optional<uint64_t>> prepared = Store::prepared_commit_step(dir);
  ASSERT_TRUE(prepared.ok());
  ASSERT_TRUE(prepared->has_value());
  EXPECT_EQ(**prepared, 2u);
  EXPECT_EQ(store.committed_step(), 1u);
  ASSERT_TRUE(store.finish_commit().ok());
  EXPECT_EQ(store.committed_step(), 2u);
  EXPECT_EQ(store.committed_metadata().at("k"), "two");
  EXPECT_FALSE(Store::prepared_commit_step(dir)->has_value());
  expect_version(dir, 2, 2);
}

TEST(StoreTwoPhase, DroppedBetweenPhasesReopensAtTheOldStep) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  { Store store = prepared_store(dir); }  // the process dies at the barrier
  expect_version(dir, 1, 1);
}

TEST(StoreTwoPhase, RollForwardFinishesAPreparedStep) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  { Store store = prepared_store(dir); }
  ASSERT_TRUE(Store::roll_forward_prepared_commit(dir).ok());
  expect_version(dir, 2, 2);
}

}  // namespace
}  // namespace strata::memory
