// tests/api/test_capi.cpp — the C API through its public header only, as an embedder sees it:
// byte-exact round trips on every layer, error values with the detail the CLI prints (never a
// crash or an exception), the thread-local last error, corruption found by verify, the
// optimizer's host and NVMe state giving the same bits as the caller-buffer kernel, and its
// 8-bit state (state_bits 8): host and NVMe (any chunk size) in agreement, a bit-identical
// resume, the layout checked at resume, state_dict's dequantise / requantise. The 8-bit
// numerics against an independent PyTorch reference are tests/api/test_python.py's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
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
  // The store format of 32-bit state: each chunk's moments under PyTorch's names, as stores
  // written before the optimizer seam hold them (the layout's [m | v] halves, unchanged).
  {
    std::vector<float> chunk(3000);
    ASSERT_STRATA_OK(strata_store_get(strata_adamw_store(on), "w/exp_avg_sq/1", chunk.data(), chunk.size() * 4));
    EXPECT_EQ(std::memcmp(chunk.data(), v.data() + 3000, chunk.size() * 4), 0);
    ASSERT_STRATA_OK(strata_store_get(strata_adamw_store(on), "w/exp_avg/3", chunk.data(), (n - 9000) * 4));
    EXPECT_EQ(std::memcmp(chunk.data(), m.data() + 9000, (n - 9000) * 4), 0);
  }
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

// bitsandbytes' knobs: defaults from the init, a caller built before them (smaller struct_size)
// gets 32-bit state, and each bad value is refused with the field's name.
TEST(CApi, AdamW8bitConfigDefaultsAndRefusals) {
  strata_adamw_config c;
  strata_adamw_config_init(&c);
  EXPECT_EQ(c.state_bits, 32u);
  EXPECT_EQ(c.block_size, 256u);
  EXPECT_EQ(c.min_8bit_size, 4096u);
  strata_adamw* opt = nullptr;
  auto refused = [&](const strata_adamw_config& config, const char* field) {
    strata_adamw* o = nullptr;
    EXPECT_EQ(strata_adamw_create(&config, &o), STRATA_ERR_INVALID_ARGUMENT) << field;
    EXPECT_EQ(o, nullptr);
    EXPECT_NE(std::string(strata_last_error()).find(field), std::string::npos) << strata_last_error();
  };
  strata_adamw_config bad = c;
  bad.state_bits = 16;
  refused(bad, "state_bits");
  bad = c;
  bad.state_bits = 0;
  refused(bad, "state_bits");
  for (uint32_t block : {0u, 32u, 100u, 8192u}) {
    bad = c;
    bad.state_bits = 8;
    bad.block_size = block;
    refused(bad, "block_size");
  }
  bad = c;
  bad.block_size = 100;  // wrong even where 32-bit state ignores it
  refused(bad, "block_size");
  std::string dir = temp_dir("adamw8_chunk");
  bad = c;
  bad.state_bits = 8;
  bad.offload = STRATA_OFFLOAD_NVME;
  bad.store_dir = dir.c_str();
  bad.chunk_elements = 128;
  refused(bad, "chunk_elements");

  // An older caller: struct_size ends before state_bits; garbage after it is never read.
  strata_adamw_config old = c;
  old.struct_size = offsetof(strata_adamw_config, state_bits);
  old.state_bits = 8;
  old.block_size = 3;
  ASSERT_STRATA_OK(strata_adamw_create(&old, &opt));
  constexpr size_t n = 5000;
  std::vector<float> p(n, 0.5f), ref(n, 0.5f), g(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) g[i] = std::sin(static_cast<float>(i)) * 1e-2f;
  uint32_t id = 0;
  ASSERT_STRATA_OK(strata_adamw_add_param(opt, "w", n, &id));
  strata_adamw_hparams hp;
  strata_adamw_hparams_init(&hp);
  for (int step = 1; step <= 2; ++step) {
    ASSERT_STRATA_OK(strata_adamw_step(opt, id, &hp, p.data(), g.data()));
    ASSERT_STRATA_OK(strata_adamw_step_buffers(&hp, step, ref.data(), g.data(), STRATA_F32, m.data(), v.data(),
                                               nullptr, STRATA_F32, n));
  }
  EXPECT_EQ(std::memcmp(p.data(), ref.data(), n * 4), 0) << "an old caller's optimizer is fp32 AdamW";
  strata_adamw_destroy(opt);
}

namespace {

struct Run8 {
  strata_adamw* opt = nullptr;
  uint32_t big = 0, small = 0;
  std::vector<float> big_params, small_params;
};

}  // namespace

// 8-bit state: host and NVMe (chunks of 3000 elements snapped to block boundaries, not dividing
// the size) give the same bits at every step; it is really 8-bit (it differs from fp32 AdamW,
// yet stays close); a parameter under min_8bit_size keeps fp32 moments and matches fp32 AdamW
// exactly; commit + resume continues bit-identically; the store refuses another layout.
TEST(CApi, AdamW8bitHostAndNvmeAgreeAndResume) {
  std::string dir = temp_dir("adamw8");
  constexpr size_t kBig = 10007, kSmall = 1000;  // 40 blocks (the last one short), and fp32 state
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> init_big(kBig), init_small(kSmall);
  for (auto& x : init_big) x = normal(rng);
  for (auto& x : init_small) x = normal(rng);
  strata_adamw_hparams hp;
  strata_adamw_hparams_init(&hp);
  hp.lr = 3e-3;
  hp.weight_decay = 0.05;
  strata_adamw_config hc, nc;
  strata_adamw_config_init(&hc);
  hc.state_bits = 8;
  nc = hc;
  nc.offload = STRATA_OFFLOAD_NVME;
  nc.store_dir = dir.c_str();
  nc.store_capacity_bytes = 8 << 20;
  nc.chunk_elements = 3000;
  auto open = [&](const strata_adamw_config& config, Run8& run) {
    ASSERT_STRATA_OK(strata_adamw_create(&config, &run.opt));
    ASSERT_STRATA_OK(strata_adamw_add_param(run.opt, "big", kBig, &run.big));
    ASSERT_STRATA_OK(strata_adamw_add_param(run.opt, "small", kSmall, &run.small));
  };
  Run8 host, nvme;
  host.big_params = nvme.big_params = init_big;
  host.small_params = nvme.small_params = init_small;
  open(hc, host);
  open(nc, nvme);
  // fp32 AdamW beside them, over the caller-buffer kernel.
  std::vector<float> ref_big = init_big, ref_small = init_small;
  std::vector<float> m_big(kBig, 0.0f), v_big(kBig, 0.0f), m_small(kSmall, 0.0f), v_small(kSmall, 0.0f);
  std::vector<float> g_big(kBig), g_small(kSmall);
  auto run_steps = [&](int from, int to, Run8& other) {
    for (int step = from; step <= to; ++step) {
      std::mt19937 grng(200 + step);
      // Blocks of two scales, each block one scale: a block spanning both would store its
      // small v as 0 and jump by ~lr·m/eps (docs/optim.md), which is bitsandbytes' behaviour.
      for (size_t i = 0; i < kBig; ++i) g_big[i] = normal(grng) * (i < 11 * 256 ? 1e-4f : 1.0f);
      for (auto& x : g_small) x = normal(grng);
      ASSERT_STRATA_OK(strata_adamw_step(host.opt, host.big, &hp, host.big_params.data(), g_big.data()));
      ASSERT_STRATA_OK(strata_adamw_step(host.opt, host.small, &hp, host.small_params.data(), g_small.data()));
      ASSERT_STRATA_OK(strata_adamw_step(other.opt, other.big, &hp, other.big_params.data(), g_big.data()));
      ASSERT_STRATA_OK(strata_adamw_step(other.opt, other.small, &hp, other.small_params.data(), g_small.data()));
      ASSERT_STRATA_OK(strata_adamw_step_buffers(&hp, step, ref_big.data(), g_big.data(), STRATA_F32, m_big.data(),
                                                 v_big.data(), nullptr, STRATA_F32, kBig));
      ASSERT_STRATA_OK(strata_adamw_step_buffers(&hp, step, ref_small.data(), g_small.data(), STRATA_F32,
                                                 m_small.data(), v_small.data(), nullptr, STRATA_F32, kSmall));
      ASSERT_EQ(std::memcmp(host.big_params.data(), other.big_params.data(), kBig * 4), 0) << "step " << step;
      ASSERT_EQ(std::memcmp(host.small_params.data(), other.small_params.data(), kSmall * 4), 0) << "step " << step;
      ASSERT_EQ(std::memcmp(host.small_params.data(), ref_small.data(), kSmall * 4), 0) << "step " << step;
    }
  };
  run_steps(1, 3, nvme);
  size_t differ = 0;
  double worst = 0;
  for (size_t i = 0; i < kBig; ++i) {
    differ += host.big_params[i] != ref_big[i];
    worst = std::max(worst, std::fabs(static_cast<double>(host.big_params[i]) - ref_big[i]));
  }
  EXPECT_GT(differ, kBig / 10) << "8-bit moments should move the params off fp32 AdamW's";
  EXPECT_LT(worst, 3 * hp.lr) << "but by less than a few steps' worth";

  // Dequantised state: close to the fp32 moments (an 8-bit code's error, per block).
  std::vector<float> sm(kBig), sv(kBig), hm(kBig), hv(kBig);
  int64_t step = 0;
  ASSERT_STRATA_OK(strata_adamw_get_state(nvme.opt, nvme.big, &step, sm.data(), sv.data()));
  ASSERT_STRATA_OK(strata_adamw_get_state(host.opt, host.big, nullptr, hm.data(), hv.data()));
  EXPECT_EQ(step, 3);
  EXPECT_EQ(std::memcmp(sm.data(), hm.data(), kBig * 4), 0);
  EXPECT_EQ(std::memcmp(sv.data(), hv.data(), kBig * 4), 0);
  for (size_t b = 0; b * 256 < kBig; ++b) {
    double m_max = 0, m_err = 0, v_max = 0, v_err = 0;
    for (size_t i = b * 256; i < std::min(kBig, (b + 1) * 256); ++i) {
      m_max = std::max(m_max, std::fabs(static_cast<double>(m_big[i])));
      v_max = std::max(v_max, static_cast<double>(v_big[i]));
      m_err = std::max(m_err, std::fabs(static_cast<double>(sm[i]) - m_big[i]));
      v_err = std::max(v_err, std::fabs(static_cast<double>(sv[i]) - v_big[i]));
    }
    EXPECT_LT(m_err, 0.1 * m_max) << "block " << b;
    EXPECT_LT(v_err, 0.1 * v_max) << "block " << b;
  }
  std::vector<float> small_m(kSmall), small_v(kSmall);
  ASSERT_STRATA_OK(strata_adamw_get_state(nvme.opt, nvme.small, nullptr, small_m.data(), small_v.data()));
  EXPECT_EQ(std::memcmp(small_m.data(), m_small.data(), kSmall * 4), 0) << "fp32 moments under min_8bit_size";
  EXPECT_EQ(std::memcmp(small_v.data(), v_small.data(), kSmall * 4), 0);
  std::vector<float> only_v(kBig);  // a NULL moment is skipped
  ASSERT_STRATA_OK(strata_adamw_get_state(nvme.opt, nvme.big, nullptr, nullptr, only_v.data()));
  EXPECT_EQ(std::memcmp(only_v.data(), sv.data(), kBig * 4), 0);

  ASSERT_STRATA_OK(strata_adamw_commit(nvme.opt));
  std::vector<float> lost = nvme.big_params;  // a step after the commit: forgotten by the resume
  ASSERT_STRATA_OK(strata_adamw_step(nvme.opt, nvme.big, &hp, lost.data(), g_big.data()));
  strata_adamw_destroy(nvme.opt);

  // The store records its layout: resuming it as 32-bit, or with other 8-bit rules, is refused.
  strata_adamw_config other = nc;
  other.resume = 1;
  for (int change = 0; change < 3; ++change) {
    strata_adamw_config wrong = other;
    if (change == 0) wrong.state_bits = 32;
    if (change == 1) wrong.block_size = 512;
    if (change == 2) wrong.min_8bit_size = 100;
    strata_adamw* o = nullptr;
    EXPECT_EQ(strata_adamw_create(&wrong, &o), STRATA_ERR_INVALID_ARGUMENT) << change;
    EXPECT_NE(std::string(strata_last_error()).find("adamw8bit (block_size 256, min_8bit_size 4096"), std::string::npos)
        << strata_last_error();
  }
  Run8 resumed;
  resumed.big_params = nvme.big_params;
  resumed.small_params = nvme.small_params;
  open(other, resumed);
  int64_t resumed_step = 0;
  ASSERT_STRATA_OK(strata_adamw_get_state(resumed.opt, resumed.big, &resumed_step, nullptr, nullptr));
  EXPECT_EQ(resumed_step, 3);
  run_steps(4, 6, resumed);
  strata_adamw_destroy(resumed.opt);
  strata_adamw_destroy(host.opt);
}

// A store of fp32 state is never reopened as 8-bit.
TEST(CApi, AdamW8bitRefusesFp32Store) {
  std::string dir = temp_dir("adamw32_to_8");
  strata_adamw_config c;
  strata_adamw_config_init(&c);
  c.offload = STRATA_OFFLOAD_NVME;
  c.store_dir = dir.c_str();
  c.store_capacity_bytes = 4 << 20;
  strata_adamw* opt = nullptr;
  ASSERT_STRATA_OK(strata_adamw_create(&c, &opt));
  uint32_t id = 0;
  ASSERT_STRATA_OK(strata_adamw_add_param(opt, "w", 4096, &id));
  std::vector<float> p(4096, 1.0f), g(4096, 0.25f);
  strata_adamw_hparams hp;
  strata_adamw_hparams_init(&hp);
  ASSERT_STRATA_OK(strata_adamw_step(opt, id, &hp, p.data(), g.data()));
  ASSERT_STRATA_OK(strata_adamw_commit(opt));
  strata_adamw_destroy(opt);
  c.resume = 1;
  c.state_bits = 8;
  EXPECT_EQ(strata_adamw_create(&c, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(strata_last_error()).find("holds adamw state"), std::string::npos) << strata_last_error();
  c.state_bits = 32;
  ASSERT_STRATA_OK(strata_adamw_create(&c, &opt));
  strata_adamw_destroy(opt);
}

// state_dict's path: set_state requantises what get_state dequantised. v (unsigned: its block's
// largest value is the code 1.0) and m in blocks whose largest |m| is positive come back with the
// same bits; a block whose largest |m| is negative is rescaled (the signed map's most negative
// code is -0.9922) and stays within a code's error. A non-finite moment is refused.
TEST(CApi, AdamW8bitStateRoundTrip) {
  constexpr size_t n = 4096 + 300;
  strata_adamw_config c;
  strata_adamw_config_init(&c);
  c.state_bits = 8;
  strata_adamw *a = nullptr, *b = nullptr;
  ASSERT_STRATA_OK(strata_adamw_create(&c, &a));
  ASSERT_STRATA_OK(strata_adamw_create(&c, &b));
  uint32_t ia = 0, ib = 0;
  ASSERT_STRATA_OK(strata_adamw_add_param(a, "w", n, &ia));
  ASSERT_STRATA_OK(strata_adamw_add_param(b, "w", n, &ib));
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), g(n);
  for (auto& x : p) x = normal(rng);
  strata_adamw_hparams hp;
  strata_adamw_hparams_init(&hp);
  for (int step = 0; step < 4; ++step) {
    for (auto& x : g) x = normal(rng);
    ASSERT_STRATA_OK(strata_adamw_step(a, ia, &hp, p.data(), g.data()));
  }
  std::vector<float> m(n), v(n), m2(n), v2(n);
  ASSERT_STRATA_OK(strata_adamw_get_state(a, ia, nullptr, m.data(), v.data()));
  ASSERT_STRATA_OK(strata_adamw_set_state(b, ib, 4, m.data(), v.data()));
  int64_t step = 0;
  ASSERT_STRATA_OK(strata_adamw_get_state(b, ib, &step, m2.data(), v2.data()));
  EXPECT_EQ(step, 4);
  EXPECT_EQ(std::memcmp(v.data(), v2.data(), n * 4), 0);
  size_t exact_blocks = 0, blocks = 0;
  for (size_t begin = 0; begin < n; begin += 256, ++blocks) {
    const size_t end = std::min(n, begin + 256);
    size_t largest = begin;
    for (size_t i = begin; i < end; ++i)
      if (std::fabs(m[i]) > std::fabs(m[largest])) largest = i;
    if (m[largest] > 0) {
      ++exact_blocks;
      EXPECT_EQ(std::memcmp(m.data() + begin, m2.data() + begin, (end - begin) * 4), 0) << "block at " << begin;
    } else {
      for (size_t i = begin; i < end; ++i) EXPECT_LE(std::fabs(m2[i] - m[i]), 0.05f * std::fabs(m[largest])) << i;
    }
  }
  EXPECT_GT(exact_blocks, 0u);
  EXPECT_LT(exact_blocks, blocks) << "the test should see both kinds of block";
  m[17] = NAN;
  EXPECT_EQ(strata_adamw_set_state(b, ib, 5, m.data(), v.data()), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(strata_last_error()).find("exp_avg[17]"), std::string::npos) << strata_last_error();
  strata_adamw_destroy(a);
  strata_adamw_destroy(b);
}

}  // namespace
