// Proves that a crash at any instant leaves the last committed version of the store intact:
// a forked child writes and commits version after version (content, sizes and even the set
// of tensors derive from the version number) and is SIGKILLed at a random moment — 36 times,
// seeded. The child reports each commit it starts and finishes through a pipe; after every
// kill the parent reopens the store and requires exactly the last committed version (or the
// one whose commit was in flight, if its rename had landed), every tensor bit-exact, verify
// clean — and the next child continues on top of whatever the crash left behind.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
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
using testing::test_store_options;

constexpr int kKills = 36;

struct Expected {
  std::string name;
  uint64_t index;
  int64_t elements;  // fp32
};

// What version `v` holds: five tensors whose sizes change with v, and a sixth that exists only
// in odd versions (so commits also add and remove tensors).
std::vector<Expected> tensors_of(uint64_t version) {
  const int64_t wobble = static_cast<int64_t>(version % 3) * 1111;
  std::vector<Expected> out = {
      {"embed", 0, 1021 + wobble},
      {"h.0.attn", 1, 25000 + wobble},
      {"h.0.mlp", 2, 180001 + wobble},
      {"h.1.attn", 3, 333333 - wobble},
      {"head", 4, 77 + wobble},
  };
  if (version % 2 == 1) out.push_back({"odd.only", 5, 4099 + wobble});
  return out;
}

struct Message {
  char kind;  // 'A' commit attempted, 'C' committed, 'E' child error
  uint64_t version;
};

// The child: continue from the committed version, forever, until killed.
[[noreturn]] void child_main(const std::string& dir, int pipe_fd) {
  auto report = [pipe_fd](char kind, uint64_t version) {
    Message message{kind, version};
    if (::write(pipe_fd, &message, sizeof message) != sizeof message) _exit(4);
  };
  Result<Store> opened = Store::open(dir, test_store_options());
  if (!opened.ok()) {
    std::fprintf(stderr, "child: %s\n", opened.error().to_string().c_str());
    report('E', 0);
    _exit(2);
  }
  Store store = std::move(opened).value();
  for (uint64_t version = store.committed_step() + 1;; ++version) {
    const std::vector<Expected> tensors = tensors_of(version);
    std::vector<AlignedBuffer> buffers;
    std::vector<StoreTicket> tickets;
    buffers.reserve(tensors.size());
    for (const Expected& t : tensors) {
      buffers.emplace_back(static_cast<uint64_t>(t.elements) * 4);
      fill_pattern(buffers.back().data, buffers.back().size, t.index, version);
      Result<StoreTicket> ticket = store.write_tensor_async(t.name, DType::f32, std::vector<int64_t>{t.elements},
                                                            buffers.back().data, buffers.back().size);
      if (!ticket.ok()) {
        std::fprintf(stderr, "child: %s\n", ticket.error().to_string().c_str());
        report('E', version);
        _exit(2);
      }
      tickets.push_back(*ticket);
    }
    if (version % 2 == 0 && store.find("odd.only").has_value()) {
      if (!store.remove_tensor("odd.only").ok()) _exit(2);
    }
    for (StoreTicket ticket : tickets) {
      if (!store.wait(ticket).ok()) _exit(2);
    }
    report('A', version);
    Status committed = store.commit(version, {{"step", std::to_string(version)}});
    if (!committed.ok()) {
      std::fprintf(stderr, "child: %s\n", committed.to_string().c_str());
      report('E', version);
      _exit(2);
    }
    report('C', version);
  }
}

TEST(StoreCrash, SigkillAtRandomPointsAlwaysLeavesTheLastCommit) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  {
    Result<Store> made = Store::create(dir, {}, 64 << 20, test_store_options());
    ASSERT_TRUE(made.ok()) << made.error().to_string();
  }
  // The kill window must reach past the first commit, however slow this build is (a sanitized
  // one opens and commits several times slower): time one child's first commit on a store of
  // its own, and kill anywhere up to three times that (at least 120 ms).
  uint64_t window_us = 120000;
  {
    const std::string probe_dir = temp.file("probe");
    {
      Result<Store> made = Store::create(probe_dir, {}, 64 << 20, test_store_options());
      ASSERT_TRUE(made.ok()) << made.error().to_string();
    }
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const auto start = std::chrono::steady_clock::now();
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      child_main(probe_dir, fds[1]);
    }
    ::close(fds[1]);
    Message message{};
    while (::read(fds[0], &message, sizeof message) == static_cast<ssize_t>(sizeof message) && message.kind == 'A') {
    }
    const auto first_commit_us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
    ::kill(pid, SIGKILL);
    int wait_status = 0;
    ::waitpid(pid, &wait_status, 0);
    ::close(fds[0]);
    ASSERT_EQ(message.kind, 'C') << "the probe child did not commit";
    window_us = std::max<uint64_t>(window_us, 3 * static_cast<uint64_t>(first_commit_us));
  }
  std::printf("first commit in this build: kills land within %llu us of the child's start\n",
              static_cast<unsigned long long>(window_us));

  std::mt19937_64 rng(0x5747a7a);
  uint64_t known_committed = 0;
  int kills_during_commit = 0;   // an 'A' without its 'C'
  int reopened_newer = 0;        // the rename had landed before the kill
  uint64_t commits_total = 0;

  for (int kill_index = 0; kill_index < kKills; ++kill_index) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      child_main(dir, fds[1]);
    }
    ::close(fds[1]);
    // Kill anywhere from "still opening the store" to "several commits in".
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % window_us));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int wait_status = 0;
    ASSERT_EQ(::waitpid(pid, &wait_status, 0), pid);

    uint64_t last_attempt = 0;
    uint64_t last_committed = known_committed;
    Message message{};
    while (::read(fds[0], &message, sizeof message) == static_cast<ssize_t>(sizeof message)) {
      ASSERT_NE(message.kind, 'E') << "the child failed at version " << message.version;
      if (message.kind == 'A') last_attempt = message.version;
      if (message.kind == 'C') {
        last_committed = message.version;
        ++commits_total;
      }
    }
    ::close(fds[0]);
    ASSERT_TRUE(WIFSIGNALED(wait_status)) << "the child exited on its own";
    const bool commit_in_flight = last_attempt > last_committed;
    kills_during_commit += commit_in_flight ? 1 : 0;

    Result<Store> opened = Store::open(dir, test_store_options());
    ASSERT_TRUE(opened.ok()) << "kill " << kill_index << ": " << opened.error().to_string();
    Store store = std::move(opened).value();
    const uint64_t step = store.committed_step();
    if (commit_in_flight && step == last_attempt) {
      ++reopened_newer;
    } else {
      ASSERT_EQ(step, last_committed) << "kill " << kill_index << " (attempting " << last_attempt << ")";
    }
    if (step == 0) {
      EXPECT_TRUE(store.committed_metadata().empty());
    } else {
      ASSERT_EQ(store.committed_metadata().count("step"), 1u);
      EXPECT_EQ(store.committed_metadata().at("step"), std::to_string(step));
    }
    known_committed = step;

    // Exactly the tensors of that version, every byte right.
    const std::vector<Expected> expected = step == 0 ? std::vector<Expected>{} : tensors_of(step);
    ASSERT_EQ(store.list().size(), expected.size()) << "kill " << kill_index << " step " << step;
    for (const Expected& t : expected) {
      std::optional<TensorRecord> record = store.find(t.name);
      ASSERT_TRUE(record.has_value()) << t.name;
      ASSERT_EQ(record->size_bytes, static_cast<uint64_t>(t.elements) * 4);
      AlignedBuffer back(record->size_bytes);
      Result<StoreTicket> ticket = store.read_tensor_async(t.name, back.data, back.size);
      ASSERT_TRUE(ticket.ok());
      Status status = store.wait(*ticket);
      ASSERT_TRUE(status.ok()) << "kill " << kill_index << ": " << status.to_string();
      ASSERT_TRUE(matches_pattern(back.data, back.size, t.index, step)) << t.name << " at step " << step;
    }
    Result<VerifyReport> report = store.verify();
    ASSERT_TRUE(report.ok());
    ASSERT_TRUE(report->ok()) << report->damages.front().what;
  }
  std::printf("%d kills: %llu commits observed, %d kills during a commit (%d of them after the rename)\n", kKills,
              static_cast<unsigned long long>(commits_total), kills_during_commit, reopened_newer);
  // The kills must have landed while work was going on, or the test proved nothing.
  EXPECT_GT(commits_total, 0u);
  EXPECT_GT(known_committed, 0u);
}

}  // namespace
}  // namespace strata::memory
