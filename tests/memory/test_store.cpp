// Proves the NVMe store round-trips hundreds of odd-sized tensors bit-exact through real
// O_DIRECT files (before and after reopen, striped or not), that a new version goes to fresh
// extents and becomes visible only on commit, that every flipped byte is caught by the
// checksums with the tensor, file and offset named, that a truncated / garbled / foreign
// manifest is refused with the files left byte-identical, and that ENOSPC (injected by the
// fault engine) or a full store while writing a version leaves the previous version intact;
// and that one extent read alone (what generation uses for a few embedding rows) returns
// exactly that slice of the tensor and is checked like a whole read; and that waiting an
// extent at a time (wait_some, the scheduler's I/O thread) makes progress every call, lets a
// second read start meanwhile, and verifies like wait; and that VerifyReads::once hashes an
// extent until this Store has seen it intact — never one it opened unseen or one that failed.
#include <sys/stat.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/size.h"
#include "io/fault_engine.h"
#include "memory/host_arena.h"
#include "memory/store.h"
#include "store_test_util.h"
#include "tests/support/temp_dir.h"

namespace strata::memory {
namespace {

using testing::AlignedBuffer;
using testing::fill_pattern;
using testing::matches_pattern;
using testing::slurp;
using testing::test_store_options;
using testing::read_and_wait;
using testing::write_and_wait;

struct TensorCase {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t size_bytes() const {
    uint64_t n = dtype_size_bytes(dtype);
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

// Hundreds of shapes whose byte sizes are mostly not multiples of 512 or 4096; a few span
// several extents.
std::vector<TensorCase> odd_cases(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TensorCase> cases;
  for (size_t i = 0; i < count; ++i) {
    TensorCase c;
    c.name = "layer." + std::to_string(i / 4) + ".w" + std::to_string(i % 4);
    c.dtype = static_cast<DType>(rng() % 3);
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 97);
    const int64_t cols = (i % 25 == 0) ? 1 + static_cast<int64_t>(rng() % 9000) : 1 + static_cast<int64_t>(rng() % 777);
    c.shape = (i % 3 == 0) ? std::vector<int64_t>{rows * cols} : std::vector<int64_t>{rows, cols};
    cases.push_back(c);
  }
  return cases;
}

TEST(Store, RoundTripOfHundredsOfOddSizedTensors) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  const std::vector<TensorCase> cases = odd_cases(300, 7);
  uint64_t total_bytes = 0;
  for (const auto& c : cases) total_bytes += c.size_bytes();

  std::vector<AlignedBuffer> written;
  {
    Result<Store> made = Store::create(dir, {}, 2 * total_bytes + (64 << 20), test_store_options());
    ASSERT_TRUE(made.ok()) << made.error().to_string();
    Store store = std::move(made).value();
    std::vector<StoreTicket> tickets;
    for (size_t i = 0; i < cases.size(); ++i) {
      written.emplace_back(cases[i].size_bytes());
      fill_pattern(written.back().data, cases[i].size_bytes(), i, 1);
      // Keep many writes in flight at once, as the scheduler will.
      Result<StoreTicket> ticket = store.write_tensor_async(cases[i].name, cases[i].dtype, cases[i].shape,
                                                            written.back().data, cases[i].size_bytes());
      ASSERT_TRUE(ticket.ok()) << ticket.error().to_string();
      tickets.push_back(*ticket);
      if (tickets.size() == 32) {
        for (StoreTicket t : tickets) ASSERT_TRUE(store.wait(t).ok());
        tickets.clear();
      }
    }
    for (StoreTicket t : tickets) ASSERT_TRUE(store.wait(t).ok());
    ASSERT_TRUE(store.commit(41, {{"data_position", "12345"}, {"rng", "abc"}}).ok());
    EXPECT_EQ(store.stats().tensor_count, cases.size());
  }

  Result<Store> opened = Store::open(dir, test_store_options());
  ASSERT_TRUE(opened.ok()) << opened.error().to_string();
  Store store = std::move(opened).value();
  EXPECT_EQ(store.committed_step(), 41u);
  EXPECT_EQ(store.committed_metadata().at("data_position"), "12345");
  EXPECT_EQ(store.list().size(), cases.size());

  HostArenaOptions arena_options;
  arena_options.capacity_bytes = total_bytes + cases.size() * 4096;
  Result<HostArena> arena = HostArena::create(arena_options);
  ASSERT_TRUE(arena.ok());
  ASSERT_TRUE(arena->register_with(store.engine()).ok());
  std::vector<HostBlock> blocks;
  std::vector<StoreTicket> tickets;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::optional<TensorRecord> record = store.find(cases[i].name);
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->dtype, cases[i].dtype);
    EXPECT_EQ(record->shape, cases[i].shape);
    EXPECT_EQ(record->size_bytes, cases[i].size_bytes());
    for (const Extent& extent : record->extents) EXPECT_EQ(extent.offset_bytes % store.alignment_bytes(), 0u);
    Result<HostBlock> block = arena->allocate(cases[i].size_bytes());
    ASSERT_TRUE(block.ok());
    std::memset(block->data, 0x5a, block->size_bytes);
    blocks.push_back(*block);
    Result<StoreTicket> ticket = store.read_tensor_async(cases[i].name, block->data, block->size_bytes);
    ASSERT_TRUE(ticket.ok()) << ticket.error().to_string();
    tickets.push_back(*ticket);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(store.wait(tickets[i]).ok());
    EXPECT_TRUE(matches_pattern(blocks[i].data, cases[i].size_bytes(), i, 1)) << cases[i].name;
    arena->free(blocks[i]);
  }
  Result<VerifyReport> report = store.verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
  EXPECT_EQ(report->tensor_count, cases.size());
  EXPECT_EQ(report->bytes_checked, total_bytes);
}

// A data path with ".." (a config's `../data` beside its folder) is named normalized in the
// manifest, so the store that create made opens again (it was refused as not normalized).
TEST(Store, DataPathWithDotDotOpensAfterCreate) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  ASSERT_TRUE(std::filesystem::create_directory(temp.file("configs")));
  const std::string data_path = temp.file("configs") + "/../a.strata";
  StoreOptions options = test_store_options();
  options.external_data_paths = {data_path};
  {
    Result<Store> made = Store::create(dir, {data_path}, 1 << 20, options);
    ASSERT_TRUE(made.ok()) << made.error().to_string();
    ASSERT_TRUE(made->commit(1, {}).ok());
  }
  Result<Store> store = Store::open(dir, options);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  EXPECT_EQ(store->committed_step(), 1u);
  EXPECT_TRUE(std::filesystem::is_regular_file(temp.file("a.strata")));
}

TEST(Store, StripedOverTwoFilesRoundTrips) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  StoreOptions options = test_store_options();
  options.stripe_bytes = 64 * 1024;
  // Data files outside the store folder: a writable open accepts them only when listed.
  options.external_data_paths = {temp.file("a.strata"), temp.file("b.strata")};
  const std::vector<int64_t> shape{300001};
  AlignedBuffer data(300001 * 2);
  fill_pattern(data.data, data.size, 3, 9);
  {
    Result<Store> made = Store::create(dir, {temp.file("a.strata"), temp.file("b.strata")}, 8 << 20, options);
    ASSERT_TRUE(made.ok()) << made.error().to_string();
    EXPECT_EQ(made->stats().files.size(), 2u);
    Result<StoreTicket> ticket = made->write_tensor_async("x", DType::bf16, shape, data.data, data.size);
    ASSERT_TRUE(ticket.ok());
    ASSERT_TRUE(made->wait(*ticket).ok());
    ASSERT_TRUE(made->commit(1, {}).ok());
  }

  Result<Store> store = Store::open(dir, options);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  AlignedBuffer back(data.size);
  Status read = read_and_wait(*store, "x", back.data, back.size);
  ASSERT_TRUE(read.ok()) << read.to_string();
  EXPECT_TRUE(matches_pattern(back.data, back.size, 3, 9));
  // Both files really hold data: the stripe put bytes of x in each.
  EXPECT_GT(std::filesystem::file_size(temp.file("a.strata")), 0u);
  EXPECT_GT(std::filesystem::file_size(temp.file("b.strata")), 0u);
}

TEST(Store, FilesAre0600AndCreateNeverOverwrites) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  {
    Result<Store> made = Store::create(dir, {}, 1 << 20, test_store_options());
    ASSERT_TRUE(made.ok()) << made.error().to_string();
  }
  for (const char* name : {"manifest.json", "data.strata"}) {
    struct stat st {};
    ASSERT_EQ(::stat((dir + "/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
  }
  const std::string before = slurp(dir + "/manifest.json");
  Result<Store> again = Store::create(dir, {}, 1 << 20, test_store_options());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(slurp(dir + "/manifest.json"), before);
  // A data path that exists is refused too.
  Result<Store> clash = Store::create(temp.file("other"), {dir + "/data.strata"}, 1 << 20, test_store_options());
  ASSERT_FALSE(clash.ok());
  EXPECT_FALSE(std::filesystem::exists(temp.file("other/manifest.json")));
}

TEST(Store, NewVersionsGoToFreshExtentsAndAppearOnlyOnCommit) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  Result<Store> made = Store::create(dir, {}, 16 << 20, test_store_options());
  ASSERT_TRUE(made.ok());
  Store store = std::move(made).value();
  const std::vector<int64_t> shape{1000, 333};
  const uint64_t size = 1000 * 333 * 4;
  AlignedBuffer v1(size), v2(size), back(size);
  fill_pattern(v1.data, size, 0, 1);
  fill_pattern(v2.data, size, 0, 2);

  ASSERT_TRUE(write_and_wait(store, "t", DType::f32, shape, v1.data, size).ok());
  ASSERT_TRUE(store.commit(1, {}).ok());
  const TensorRecord first = *store.find("t");
  const uint64_t used_one = store.stats().used_bytes;

  ASSERT_TRUE(write_and_wait(store, "t", DType::f32, shape, v2.data, size).ok());
  const TensorRecord second = *store.find("t");
  EXPECT_FALSE(second.committed);
  std::set<uint64_t> old_offsets;
  for (const Extent& e : first.extents) old_offsets.insert(e.offset_bytes);
  for (const Extent& e : second.extents) EXPECT_EQ(old_offsets.count(e.offset_bytes), 0u) << "reused a committed extent";
  EXPECT_EQ(store.stats().used_bytes, 2 * used_one);  // both versions held until the commit

  // The store itself reads its newest write; another opener sees only the committed one.
  ASSERT_TRUE(read_and_wait(store, "t", back.data, size).ok());
  EXPECT_TRUE(matches_pattern(back.data, size, 0, 2));
  {
    Result<Store> reader = Store::open(dir, test_store_options());
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ(reader->committed_step(), 1u);
    ASSERT_TRUE(read_and_wait(*reader, "t", back.data, size).ok());
    EXPECT_TRUE(matches_pattern(back.data, size, 0, 1));
  }
  ASSERT_TRUE(store.commit(2, {}).ok());
  EXPECT_EQ(store.stats().used_bytes, used_one);  // the old extents were freed after the commit
  EXPECT_DOUBLE_EQ(store.stats().fragmentation, store.stats().fragmentation);

  // Removal: visible until committed elsewhere, gone after.
  ASSERT_TRUE(store.remove_tensor("t").ok());
  EXPECT_FALSE(store.find("t").has_value());
  EXPECT_EQ(store.remove_tensor("never").error().kind, ErrorKind::not_found);
  ASSERT_TRUE(store.commit(3, {}).ok());
  EXPECT_EQ(store.stats().used_bytes, 0u);
  EXPECT_EQ(store.stats().largest_free_bytes, store.stats().capacity_bytes);  // coalesced back
  Result<Store> reader = Store::open(dir, test_store_options());
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE(reader->list().empty());
  EXPECT_EQ(reader->read_tensor_async("t", back.data, size).error().kind, ErrorKind::not_found);
}

TEST(Store, UncommittedWritesAreForgottenOnReopen) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  const uint64_t size = 777 * 2;
  AlignedBuffer a(size), b(size), back(size);
  fill_pattern(a.data, size, 1, 1);
  fill_pattern(b.data, size, 1, 2);
  {
    Store store = std::move(Store::create(dir, {}, 1 << 20, test_store_options())).value();
    ASSERT_TRUE(write_and_wait(store, "a", DType::f16, std::vector<int64_t>{777}, a.data, size).ok());
    ASSERT_TRUE(store.commit(5, {{"k", "v"}}).ok());
    ASSERT_TRUE(write_and_wait(store, "a", DType::f16, std::vector<int64_t>{777}, b.data, size).ok());
    ASSERT_TRUE(write_and_wait(store, "b", DType::f16, std::vector<int64_t>{777}, b.data, size).ok());
  }  // dropped without commit
  Store store = std::move(Store::open(dir, test_store_options())).value();
  EXPECT_EQ(store.committed_step(), 5u);
  EXPECT_EQ(store.list().size(), 1u);
  ASSERT_TRUE(read_and_wait(store, "a", back.data, size).ok());
  EXPECT_TRUE(matches_pattern(back.data, size, 1, 1));
  // The space the forgotten version used is free again.
  EXPECT_EQ(store.stats().used_bytes, 4096u);
}

// Flips one byte at a time at random places inside committed extents (through a separate
// buffered fd, as a failing drive or a stray writer would) and checks that both a read and
// verify() catch it and name the tensor, the file and the extent's offset.
TEST(Store, EveryFlippedByteIsDetectedAndNamed) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  const std::vector<TensorCase> cases = odd_cases(12, 99);
  {
    Store store = std::move(Store::create(dir, {}, 16 << 20, test_store_options())).value();
    for (size_t i = 0; i < cases.size(); ++i) {
      AlignedBuffer data(cases[i].size_bytes());
      fill_pattern(data.data, data.size, i, 3);
      ASSERT_TRUE(write_and_wait(store, cases[i].name, cases[i].dtype, cases[i].shape, data.data, data.size).ok());
    }
    ASSERT_TRUE(store.commit(3, {}).ok());
  }
  const std::string data_path = std::filesystem::absolute(dir + "/data.strata").string();
  std::mt19937_64 rng(1234);
  for (int round = 0; round < 24; ++round) {
    Store store = std::move(Store::open(dir, test_store_options())).value();
    const size_t index = rng() % cases.size();
    const TensorRecord record = *store.find(cases[index].name);
    const Extent extent = record.extents[rng() % record.extents.size()];
    const uint64_t flip_at = extent.offset_bytes + rng() % extent.length_bytes;

    int fd = ::open(data_path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(flip_at)), 1);
    const unsigned char flipped = byte ^ static_cast<unsigned char>(1u << (rng() % 8));
    ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(flip_at)), 1);
    ASSERT_EQ(::fsync(fd), 0);

    AlignedBuffer back(record.size_bytes);
    Status read = read_and_wait(store, record.name, back.data, back.size);
    ASSERT_FALSE(read.ok()) << "flip at " << flip_at << " in " << record.name << " went unnoticed";
    EXPECT_EQ(read.error().kind, ErrorKind::corrupt);
    EXPECT_EQ(read.error().tensor, record.name);
    EXPECT_EQ(read.error().path, data_path);
    EXPECT_EQ(read.error().offset_bytes, extent.offset_bytes);
    EXPECT_NE(read.error().to_string().find(record.name), std::string::npos);

    Result<VerifyReport> report = store.verify();
    ASSERT_TRUE(report.ok());
    ASSERT_EQ(report->damages.size(), 1u);
    EXPECT_EQ(report->damages[0].tensor, record.name);
    EXPECT_EQ(report->damages[0].path, data_path);
    EXPECT_EQ(report->damages[0].file_offset_bytes, extent.offset_bytes);

    ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(flip_at)), 1);  // repair
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
    report = store.verify();
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok());
  }
}

// Flips one bit of the data file at `at` (twice: repairs it).
void flip_bit(const std::string& data_path, uint64_t at) {
  int fd = ::open(data_path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(at)), 1);
  byte ^= 0x04;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(at)), 1);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

TEST(Store, VerifyReadsOnceHashesAnExtentUntilItIsSeenIntact) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  const std::string data_path = std::filesystem::absolute(dir + "/data.strata").string();
  const std::vector<int64_t> shape = {300000};  // 1.2 MB: five extents
  const uint64_t size = 300000 * 4;
  AlignedBuffer data(size), back(size);
  StoreOptions options = test_store_options();
  options.verify_reads = VerifyReads::once;
  {
    Store store = std::move(Store::create(dir, {}, 16 << 20, options)).value();
    for (uint64_t t = 0; t < 2; ++t) {
      fill_pattern(data.data, size, t, 1);
      ASSERT_TRUE(write_and_wait(store, t == 0 ? "a" : "b", DType::f32, shape, data.data, size).ok());
    }
    ASSERT_TRUE(store.commit(1, {}).ok());
    // What this Store wrote it hashed from memory: read back, trusted, not hashed again...
    ASSERT_TRUE(read_and_wait(store, "a", back.data, size).ok());
    EXPECT_TRUE(matches_pattern(back.data, size, 0, 1));
    EXPECT_EQ(store.stats().bytes_read_trusted, size);
    // ...which is the trade `once` makes: damage appearing after that goes unseen until reopen.
    flip_bit(data_path, store.find("a")->extents[1].offset_bytes + 17);
    EXPECT_TRUE(read_and_wait(store, "a", back.data, size).ok());
  }
  Store store = std::move(Store::open(dir, options)).value();
  const uint64_t damaged_bytes = store.find("a")->extents[1].length_bytes;
  // Reads `name`; how many of its bytes were trusted (all ones: the read failed).
  auto trusted_by = [&](const char* name) -> uint64_t {
    const uint64_t before = store.stats().bytes_read_trusted;
    Status read = read_and_wait(store, name, back.data, size);
    return read.ok() ? store.stats().bytes_read_trusted - before : ~uint64_t{0};
  };
  // Opened, nothing is trusted: the damage in "a" is found on the first read — and on the next,
  // which trusts only the four extents the first one verified (a failed extent is never marked).
  for (int round = 0; round < 2; ++round) {
    const uint64_t before = store.stats().bytes_read_trusted;
    Status read = read_and_wait(store, "a", back.data, size);
    ASSERT_FALSE(read.ok()) << "round " << round;
    EXPECT_EQ(read.error().kind, ErrorKind::corrupt);
    EXPECT_EQ(read.error().tensor, "a");
    EXPECT_EQ(read.error().offset_bytes, store.find("a")->extents[1].offset_bytes);
    EXPECT_EQ(store.stats().bytes_read_trusted - before, round == 0 ? 0 : size - damaged_bytes);
  }
  flip_bit(data_path, store.find("a")->extents[1].offset_bytes + 17);  // repaired
  // The first read of "b" verifies every extent, the second trusts them all.
  EXPECT_EQ(trusted_by("b"), 0u);
  EXPECT_EQ(trusted_by("b"), size);
  EXPECT_TRUE(matches_pattern(back.data, size, 1, 1));
  // "a": the repaired extent is verified now, then every extent is trusted.
  EXPECT_EQ(trusted_by("a"), size - damaged_bytes);
  EXPECT_EQ(trusted_by("a"), size);
  EXPECT_TRUE(matches_pattern(back.data, size, 0, 1));
  // A new version written through this Store is trusted from its first read.
  fill_pattern(data.data, size, 0, 2);
  ASSERT_TRUE(write_and_wait(store, "a", DType::f32, shape, data.data, size).ok());
  EXPECT_EQ(trusted_by("a"), size);
  EXPECT_TRUE(matches_pattern(back.data, size, 0, 2));
}

TEST(Store, VerifyReadsAlwaysHashesEveryRead) {
  strata::testing::TempDir temp;
  const uint64_t size = 300000 * 4;
  AlignedBuffer data(size), back(size);
  fill_pattern(data.data, size, 3, 1);
  Store store = std::move(Store::create(temp.file("store"), {}, 16 << 20, test_store_options())).value();
  ASSERT_EQ(store.stats().bytes_read_trusted, 0u);
  const std::vector<int64_t> shape = {300000};
  ASSERT_TRUE(write_and_wait(store, "a", DType::f32, shape, data.data, size).ok());
  for (int round = 0; round < 3; ++round) ASSERT_TRUE(read_and_wait(store, "a", back.data, size).ok());
  EXPECT_EQ(store.stats().bytes_read, 3 * size);
  EXPECT_EQ(store.stats().bytes_read_trusted, 0u);
}

TEST(Store, WaitSomeMovesAnExtentAtATimeAndVerifiesLikeWait) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  constexpr uint64_t kBytes = 4 << 20;  // 16 extents of 256 KiB
  const std::vector<int64_t> shape = {int64_t{kBytes / 4}};
  Store store = std::move(Store::create(dir, {}, 64 << 20, test_store_options())).value();
  for (const char* name : {"a", "b"}) {
    AlignedBuffer data(kBytes);
    fill_pattern(data.data, data.size, name[0], 5);
    ASSERT_TRUE(write_and_wait(store, name, DType::f32, shape, data.data, data.size).ok());
  }
  ASSERT_TRUE(store.commit(1, {}).ok());
  const size_t extents = store.find("a")->extents.size();
  ASSERT_GE(extents, 16u);

  AlignedBuffer a(kBytes), b(kBytes);
  StoreTicket first = std::move(store.read_tensor_async("a", a.data, a.size)).value();
  bool first_done = store.wait_some(first);
  // The pump's next read, submitted while the first is still an open op (not yet waited for).
  StoreTicket second = std::move(store.read_tensor_async("b", b.data, b.size)).value();
  size_t not_done = 0;
  while (!first_done) {
    ++not_done;
    ASSERT_LE(not_done, extents) << "wait_some returned without finishing an extent";
    first_done = store.wait_some(first);
  }
  ASSERT_TRUE(store.wait(first).ok());
  EXPECT_TRUE(matches_pattern(a.data, a.size, 'a', 5));
  while (!store.wait_some(second)) {
  }
  ASSERT_TRUE(store.wait(second).ok());
  EXPECT_TRUE(matches_pattern(b.data, b.size, 'b', 5));

  // A flipped byte: wait_some finishes the op, wait names the damage as it always does.
  const Extent extent = store.find("a")->extents[extents / 2];
  const std::string data_path = std::filesystem::absolute(dir + "/data.strata").string();
  int fd = ::open(data_path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(extent.offset_bytes)), 1);
  byte ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(extent.offset_bytes)), 1);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
  StoreTicket again = std::move(store.read_tensor_async("a", a.data, a.size)).value();
  while (!store.wait_some(again)) {
  }
  Status read = store.wait(again);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.error().kind, ErrorKind::corrupt);
  EXPECT_EQ(read.error().offset_bytes, extent.offset_bytes);
}

TEST(Store, OneExtentReadAloneIsThatSliceAndIsVerified) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  const std::vector<int64_t> shape = {1000, 331};  // 1.26 MiB: five extents of 256 KiB and a short sixth
  const uint64_t size = 1000 * 331 * 4;
  AlignedBuffer data(size);
  fill_pattern(data.data, size, 7, 1);
  Store store = std::move(Store::create(dir, {}, 16 << 20, test_store_options())).value();
  ASSERT_TRUE(write_and_wait(store, "embed", DType::f32, shape, data.data, size).ok());
  ASSERT_TRUE(store.commit(1, {}).ok());
  const TensorRecord record = *store.find("embed");
  ASSERT_EQ(record.extents.size(), 6u);
  AlignedBuffer piece(256 * 1024);
  uint64_t offset = 0;
  for (size_t e = record.extents.size(); e-- > 0;) {  // any order
    std::memset(piece.data, 0, piece.size);
    Result<StoreTicket> ticket = store.read_extent_async("embed", e, piece.data, piece.size);
    ASSERT_TRUE(ticket.ok()) << ticket.status().to_string();
    ASSERT_TRUE(store.wait(*ticket).ok());
    uint64_t start = 0;
    for (size_t k = 0; k < e; ++k) start += record.extents[k].length_bytes;
    EXPECT_EQ(std::memcmp(piece.data, data.data + start, record.extents[e].length_bytes), 0) << "extent " << e;
    offset += record.extents[e].length_bytes;
  }
  EXPECT_EQ(offset, size);
  EXPECT_EQ(store.read_extent_async("embed", 6, piece.data, piece.size).error().kind, ErrorKind::not_found);
  EXPECT_EQ(store.read_extent_async("nope", 0, piece.data, piece.size).error().kind, ErrorKind::not_found);
  EXPECT_EQ(store.read_extent_async("embed", 0, piece.data, 4096).error().kind, ErrorKind::invalid_argument);

  // A flipped byte in extent 2: that extent alone is refused, naming the tensor; extent 1 reads fine.
  const std::string data_path = std::filesystem::absolute(dir + "/data.strata").string();
  int fd = ::open(data_path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const uint64_t flip_at = record.extents[2].offset_bytes + 1234;
  unsigned char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(flip_at)), 1);
  const unsigned char flipped = byte ^ 0x10;
  ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(flip_at)), 1);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
  Result<StoreTicket> bad = store.read_extent_async("embed", 2, piece.data, piece.size);
  ASSERT_TRUE(bad.ok());
  Status read = store.wait(*bad);
  ASSERT_FALSE(read.ok()) << "a flipped byte in a lone extent read went unnoticed";
  EXPECT_EQ(read.error().kind, ErrorKind::corrupt);
  EXPECT_EQ(read.error().tensor, "embed");
  EXPECT_EQ(read.error().offset_bytes, record.extents[2].offset_bytes);
  Result<StoreTicket> good = store.read_extent_async("embed", 1, piece.data, piece.size);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(store.wait(*good).ok());
}

class ManifestRefusal : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_.file("store");
    Store store = std::move(Store::create(dir_, {}, 4 << 20, test_store_options())).value();
    AlignedBuffer data(5000 * 4);
    fill_pattern(data.data, data.size, 0, 1);
    ASSERT_TRUE(write_and_wait(store, "w", DType::f32, std::vector<int64_t>{5000}, data.data, data.size).ok());
    ASSERT_TRUE(store.commit(9, {}).ok());
    manifest_ = slurp(dir_ + "/manifest.json");
    data_ = slurp(dir_ + "/data.strata");
  }
  void replace_manifest(const std::string& text) {
    int fd = ::open((dir_ + "/manifest.json").c_str(), O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }
  // The store must be refused and leave every file exactly as it was.
  void expect_refused(ErrorKind kind, const std::string& must_mention) {
    const std::string manifest_now = slurp(dir_ + "/manifest.json");
    Result<Store> store = Store::open(dir_, test_store_options());
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.error().kind, kind) << store.error().to_string();
    EXPECT_NE(store.error().to_string().find(must_mention), std::string::npos) << store.error().to_string();
    EXPECT_NE(store.error().to_string().find("nothing was changed"), std::string::npos);
    EXPECT_EQ(slurp(dir_ + "/manifest.json"), manifest_now);
    EXPECT_EQ(slurp(dir_ + "/data.strata"), data_);
  }
  strata::testing::TempDir temp_;
  std::string dir_;
  std::string manifest_;
  std::string data_;
};

TEST_F(ManifestRefusal, Truncated) {
  for (size_t keep : {manifest_.size() / 2, manifest_.size() - 3, size_t{1}}) {
    replace_manifest(manifest_.substr(0, keep));
    expect_refused(ErrorKind::corrupt, "not valid JSON");
  }
  replace_manifest("");
  expect_refused(ErrorKind::corrupt, "manifest");
}

TEST_F(ManifestRefusal, Garbled) {
  std::string garbled = manifest_;
  garbled[garbled.size() / 3] = '\x01';
  replace_manifest(garbled);
  expect_refused(ErrorKind::corrupt, "manifest");
  // Valid JSON with a field of the wrong type.
  std::string wrong = manifest_;
  const size_t at = wrong.find("\"step\": 9");
  ASSERT_NE(at, std::string::npos);
  wrong.replace(at, 9, "\"step\": \"nine\"");
  replace_manifest(wrong);
  expect_refused(ErrorKind::corrupt, "wrong type");
  // Extents that do not add up to the tensor's size are refused, not trusted.
  std::string overlap = manifest_;
  const size_t length_at = overlap.find("\"length\": 20000");
  ASSERT_NE(length_at, std::string::npos);
  overlap.replace(length_at, 15, "\"length\": 20001");
  replace_manifest(overlap);
  expect_refused(ErrorKind::corrupt, "extents hold");
}

TEST_F(ManifestRefusal, OtherFormatVersion) {
  std::string other = manifest_;
  const size_t at = other.find("\"format_version\": 1");
  ASSERT_NE(at, std::string::npos);
  other.replace(at, 19, "\"format_version\": 2");
  replace_manifest(other);
  expect_refused(ErrorKind::unsupported, "format version 2");
}

// Issue 12: a manifest is untrusted input. One that names a data file by '..', by a relative
// path with a folder, or by an absolute path the caller did not configure would make a
// writable open write outside the store folder: refused, with every file unchanged. Before the
// fix each of these opened (the first two failed only if the file was missing; the absolute
// one opened a file outside the store for writing).
TEST_F(ManifestRefusal, DataFilesOutsideTheStoreFolder) {
  const std::string outside = temp_.file("outside.strata");
  ASSERT_TRUE(std::filesystem::copy_file(dir_ + "/data.strata", outside));
  ASSERT_EQ(::mkdir((dir_ + "/sub").c_str(), 0700), 0);
  ASSERT_TRUE(std::filesystem::copy_file(dir_ + "/data.strata", dir_ + "/sub/data.strata"));
  const size_t at = manifest_.find("\"data.strata\"");
  ASSERT_NE(at, std::string::npos);
  const std::string outside_before = slurp(outside);
  for (const std::string& named : {std::string("../outside.strata"), std::string("sub/data.strata"), outside,
                                   dir_ + "/../outside.strata"}) {
    std::string tampered = manifest_;
    tampered.replace(at, 13, "\"" + named + "\"");
    replace_manifest(tampered);
    expect_refused(ErrorKind::corrupt, "data file");
  }
  EXPECT_EQ(slurp(outside), outside_before);
  // The same absolute path, listed by the caller, opens (how `strata train` keeps one data
  // file per NVMe drive); read-only opens write nothing and accept it too.
  std::string tampered = manifest_;
  tampered.replace(at, 13, "\"" + outside + "\"");
  replace_manifest(tampered);
  StoreOptions listed = test_store_options();
  listed.external_data_paths = {outside};
  Result<Store> opened = Store::open(dir_, listed);
  EXPECT_TRUE(opened.ok()) << opened.error().to_string();
  StoreOptions read_only = test_store_options();
  read_only.read_only = true;
  EXPECT_TRUE(Store::open(dir_, read_only).ok());
}

// A manifest that is not a regular file (a FIFO would block the read forever: a hang before
// the fix) or is over kMaxManifestBytes (read whole into memory before the fix) is refused.
TEST_F(ManifestRefusal, NotARegularFileOrTooLarge) {
  const std::string manifest_path = dir_ + "/manifest.json";
  ASSERT_EQ(::truncate(manifest_path.c_str(), static_cast<off_t>(kMaxManifestBytes + 1)), 0);
  Result<Store> huge = Store::open(dir_, test_store_options());
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().kind, ErrorKind::corrupt);
  EXPECT_NE(huge.error().to_string().find("over the limit"), std::string::npos) << huge.error().to_string();
  EXPECT_NE(huge.error().to_string().find("nothing was changed"), std::string::npos) << huge.error().to_string();
  EXPECT_EQ(std::filesystem::file_size(manifest_path), kMaxManifestBytes + 1);
  ASSERT_EQ(::unlink(manifest_path.c_str()), 0);
  ASSERT_EQ(::mkfifo(manifest_path.c_str(), 0600), 0);
  Result<Store> store = Store::open(dir_, test_store_options());
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.error().to_string().find("not a regular file"), std::string::npos) << store.error().to_string();
  EXPECT_EQ(slurp(dir_ + "/data.strata"), data_);
}

// A shape whose element count overflows 64 bits used to wrap: [5000, 2^62 + 1] counts
// 5000·2^62 + 5000 ≡ 5000 (mod 2^64) elements, so it matched the 20000 bytes recorded and
// opened. The count saturates now, and the shape is refused.
TEST_F(ManifestRefusal, ShapeWhoseProductOverflows) {
  std::string tampered = manifest_;
  const size_t begin = tampered.find("\"shape\": [");
  ASSERT_NE(begin, std::string::npos);
  const size_t end = tampered.find(']', begin);
  tampered.replace(begin, end + 1 - begin, "\"shape\": [5000, 4611686018427387905]");
  replace_manifest(tampered);
  expect_refused(ErrorKind::corrupt, "size does not match");
}

TEST_F(ManifestRefusal, TruncatedDataFile) {
  ASSERT_EQ(::truncate((dir_ + "/data.strata").c_str(), 1 << 20), 0);
  data_ = slurp(dir_ + "/data.strata");
  expect_refused(ErrorKind::corrupt, "truncated");
}

// The fault engine lets writes move a fixed number of bytes, then fails them with ENOSPC
// mid-version. The new version must not become visible, the old one must read back exact.
TEST(Store, EnospcWhileWritingAVersionKeepsThePreviousOne) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  auto plan = std::make_shared<io::FaultPlan>();
  StoreOptions options = test_store_options();
  options.engine_factory = [plan](const io::EngineConfig& config) { return io::make_fault_engine(config, plan); };
  const std::vector<TensorCase> cases = odd_cases(20, 5);
  {
    Store store = std::move(Store::create(dir, {}, 32 << 20, options)).value();
    for (size_t i = 0; i < cases.size(); ++i) {
      AlignedBuffer data(cases[i].size_bytes());
      fill_pattern(data.data, data.size, i, 1);
      ASSERT_TRUE(write_and_wait(store, cases[i].name, cases[i].dtype, cases[i].shape, data.data, data.size).ok());
    }
    ASSERT_TRUE(store.commit(1, {{"step", "1"}}).ok());

    // Version 2 runs out of space part-way.
    io::FaultRules rules;
    rules.write_budget_bytes = plan->counters().bytes_written + 300 * 1024;
    plan->set_rules(rules);
    std::vector<AlignedBuffer> buffers;
    std::vector<StoreTicket> tickets;
    for (size_t i = 0; i < cases.size(); ++i) {
      buffers.emplace_back(cases[i].size_bytes());
      fill_pattern(buffers.back().data, buffers.back().size, i, 2);
      Result<StoreTicket> ticket = store.write_tensor_async(cases[i].name, cases[i].dtype, cases[i].shape,
                                                            buffers.back().data, buffers.back().size);
      ASSERT_TRUE(ticket.ok());
      tickets.push_back(*ticket);
    }
    // Commit without waiting: it must fail, and commit nothing.
    Status committed = store.commit(2, {{"step", "2"}});
    ASSERT_FALSE(committed.ok());
    EXPECT_EQ(committed.error().kind, ErrorKind::no_space) << committed.error().to_string();
    EXPECT_FALSE(committed.error().tensor.empty());
    EXPECT_GT(plan->counters().enospc_injected, 0u);
    size_t failed = 0;
    for (StoreTicket t : tickets) failed += store.wait(t).ok() ? 0 : 1;
    EXPECT_GT(failed, 0u);
    EXPECT_EQ(store.committed_step(), 1u);
  }
  plan->set_rules(io::FaultRules{});
  Store store = std::move(Store::open(dir, options)).value();
  EXPECT_EQ(store.committed_step(), 1u);
  EXPECT_EQ(store.committed_metadata().at("step"), "1");
  for (size_t i = 0; i < cases.size(); ++i) {
    AlignedBuffer back(cases[i].size_bytes());
    ASSERT_TRUE(read_and_wait(store, cases[i].name, back.data, back.size).ok());
    EXPECT_TRUE(matches_pattern(back.data, back.size, i, 1)) << cases[i].name;
  }
  EXPECT_TRUE(store.verify()->ok());
}

TEST(Store, AFullStoreRefusesAWriteAndKeepsTheCommittedVersion) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  Store store = std::move(Store::create(dir, {}, 1 << 20, test_store_options())).value();
  AlignedBuffer big(600 * 1024), back(600 * 1024);
  fill_pattern(big.data, big.size, 0, 1);
  const std::vector<int64_t> shape{600 * 1024};
  ASSERT_TRUE(write_and_wait(store, "big", DType::bf16, std::vector<int64_t>{300 * 1024}, big.data, big.size).ok());
  ASSERT_TRUE(store.commit(1, {}).ok());
  // A second version needs fresh extents while the first is still held: 1.2 MiB > 1 MiB.
  fill_pattern(big.data, big.size, 0, 2);
  Result<StoreTicket> refused = store.write_tensor_async("big", DType::bf16, std::vector<int64_t>{300 * 1024}, big.data, big.size);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind, ErrorKind::no_space);
  EXPECT_EQ(refused.error().tensor, "big");
  ASSERT_TRUE(store.commit(2, {}).ok());
  ASSERT_TRUE(read_and_wait(store, "big", back.data, back.size).ok());
  EXPECT_TRUE(matches_pattern(back.data, back.size, 0, 1));
}

TEST(Store, InjectedEioOnReadNamesTheTensor) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  auto plan = std::make_shared<io::FaultPlan>();
  StoreOptions options = test_store_options();
  options.engine_factory = [plan](const io::EngineConfig& config) { return io::make_fault_engine(config, plan); };
  Store store = std::move(Store::create(dir, {}, 4 << 20, options)).value();
  AlignedBuffer data(100000);
  fill_pattern(data.data, data.size, 0, 1);
  ASSERT_TRUE(write_and_wait(store, "e", DType::f32, std::vector<int64_t>{25000}, data.data, data.size).ok());
  ASSERT_TRUE(store.commit(1, {}).ok());
  const Extent extent = store.find("e")->extents.front();
  io::FaultRules rules;
  rules.eio = io::FaultRules::Eio{extent.offset_bytes + 10, "", true, false, 0};
  plan->set_rules(rules);
  Status status = read_and_wait(store, "e", data.data, data.size);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().kind, ErrorKind::io);
  EXPECT_EQ(status.error().tensor, "e");
  EXPECT_NE(status.error().path.find("data.strata"), std::string::npos);
}

}  // namespace
}  // namespace strata::memory
