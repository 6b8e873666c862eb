// tests/api/test_capi.cpp — the C API through its public header only, as an embedder sees it:
// byte-exact round trips on every layer, error values with the detail the CLI prints (never a
// crash or an exception), the thread-local last error, corruption found by verify, and the
// optimizer's host and NVMe state giving the same bits as the caller-buffer kernel.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/strata.h"

namespace fs = std::filesystem;

namespace {

// Every directory a test made, removed when the test program ends (stores are preallocated).
struct TempDirs {
  std::vector<fs::path> dirs;
  ~TempDirs() {
    std::error_code ignored;
    for (const auto& d : dirs) fs::remove_all(d, ignored);
  }
};
TempDirs temp_dirs;

std::string temp_dir(const std::string& name) {
  const char* base = std::getenv("STRATA_TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / ("capi_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  temp_dirs.dirs.push_back(dir);
  return dir.string();
}

#define ASSERT_STRATA_OK(call) ASSERT_EQ((call), STRATA_OK) << strata_last_error()

TEST(CApi, VersionMatchesHeader) {
  std::string expected = std::to_string(STRATA_VERSION_MAJOR) + "." +
                         std::to_string(STRATA_VERSION_MINOR) + "." +
                         std::to_string(STRATA_VERSION_PATCH);
  EXPECT_EQ(std::string(strata_version()), expected);
}

TEST(CApi, IoRoundTripUnalignedRange) {
  std::string dir = temp_dir("io");
  fs::create_directories(dir);
  std::string path = dir + "/f.bin";
  const char* paths[1] = {path.c_str()};
  strata_io_config config;
  strata_io_config_init(&config);
  strata_io_engine* engine = nullptr;
  strata_io_file* file = nullptr;
  ASSERT_STRATA_OK(strata_io_engine_create(&config, &engine));
  ASSERT_STRATA_OK(strata_io_file_open(paths, 1, 0, STRATA_IO_CREATE, &file));
  ASSERT_STRATA_OK(strata_io_file_preallocate(file, 1 << 20));
  std::vector<unsigned char> out(300001), in(300001);
  std::mt19937 rng(7);
  for (auto& b : out) b = static_cast<unsigned char>(rng());
  strata_io_token t1 = 0, t2 = 0;
  ASSERT_STRATA_OK(strata_io_write_async(engine, file, out.data(), out.size(), 4099, &t1));
  ASSERT_STRATA_OK(strata_io_wait_all(engine));
  ASSERT_STRATA_OK(strata_io_read_async(engine, file, in.data(), in.size(), 4099, &t2));
  ASSERT_STRATA_OK(strata_io_wait(engine, t2));
  EXPECT_EQ(in, out);
  // Reading past the end is an error naming the file, not a crash.
  std::vector<unsigned char> big(4096);
  strata_io_token t3 = 0;
  strata_status s = strata_io_read_async(engine, file, big.data(), big.size(), 8 << 20, &t3);
  if (s == STRATA_OK) s = strata_io_wait(engine, t3);
  EXPECT_NE(s, STRATA_OK);
  EXPECT_NE(std::string(strata_last_error()).find("f.bin"), std::string::npos) << strata_last_error();
  strata_io_file_close(file);
  strata_io_engine_destroy(engine);
}

TEST(CApi, IoSettingsFileFromTune) {
  std::string dir = temp_dir("iocfg");
  fs::create_directories(dir);
  std::string yaml = dir + "/io.yaml";
  std::ofstream(yaml) << "io:\n  read:\n    engine: psync\n    block_size: 256KiB\n    queue_depth: 4\n"
                         "    threads: 1\n  write:\n    engine: psync\n    block_size: 256KiB\n"
                         "    queue_depth: 4\n    threads: 1\n";
  strata_io_config config;
  strata_io_config_init(&config);
  config.settings_path = yaml.c_str();
  strata_io_engine* engine = nullptr;
  ASSERT_STRATA_OK(strata_io_engine_create(&config, &engine));
  EXPECT_NE(std::string(strata_io_engine_describe(engine)).find("psync"), std::string::npos)
      << strata_io_engine_describe(engine);
  strata_io_engine_destroy(engine);
  std::ofstream(yaml) << "io:\n  read:\n    engine: warp\n";
  EXPECT_EQ(strata_io_engine_create(&config, &engine), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(strata_last_error()).find("warp"), std::string::npos) << strata_last_error();
}

TEST(CApi, StoreRoundTripCommitReopenList) {
  std::string dir = temp_dir("store");
  strata_store* store = nullptr;
  ASSERT_STRATA_OK(strata_store_create(dir.c_str(), 8 << 20, &store));
  std::vector<uint16_t> a(1000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i * 31);
  int64_t shape[2] = {10, 100};
  ASSERT_STRATA_OK(strata_store_put(store, "b.half", STRATA_BF16, shape, 2, a.data(), a.size() * 2));
  // A size that does not match the shape is refused, naming the tensor.
  EXPECT_EQ(strata_store_put(store, "bad", STRATA_F32, shape, 2, a.data(), 7), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(strata_last_error()).find("bad"), std::string::npos);
  const char* keys[1] = {"k"};
  const char* values[1] = {"v1"};
  ASSERT_STRATA_OK(strata_store_commit(store, 5, keys, values, 1));
  strata_store_close(store);
  // Creating over it again is refused: nothing committed is lost.
  EXPECT_NE(strata_store_create(dir.c_str(), 8 << 20, &store), STRATA_OK);

  ASSERT_STRATA_OK(strata_store_open(dir.c_str(), 0, &store));
  uint64_t step = 0;
  ASSERT_STRATA_OK(strata_store_committed_step(store, &step));
  EXPECT_EQ(step, 5u);
  char buffer[16];
  size_t length = 0;
  ASSERT_STRATA_OK(strata_store_metadata(store, "k", buffer, sizeof buffer, &length));
  EXPECT_EQ(std::string(buffer), "v1");
  strata_dtype dtype;
  size_t ndim = 0;
  int64_t got_shape[4] = {};
  uint64_t size = 0;
  ASSERT_STRATA_OK(strata_store_info(store, "b.half", &dtype, &ndim, got_shape, 4, &size));
  EXPECT_EQ(dtype, STRATA_BF16);
  EXPECT_EQ(ndim, 2u);
  EXPECT_EQ(got_shape[1], 100);
  EXPECT_EQ(size, 2000u);
  std::vector<uint16_t> back(1000);
  ASSERT_STRATA_OK(strata_store_get(store, "b.half", back.data(), back.size() * 2));
  EXPECT_EQ(back, a);
  size_t count = 0;
  const char* name = nullptr;
  ASSERT_STRATA_OK(strata_store_count(store, &count));
  ASSERT_EQ(count, 1u);
  ASSERT_STRATA_OK(strata_store_name(store, 0, &name));
  EXPECT_STREQ(name, "b.half");
  EXPECT_EQ(strata_store_get(store, "absent", back.data(), 2000), STRATA_ERR_NOT_FOUND);
  EXPECT_NE(std::string(strata_last_error()).find("absent"), std::string::npos);
  strata_store_close(store);
}

TEST(CApi, StripedStoreRoundTrip) {
  std::string dir = temp_dir("striped");
  fs::create_directories(dir);
  std::string a = dir + "/a.strata", b = dir + "/b.strata";
  const char* paths[2] = {a.c_str(), b.c_str()};
  strata_store* store = nullptr;
  ASSERT_STRATA_OK(strata_store_create_striped((dir + "/store").c_str(), paths, 2, 64 << 10, 8 << 20, &store));
  std::vector<float> w(300000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  int64_t shape[1] = {static_cast<int64_t>(w.size())};
  ASSERT_STRATA_OK(strata_store_put(store, "w", STRATA_F32, shape, 1, w.data(), w.size() * 4));
  ASSERT_STRATA_OK(strata_store_commit(store, 1, nullptr, nullptr, 0));
  strata_store_close(store);
  ASSERT_STRATA_OK(strata_store_open((dir + "/store").c_str(), 1, &store));
  std::vector<float> back(w.size());
  ASSERT_STRATA_OK(strata_store_get(store, "w", back.data(), back.size() * 4));
  EXPECT_EQ(back, w);
  EXPECT_GT(fs::file_size(b), 0u);  // the second file was created and preallocated
  strata_store_close(store);
}

TEST(CApi, VerifyFindsCorruptionAndNamesTensor) {
  std::string dir = temp_dir("corrupt");
  strata_store* store = nullptr;
  ASSERT_STRATA_OK(strata_store_create(dir.c_str(), 4 << 20, &store));
  std::vector<float> w(4096, 1.25f);
  int64_t shape[1] = {4096};
  ASSERT_STRATA_OK(strata_store_put(store, "victim", STRATA_F32, shape, 1, w.data(), w.size() * 4));
  ASSERT_STRATA_OK(strata_store_commit(store, 1, nullptr, nullptr, 0));
  strata_store_close(store);
  {  // flip one byte of the data (the only tensor starts at offset 0 of the data file)
    std::fstream f(dir + "/data.strata", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x55');
  }
  ASSERT_STRATA_OK(strata_store_open(dir.c_str(), 1, &store));
  uint64_t damaged = 0;
  EXPECT_EQ(strata_store_verify(store, &damaged), STRATA_ERR_CORRUPT);
  EXPECT_EQ(damaged, 1u);
  EXPECT_NE(std::string(strata_last_error()).find("victim"), std::string::npos) << strata_last_error();
  strata_store_close(store);
}

TEST(CApi, VerifyOnceTrustsWhatTheHandleWroteAndChecksWhatItOpened) {
  std::string dir = temp_dir("verify_once");
  strata_store* store = nullptr;
  ASSERT_STRATA_OK(strata_store_create(dir.c_str(), 4 << 20, &store));
  EXPECT_EQ(strata_store_set_verify_once(store, 2), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(strata_store_set_verify_once(nullptr, 1), STRATA_ERR_INVALID_ARGUMENT);
  std::vector<float> w(4096, 1.25f), back(4096);
  int64_t shape[1] = {4096};
  ASSERT_STRATA_OK(strata_store_put(store, "w", STRATA_F32, shape, 1, w.data(), w.size() * 4));
  ASSERT_STRATA_OK(strata_store_commit(store, 1, nullptr, nullptr, 0));
  auto flip = [&] {  // one byte of the data (the only tensor starts at offset 0 of the data file)
    std::fstream f(dir + "/data.strata", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    const char byte = static_cast<char>(f.get() ^ 0x10);
    f.seekp(100);
    f.put(byte);
  };
  flip();
  // Every read checked (the default): the damage is found.
  EXPECT_EQ(strata_store_get(store, "w", back.data(), back.size() * 4), STRATA_ERR_CORRUPT);
  // Once: what this handle wrote is trusted — the trade, damage after the write unseen.
  ASSERT_STRATA_OK(strata_store_set_verify_once(store, 1));
  EXPECT_EQ(strata_store_get(store, "w", back.data(), back.size() * 4), STRATA_OK);
  EXPECT_NE(back, w);
  strata_store_close(store);
  // Reopened, nothing is trusted: found on every read.
  ASSERT_STRATA_OK(strata_store_open(dir.c_str(), 0, &store));
  ASSERT_STRATA_OK(strata_store_set_verify_once(store, 1));
  for (int round = 0; round < 2; ++round)
    EXPECT_EQ(strata_store_get(store, "w", back.data(), back.size() * 4), STRATA_ERR_CORRUPT) << round;
  strata_store_close(store);
}

TEST(CApi, LastErrorIsPerThreadAndNullsAreRefused) {
  strata_store* store = nullptr;
  EXPECT_EQ(strata_store_open("/nonexistent/strata-store", 0, &store), STRATA_ERR_NOT_FOUND)
      << strata_last_error();
  std::string mine = strata_last_error();
  EXPECT_NE(mine.find("/nonexistent/strata-store"), std::string::npos) << mine;
  std::string theirs = "unset";
  std::thread([&] { theirs = strata_last_error(); }).join();
  EXPECT_EQ(theirs, "");
  EXPECT_EQ(std::string(strata_last_error()), mine);
  EXPECT_EQ(strata_store_get(nullptr, "x", nullptr, 0), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(strata_adamw_step(nullptr, 0, nullptr, nullptr, nullptr), STRATA_ERR_INVALID_ARGUMENT);
  strata_io_config bad{};  // struct_size 0: a caller that forgot the init
  strata_io_engine* engine = nullptr;
  EXPECT_EQ(strata_io_engine_create(&bad, &engine), STRATA_ERR_INVALID_ARGUMENT);
}

TEST(CApi, SchedulerPrefetchesAndWritesBackWithinBudget) {
  std::string dir = temp_dir("sched");
  strata_store* store = nullptr;
  ASSERT_STRATA_OK(strata_store_create(dir.c_str(), 32 << 20, &store));
  constexpr int kLayers = 5;
  constexpr size_t kElements = 1 << 16;
  strata_plan* plan = nullptr;
  ASSERT_STRATA_OK(strata_plan_create(&plan));
  uint32_t ids[kLayers];
  std::vector<float> init(kElements);
  for (int i = 0; i < kLayers; ++i) {
    std::string name = "l" + std::to_string(i);
    for (size_t j = 0; j < kElements; ++j) init[j] = static_cast<float>(i * 1000 + j % 100);
    int64_t shape[1] = {static_cast<int64_t>(kElements)};
    ASSERT_STRATA_OK(strata_store_put(store, name.c_str(), STRATA_F32, shape, 1, init.data(), kElements * 4));
    ASSERT_STRATA_OK(strata_plan_add_tensor(plan, name.c_str(), kElements * 4, STRATA_HOME_NVME, &ids[i]));
    ASSERT_STRATA_OK(strata_plan_add_step(plan, name.c_str(), &ids[i], 1, &ids[i], 1, nullptr));
  }
  strata_sched_config config;
  strata_sched_config_init(&config);
  config.host_budget_bytes = 2 * kElements * 4;
  config.device_budget_bytes = 2 * kElements * 4;
  strata_scheduler* sched = nullptr;
  ASSERT_STRATA_OK(strata_sched_create(plan, store, &config, &sched));
  strata_plan_destroy(plan);  // the scheduler copied it
  // The store is lent to the scheduler's I/O thread: the caller's handle refuses, not crashes.
  EXPECT_EQ(strata_store_get(store, "l0", init.data(), kElements * 4), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(strata_last_error()).find("lent"), std::string::npos) << strata_last_error();
  for (int it = 0; it < 3; ++it) {
    for (size_t step = 0; step < kLayers; ++step) {
      float* data = nullptr;
      ASSERT_STRATA_OK(strata_sched_acquire(sched, step));
      ASSERT_STRATA_OK(strata_sched_data(sched, step, ids[step], reinterpret_cast<void**>(&data)));
      for (size_t j = 0; j < kElements; ++j) data[j] += 0.5f;
      ASSERT_STRATA_OK(strata_sched_release(sched, step));
    }
  }
  EXPECT_EQ(strata_sched_data(sched, 0, ids[0], reinterpret_cast<void**>(&init)), STRATA_ERR_INVALID_ARGUMENT);
  ASSERT_STRATA_OK(strata_sched_flush(sched));
  strata_sched_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_STRATA_OK(strata_sched_stats_get(sched, &stats));
  EXPECT_EQ(stats.steps_acquired, 15u);
  EXPECT_LE(stats.host_high_water_bytes, config.host_budget_bytes);
  EXPECT_GT(stats.nvme_read_bytes, 0u);
  strata_sched_destroy(sched);
  std::vector<float> back(kElements);
  for (int i = 0; i < kLayers; ++i) {
    std::string name = "l" + std::to_string(i);
    ASSERT_STRATA_OK(strata_store_get(store, name.c_str(), back.data(), kElements * 4));
    for (size_t j = 0; j < kElements; j += 997)
      ASSERT_EQ(back[j], static_cast<float>(i * 1000 + j % 100) + 1.5f) << name << "[" << j << "]";
  }
  strata_store_close(store);
}

// The optimizer with owned state (host, and nvme in chunks that do not divide the size) gives
// the same bits as the caller-buffer step; a resumed nvme optimizer continues exactly.
TEST(CApi, AdamWOwnedStateMatchesBuffersAndResumes) {
  std::string dir = temp_dir("adamw");
  constexpr size_t n = 10007;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> ref(n), host(n), nvme(n), m(n, 0.0f), v(n, 0.0f), g(n);
  for (size_t i = 0; i < n; ++i) ref[i] = host[i] = nvme[i] = normal(rng);
  strata_adamw_hparams hp;
  strata_adamw_hparams_init(&hp);
  hp.lr = 3e-3;
  strata_adamw_config hc, nc;
  strata_adamw_config_init(&hc);
  strata_adamw_config_init(&nc);
  nc.offload = STRATA_OFFLOAD_NVME;
  nc.store_dir = dir.c_str();
  nc.store_capacity_bytes = 8 << 20;
  nc.chunk_elements = 3000;
  strata_adamw *oh = nullptr, *on = nullptr;
  uint32_t ph = 0, pn = 0;
  ASSERT_STRATA_OK(strata_adamw_create(&hc, &oh));
  ASSERT_STRATA_OK(strata_adamw_create(&nc, &on));
  ASSERT_STRATA_OK(strata_adamw_add_param(oh, "w", n, &ph));
  ASSERT_STRATA_OK(strata_adamw_add_param(on, "w", n, &pn));
  auto run_steps = [&](int from, int to, strata_adamw* o, uint32_t p) {
    for (int step = from; step <= to; ++step) {
      std::mt19937 grng(100 + step);
      for (auto& x : g) x = normal(grng);
      ASSERT_STRATA_OK(strata_adamw_step_buffers(&hp, step, ref.data(), g.data(), STRATA_F32, m.data(),
                                                 v.data(), nullptr, STRATA_F32, n));
      ASSERT_STRATA_OK(strata_adamw_step(oh, ph, &hp, host.data(), g.data()));
      ASSERT_STRATA_OK(strata_adamw_step(o, p, &hp, nvme.data(), g.data()));
    }
  };
  run_steps(1, 3, on, pn);
  ASSERT_EQ(std::memcmp(ref.data(), host.data(), n * 4), 0);
  ASSERT_EQ(std::memcmp(ref.data(), nvme.data(), n * 4), 0);
  std::vector<float> sm(n), sv(n);
  int64_t step = 0;
  ASSERT_STRATA_OK(strata_adamw_get_state(on, pn, &step, sm.data(), sv.data()));
  EXPECT_EQ(step, 3);
  EXPECT_EQ(std::memcmp(sm.data(), m.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(sv.data(), v.data(), n * 4), 0);
  ASSERT_STRATA_OK(strata_adamw_commit(on));
  EXPECT_EQ(strata_adamw_commit(oh), STRATA_ERR_UNSUPPORTED);
  strata_adamw_destroy(on);

  nc.resume = 1;
  ASSERT_STRATA_OK(strata_adamw_create(&nc, &on));
  ASSERT_STRATA_OK(strata_adamw_add_param(on, "w", n, &pn));
  run_steps(4, 5, on, pn);
  EXPECT_EQ(std::memcmp(ref.data(), nvme.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(ref.data(), host.data(), n * 4), 0);
  strata_adamw_destroy(on);
  strata_adamw_destroy(oh);
}

}  // namespace
