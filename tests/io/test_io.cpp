// tests/io/test_io.cpp — the I/O engine moves the right bytes to the right place, for every
// backend this build has: each byte written is stamped with its logical offset, so a
// misplaced, torn or stale byte shows up in the byte-exact comparison with an in-memory
// shadow. Covers queue depths 1..64, sizes and offsets that are not block multiples,
// buffers out of step with the file, striping over 3 paths, and requests waited for out of
// order. Faults (EIO, short transfers, EAGAIN, ENOSPC) go through io/fault_engine.h.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "io/fault_engine.h"
#include "io/io.h"
#include "tests/support/temp_dir.h"

namespace strata::io {
namespace {

// The byte that belongs at logical offset `offset` in generation `seed` of the data.
uint8_t stamp_byte(uint64_t offset, uint32_t seed) {
  uint64_t x = offset * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 29;
  return static_cast<uint8_t>(x ^ (x >> 17));
}

void stamp(uint8_t* data, uint64_t length_bytes, uint64_t logical_offset, uint32_t seed) {
  for (uint64_t i = 0; i < length_bytes; ++i) data[i] = stamp_byte(logical_offset + i, seed);
}

// First offset where `data` differs from the stamp, or -1.
int64_t first_mismatch(const uint8_t* data, uint64_t length_bytes, uint64_t logical_offset,
                       uint32_t seed) {
  for (uint64_t i = 0; i < length_bytes; ++i)
    if (data[i] != stamp_byte(logical_offset + i, seed)) return static_cast<int64_t>(i);
  return -1;
}

// Page-aligned memory with `skew` bytes of deliberate misalignment in front of `data()`.
class TestBuffer {
 public:
  TestBuffer(uint64_t length_bytes, uint64_t skew = 0)
      : storage_(length_bytes + skew + 8192), skew_(skew) {}
  uint8_t* data() {
    auto base = reinterpret_cast<uintptr_t>(storage_.data());
    return reinterpret_cast<uint8_t*>(align_up(base, 4096) + skew_);
  }

 private:
  std::vector<uint8_t> storage_;
  uint64_t skew_;
};

std::vector<Backend> backends_to_test() { return available_backends(); }

std::string backend_param_name(const ::testing::TestParamInfo<Backend>& info) {
  return backend_name(info.param);
}

class EngineTest : public ::testing::TestWithParam<Backend> {
 protected:
  std::unique_ptr<Engine> engine(uint32_t queue_depth, uint64_t block_size_bytes = 1 * kMiB) {
    EngineConfig config;
    config.backend = GetParam();
    config.queue_depth = queue_depth;
    config.block_size_bytes = block_size_bytes;
    Result<std::unique_ptr<Engine>> made = make_engine(config);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return made.ok() ? std::move(made).value() : nullptr;
  }
  Volume volume(const std::vector<std::string>& paths, uint64_t stripe_bytes = 0) {
    OpenOptions options;
    options.create = true;
    Result<Volume> opened = Volume::open(paths, stripe_bytes, options);
    EXPECT_TRUE(opened.ok()) << opened.status().to_string();
    return std::move(opened).value();
  }
  strata::testing::TempDir dir_;
};

TEST_P(EngineTest, FilesAreDirectWithDeviceAlignment) {
  Volume v = volume({dir_.file("a.strata")});
  EXPECT_TRUE(v.is_direct()) << "the test folder's filesystem should take O_DIRECT";
  EXPECT_TRUE(is_power_of_two(v.alignment_bytes()));
  EXPECT_GE(v.alignment_bytes(), 512u);
}

TEST_P(EngineTest, AlignedRoundTripAtEveryQueueDepth) {
  const uint64_t size_bytes = 6 * kMiB;
  TestBuffer out(size_bytes), in(size_bytes);
  for (uint32_t queue_depth : {1u, 2u, 7u, 32u, 64u}) {
    SCOPED_TRACE("queue depth " + std::to_string(queue_depth));
    Volume v = volume({dir_.file("qd" + std::to_string(queue_depth))});
    std::unique_ptr<Engine> e = engine(queue_depth, 256 * kKiB);
    ASSERT_NE(e, nullptr);
    stamp(out.data(), size_bytes, 0, queue_depth);
    // Many requests in flight at once, each 512 KiB (two pieces), waited for in order.
    std::vector<RequestId> ids;
    for (uint64_t offset = 0; offset < size_bytes; offset += 512 * kKiB) {
      Result<RequestId> id = e->submit(Op::write, v, out.data() + offset, 512 * kKiB, offset);
      ASSERT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(*id);
    }
    for (RequestId id : ids) ASSERT_TRUE(e->wait(id).ok());
    ASSERT_TRUE(read_exact(*e, v, in.data(), size_bytes, 0).ok());
    EXPECT_EQ(first_mismatch(in.data(), size_bytes, 0, queue_depth), -1);
    EXPECT_EQ(e->stats().bounce_bytes, 0u) << "aligned requests must not bounce";
    EXPECT_EQ(e->stats().bytes_written, size_bytes);
  }
}

TEST_P(EngineTest, UnalignedOffsetsLengthsAndBuffers) {
  Volume v = volume({dir_.file("odd.strata")});
  std::unique_ptr<Engine> e = engine(8, 64 * kKiB);
  ASSERT_NE(e, nullptr);
  const uint64_t size_bytes = 1 * kMiB + 12345;  // not a block multiple
  std::vector<uint8_t> shadow(size_bytes);
  stamp(shadow.data(), size_bytes, 0, 1);
  {
    TestBuffer out(size_bytes, 3);  // out of step with every offset below
    std::memcpy(out.data(), shadow.data(), size_bytes);
    ASSERT_TRUE(write_all(*e, v, out.data(), size_bytes, 0).ok());
  }
  // Overwrite odd ranges with a second generation: some in step with the file (head/tail
  // bounce only), some out of step (whole bounce), some tiny inside one block.
  struct Range { uint64_t offset, length, skew; };
  std::mt19937_64 random(7);
  std::vector<Range> ranges = {{1, 1, 0}, {511, 2, 5}, {4095, 4098, 4095 % 512}, {70000, 300001, 1},
                               {size_bytes - 77, 77, 0}};
  for (int i = 0; i < 20; ++i) {
    const uint64_t offset = random() % (size_bytes - 1);
    ranges.push_back({offset, 1 + random() % std::min<uint64_t>(size_bytes - offset, 200000),
                      random() % 4096});
  }
  for (const Range& range : ranges) {
    TestBuffer buffer(range.length, range.skew);
    stamp(buffer.data(), range.length, range.offset, 2);
    stamp(shadow.data() + range.offset, range.length, range.offset, 2);
    Status status = write_all(*e, v, buffer.data(), range.length, range.offset);
    ASSERT_TRUE(status.ok()) << status.to_string();
  }
  EXPECT_GT(e->stats().bounce_bytes, 0u);
  // Read back in odd pieces into odd buffers and compare with the shadow.
  for (const Range& range : ranges) {
    TestBuffer buffer(range.length, (range.skew + 1) % 4096);
    ASSERT_TRUE(read_exact(*e, v, buffer.data(), range.length, range.offset).ok());
    ASSERT_EQ(std::memcmp(buffer.data(), shadow.data() + range.offset, range.length), 0)
        << "range at " << range.offset << " of " << range.length;
  }
  TestBuffer whole(size_bytes, 1);
  ASSERT_TRUE(read_exact(*e, v, whole.data(), size_bytes, 0).ok());
  EXPECT_EQ(std::memcmp(whole.data(), shadow.data(), size_bytes), 0);
  // The file grows in whole alignment blocks; the bytes past the data are zero.
  Result<uint64_t> file_size = v.size_bytes();
  ASSERT_TRUE(file_size.ok());
  EXPECT_EQ(*file_size, align_up(size_bytes, v.alignment_bytes()));
}

TEST_P(EngineTest, ManyConcurrentUnalignedRequestsWaitedOutOfOrder) {
  // 64 requests in flight on disjoint 64 KiB cells, each with a random unaligned start,
  // length and buffer skew; waited for in a shuffled order.
  Volume v = volume({dir_.file("many.strata")});
  std::unique_ptr<Engine> e = engine(16, 16 * kKiB);
  ASSERT_NE(e, nullptr);
  const uint64_t cell_bytes = 64 * kKiB, cells = 64;
  std::vector<uint8_t> shadow(cell_bytes * cells);
  stamp(shadow.data(), shadow.size(), 0, 3);
  ASSERT_TRUE(write_all(*e, v, shadow.data(), shadow.size(), 0).ok());
  std::mt19937_64 random(11);
  std::vector<std::unique_ptr<TestBuffer>> buffers;
  std::vector<RequestId> ids;
  for (uint64_t cell = 0; cell < cells; ++cell) {
    // Cells are block aligned, so no two requests share an alignment block.
    const uint64_t start = cell * cell_bytes + 1 + random() % 4096;
    const uint64_t length = 1 + random() % (cell_bytes - 8192);
    buffers.push_back(std::make_unique<TestBuffer>(length, random() % 4096));
    stamp(buffers.back()->data(), length, start, 4);
    stamp(shadow.data() + start, length, start, 4);
    Result<RequestId> id = e->submit(Op::write, v, buffers.back()->data(), length, start);
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  std::shuffle(ids.begin(), ids.end(), random);
  for (RequestId id : ids) ASSERT_TRUE(e->wait(id).ok());
  TestBuffer whole(shadow.size());
  ASSERT_TRUE(read_exact(*e, v, whole.data(), shadow.size(), 0).ok());
  EXPECT_EQ(std::memcmp(whole.data(), shadow.data(), shadow.size()), 0);
}

TEST_P(EngineTest, WaitForOneWithoutWaitingForAll) {
  Volume v = volume({dir_.file("one.strata")});
  std::unique_ptr<Engine> e = engine(4, 64 * kKiB);
  ASSERT_NE(e, nullptr);
  const uint64_t part_bytes = 1 * kMiB;
  TestBuffer data(8 * part_bytes);
  stamp(data.data(), 8 * part_bytes, 0, 5);
  std::vector<RequestId> ids;
  for (uint64_t i = 0; i < 8; ++i) {
    Result<RequestId> id = e->submit(Op::write, v, data.data() + i * part_bytes, part_bytes, i * part_bytes);
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  // The first request finishes while later ones are still queued behind the depth-4 queue.
  ASSERT_TRUE(e->wait(ids[0]).ok());
  EXPECT_LT(e->stats().requests_completed, e->stats().requests_submitted);
  EXPECT_FALSE(e->is_done(ids[7]));
  ASSERT_TRUE(e->wait(ids[5]).ok());
  for (RequestId id : {ids[1], ids[2], ids[3], ids[4], ids[6]}) ASSERT_TRUE(e->wait(id).ok());
  while (!e->is_done(ids[7])) {
  }
  ASSERT_TRUE(e->wait(ids[7]).ok());
  EXPECT_EQ(e->stats().requests_completed, e->stats().requests_submitted);
  TestBuffer in(8 * part_bytes);
  ASSERT_TRUE(read_exact(*e, v, in.data(), 8 * part_bytes, 0).ok());
  EXPECT_EQ(first_mismatch(in.data(), 8 * part_bytes, 0, 5), -1);
}

TEST_P(EngineTest, StripesOverThreePaths) {
  const uint64_t stripe_bytes = 64 * kKiB;
  std::vector<std::string> paths = {dir_.file("s0"), dir_.file("s1"), dir_.file("s2")};
  Volume v = volume(paths, stripe_bytes);
  ASSERT_EQ(v.file_count(), 3u);
  std::unique_ptr<Engine> e = engine(32, 256 * kKiB);
  ASSERT_NE(e, nullptr);
  const uint64_t offset = 1000, length = 5 * kMiB + 777;  // crosses many stripes, unaligned ends
  TestBuffer out(length, 0), in(length, 24);
  stamp(out.data(), length, offset, 6);
  ASSERT_TRUE(write_all(*e, v, out.data(), length, offset).ok());
  ASSERT_TRUE(read_exact(*e, v, in.data(), length, offset).ok());
  EXPECT_EQ(first_mismatch(in.data(), length, offset, 6), -1);
  // Each logical byte sits in the file and at the offset the striping formula names.
  for (uint64_t logical : {offset, stripe_bytes, 3 * stripe_bytes + 5, offset + length - 1,
                           2 * stripe_bytes + 17, 7 * stripe_bytes + 4000}) {
    const uint64_t stripe = logical / stripe_bytes;
    const uint64_t file_offset = (stripe / 3) * stripe_bytes + logical % stripe_bytes;
    uint8_t byte = 0;
    int fd = ::open(paths[stripe % 3].c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(file_offset)), 1);
    ::close(fd);
    EXPECT_EQ(byte, stamp_byte(logical, 6)) << "logical byte " << logical;
  }
  std::vector<Volume::Piece> pieces;
  v.split(stripe_bytes - 10, stripe_bytes + 20, pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].file_index, 0u);
  EXPECT_EQ(pieces[1].file_index, 1u);
  EXPECT_EQ(pieces[2].file_index, 2u);
  EXPECT_EQ(pieces[1].file_offset_bytes, 0u);
  EXPECT_EQ(pieces[2].length_bytes, 10u);
}

TEST_P(EngineTest, ReadPastEndOfFileIsAnError) {
  Volume v = volume({dir_.file("short.strata")});
  std::unique_ptr<Engine> e = engine(4);
  ASSERT_NE(e, nullptr);
  TestBuffer data(64 * kKiB);
  stamp(data.data(), 64 * kKiB, 0, 7);
  ASSERT_TRUE(write_all(*e, v, data.data(), 64 * kKiB, 0).ok());
  Status status = read_exact(*e, v, data.data(), 64 * kKiB, 32 * kKiB);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("end of file"), std::string::npos) << status.to_string();
  EXPECT_EQ(status.error().path, dir_.file("short.strata"));
  EXPECT_TRUE(status.error().has_range);
  // Within the file everything still reads.
  EXPECT_TRUE(read_exact(*e, v, data.data(), 1000, 64 * kKiB - 1000).ok());
}

TEST_P(EngineTest, RegisteredBufferRoundTrip) {
  Volume v = volume({dir_.file("fixed.strata")});
  std::unique_ptr<Engine> e = engine(8, 128 * kKiB);
  ASSERT_NE(e, nullptr);
  const uint64_t size_bytes = 2 * kMiB;
  TestBuffer region(size_bytes);
  ASSERT_TRUE(e->register_buffer(region.data(), size_bytes).ok());
  stamp(region.data(), size_bytes, 0, 8);
  ASSERT_TRUE(write_all(*e, v, region.data(), size_bytes, 0).ok());
  std::memset(region.data(), 0, size_bytes);
  ASSERT_TRUE(read_exact(*e, v, region.data(), size_bytes, 0).ok());
  EXPECT_EQ(first_mismatch(region.data(), size_bytes, 0, 8), -1);
  if (GetParam() == Backend::uring) {
    EXPECT_GT(e->stats().fixed_buffer_ops, 0u);
  }
}

TEST_P(EngineTest, RegionOverOneGiBStaysOnTheFixedPathAcrossTheGiBMark) {
  if (GetParam() != Backend::uring) GTEST_SKIP() << "registered buffers are io_uring's";
  // The kernel registers at most 1 GiB per buffer (a 6 GiB pinned arena was refused whole,
  // with EFAULT): larger regions go in as overlapping 1 GiB windows, and a transfer that
  // straddles the 1 GiB mark must still find a window holding all of it.
  Volume v = volume({dir_.file("big-region.strata")});
  std::unique_ptr<Engine> e = engine(8, 1 * kMiB);
  ASSERT_NE(e, nullptr);
  const uint64_t size_bytes = kGiB + 8 * kMiB;
  TestBuffer region(size_bytes);
  Status registered = e->register_buffer(region.data(), size_bytes);
  ASSERT_TRUE(registered.ok()) << registered.to_string();
  const uint64_t length_bytes = 4 * kMiB;
  uint8_t* across = region.data() + kGiB - length_bytes / 2;
  stamp(across, length_bytes, 0, 9);
  ASSERT_TRUE(write_all(*e, v, across, length_bytes, 0).ok());
  std::memset(across, 0, length_bytes);
  ASSERT_TRUE(read_exact(*e, v, across, length_bytes, 0).ok());
  EXPECT_EQ(first_mismatch(across, length_bytes, 0, 9), -1);
  EXPECT_EQ(e->stats().fixed_buffer_ops, e->stats().pieces_submitted);
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineTest, ::testing::ValuesIn(backends_to_test()),
                         backend_param_name);

// --- faults -------------------------------------------------------------------------------

class FaultTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    OpenOptions options;
    options.create = true;
    Result<Volume> opened = Volume::open({dir_.file("f.strata")}, 0, options);
    ASSERT_TRUE(opened.ok());
    volume_ = std::make_unique<Volume>(std::move(opened).value());
    EngineConfig config;
    config.backend = GetParam();
    config.queue_depth = 8;
    config.block_size_bytes = 64 * kKiB;
    plan_ = std::make_shared<FaultPlan>();
    Result<std::unique_ptr<Engine>> made = make_fault_engine(config, plan_);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    engine_ = std::move(made).value();
    // 2 MiB of generation-1 data, written with no faults.
    data_ = std::make_unique<TestBuffer>(kSize);
    stamp(data_->data(), kSize, 0, 1);
    ASSERT_TRUE(write_all(*engine_, *volume_, data_->data(), kSize, 0).ok());
  }
  static constexpr uint64_t kSize = 2 * kMiB;
  strata::testing::TempDir dir_;
  std::unique_ptr<Volume> volume_;
  std::shared_ptr<FaultPlan> plan_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<TestBuffer> data_;
};

TEST_P(FaultTest, EioNamesOpPathOffsetAndLeavesOtherRequestsIntact) {
  FaultRules rules;
  rules.eio = FaultRules::Eio{kSize / 2 + 100, "f.strata", true, false, 0};
  plan_->set_rules(rules);
  TestBuffer in(kSize);
  Result<RequestId> first = engine_->submit(Op::read, *volume_, in.data(), kSize / 2, 0);
  Result<RequestId> second = engine_->submit(Op::read, *volume_, in.data() + kSize / 2, kSize / 2, kSize / 2);
  ASSERT_TRUE(first.ok() && second.ok());
  Status bad = engine_->wait(*second);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::io);
  EXPECT_EQ(bad.error().errno_value, EIO);
  EXPECT_EQ(bad.error().op, "read");
  EXPECT_EQ(bad.error().path, dir_.file("f.strata"));
  EXPECT_TRUE(bad.error().has_range);
  EXPECT_LE(bad.error().offset_bytes, kSize / 2 + 100);
  EXPECT_GT(bad.error().offset_bytes + bad.error().length_bytes, kSize / 2 + 100);
  EXPECT_NE(bad.to_string().find("Input/output error"), std::string::npos) << bad.to_string();
  ASSERT_TRUE(engine_->wait(*first).ok());
  EXPECT_EQ(first_mismatch(in.data(), kSize / 2, 0, 1), -1);
  EXPECT_EQ(plan_->counters().eio_injected, 1u);
  // Writes are not affected by a read-only rule, and the data on disk is untouched.
  plan_->set_rules(FaultRules{});
  ASSERT_TRUE(read_exact(*engine_, *volume_, in.data(), kSize, 0).ok());
  EXPECT_EQ(first_mismatch(in.data(), kSize, 0, 1), -1);
}

TEST_P(FaultTest, ShortTransfersAreResubmitted) {
  FaultRules rules;
  rules.short_transfer_max_bytes = 5000;  // not a block multiple: the core steps back
  plan_->set_rules(rules);
  stamp(data_->data(), kSize, 0, 2);
  ASSERT_TRUE(write_all(*engine_, *volume_, data_->data() , kSize, 0).ok());
  TestBuffer in(kSize + 1, 1);
  ASSERT_TRUE(read_exact(*engine_, *volume_, in.data(), kSize - 3, 3).ok());
  EXPECT_EQ(first_mismatch(in.data(), kSize - 3, 3, 2), -1);
  EXPECT_GT(engine_->stats().short_transfers_resubmitted, 100u);
  EXPECT_GT(plan_->counters().short_transfers_injected, 100u);
}

TEST_P(FaultTest, EagainIsRetried) {
  FaultRules rules;
  rules.eagain_every_n_pieces = 3;
  plan_->set_rules(rules);
  TestBuffer in(kSize);
  ASSERT_TRUE(read_exact(*engine_, *volume_, in.data(), kSize, 0).ok());
  EXPECT_EQ(first_mismatch(in.data(), kSize, 0, 1), -1);
  EXPECT_GT(engine_->stats().retries, 5u);
}

TEST_P(FaultTest, EnospcFailsCleanlyAndKeepsEarlierData) {
  FaultRules rules;
  rules.write_budget_bytes = plan_->counters().bytes_written + 300 * kKiB;
  rules.delay_us = 100;
  plan_->set_rules(rules);
  TestBuffer more(kSize);
  stamp(more.data(), kSize, kSize, 1);
  // Appending 2 MiB where only 300 KiB fit: a no_space error naming the file.
  Status status = write_all(*engine_, *volume_, more.data(), kSize, kSize);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().kind, ErrorKind::no_space) << status.to_string();
  EXPECT_EQ(status.error().errno_value, ENOSPC);
  EXPECT_EQ(status.error().path, dir_.file("f.strata"));
  // The failing write lies in the 2 MiB appended at kSize (an unsigned >= 0 could not fail).
  EXPECT_GE(status.error().offset_bytes, kSize);
  EXPECT_LT(status.error().offset_bytes, 2 * kSize);
  EXPECT_GT(plan_->counters().enospc_injected, 0u);
  // What was written before the disk "filled" reads back exactly.
  plan_->set_rules(FaultRules{});
  TestBuffer in(kSize);
  ASSERT_TRUE(read_exact(*engine_, *volume_, in.data(), kSize, 0).ok());
  EXPECT_EQ(first_mismatch(in.data(), kSize, 0, 1), -1);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultTest, ::testing::ValuesIn(backends_to_test()),
                         backend_param_name);

// --- files --------------------------------------------------------------------------------

TEST(DirectFile, RefusedDirectIoFallsBackToBufferedWithOneWarning) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  auto logger = std::make_shared<spdlog::logger>("capture", sink);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  strata::testing::TempDir dir;
  OpenOptions options;
  options.create = true;
  options.simulate_direct_refusal = true;
  Result<DirectFile> file = DirectFile::open(dir.file("buffered"), options);
  spdlog::set_default_logger(previous);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_FALSE(file->is_direct());
  EXPECT_EQ(file->alignment_bytes(), 1u);
  std::vector<std::string> lines = sink->last_formatted();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("O_DIRECT"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("warning"), std::string::npos) << lines[0];
  // Without fallback the refusal is an error, not a crash.
  options.allow_buffered_fallback = false;
  Result<DirectFile> refused = DirectFile::open(dir.file("buffered2"), options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind, ErrorKind::unsupported);
  // A buffered file works end to end with every engine, unaligned and all.
  options.allow_buffered_fallback = true;
  spdlog::set_default_logger(logger);
  Result<Volume> v = Volume::open({dir.file("buffered3")}, 0, options);
  spdlog::set_default_logger(previous);
  ASSERT_TRUE(v.ok());
  for (Backend backend : available_backends()) {
    EngineConfig config;
    config.backend = backend;
    config.queue_depth = 4;
    config.block_size_bytes = 4 * kKiB;
    Result<std::unique_ptr<Engine>> e = make_engine(config);
    ASSERT_TRUE(e.ok());
    std::vector<uint8_t> out(100001), in(100001);
    stamp(out.data(), out.size(), 13, 9);
    ASSERT_TRUE(write_all(**e, *v, out.data(), out.size(), 13).ok());
    ASSERT_TRUE(read_exact(**e, *v, in.data(), in.size(), 13).ok());
    EXPECT_EQ(first_mismatch(in.data(), in.size(), 13, 9), -1) << backend_name(backend);
  }
}

TEST(DirectFile, RealRefusalOnTmpfsFallsBack) {
  // Before Linux 6.6, tmpfs refused O_DIRECT with EINVAL; newer kernels accept it.
  strata::testing::TempDir scratch;
  const std::string path = "/dev/shm/strata-odirect-probe-" + std::to_string(::getpid());
  OpenOptions options;
  options.create = true;
  Result<DirectFile> file = DirectFile::open(path, options);
  ::unlink(path.c_str());
  if (!file.ok()) GTEST_SKIP() << "/dev/shm not usable: " << file.status().to_string();
  if (file->is_direct())
    GTEST_SKIP() << "this kernel's tmpfs accepts O_DIRECT, so no real refusal is available; "
                    "the fallback path is covered by the simulated refusal test";
  EXPECT_EQ(file->alignment_bytes(), 1u);
}

TEST(DirectFile, PreallocateBeyondFreeSpaceSaysHowMuch) {
  strata::testing::TempDir dir;
  OpenOptions options;
  options.create = true;
  Result<DirectFile> file = DirectFile::open(dir.file("big"), options);
  ASSERT_TRUE(file.ok());
  struct statvfs fs {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &fs), 0);
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  Status status = file->preallocate(free_bytes + 64 * kGiB);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().kind, ErrorKind::no_space) << status.to_string();
  EXPECT_NE(status.error().message.find("free"), std::string::npos) << status.to_string();
  EXPECT_NE(status.error().message.find("asked for"), std::string::npos);
  EXPECT_EQ(status.error().path, dir.file("big"));
  EXPECT_TRUE(file->preallocate(1 * kMiB).ok());
  EXPECT_EQ(file->size_bytes().value(), 1 * kMiB);
}

TEST(DirectFile, CreatedWithMode0600) {
  strata::testing::TempDir dir;
  OpenOptions options;
  options.create = true;
  Result<DirectFile> file = DirectFile::open(dir.file("mode"), options);
  ASSERT_TRUE(file.ok());
  struct stat st {};
  ASSERT_EQ(::fstat(file->fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Result<DirectFile> missing = DirectFile::open(dir.file("nope"), OpenOptions{});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().kind, ErrorKind::not_found);
}

TEST(EngineConfigCheck, BadConfigIsRejectedNamingTheField) {
  EngineConfig config;
  config.queue_depth = 0;
  Result<std::unique_ptr<Engine>> e = make_engine(config);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("queue depth"), std::string::npos);
  config.queue_depth = 4;
  config.block_size_bytes = 1000;
  e = make_engine(config);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("block size"), std::string::npos);
  EXPECT_FALSE(parse_backend("spdk").ok());
}

}  // namespace
}  // namespace strata::io
