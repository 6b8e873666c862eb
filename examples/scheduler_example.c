/* examples/scheduler_example.c — layer 3: four 1 MiB "layers" in a store, a plan that reads
 * them in order and updates each in place, run twice under a 2.5 MiB host budget; the
 * scheduler prefetches and writes back. Usage: scheduler_example DIR (must not exist) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <strata/strata.h>

#define CHECK(call)                                                          \
  do {                                                                       \
    strata_status s_ = (call);                                               \
    if (s_ != STRATA_OK) {                                                   \
      fprintf(stderr, "%s: %s\n", strata_status_name(s_), strata_last_error()); \
      return 1;                                                              \
    }                                                                        \
  } while (0)

enum { kLayers = 4, kElements = 1 << 18 };

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  strata_store* store = NULL;
  CHECK(strata_store_create(argv[1], 64 << 20, &store));
  float* init = calloc(kElements, sizeof(float));
  strata_plan* plan = NULL;
  CHECK(strata_plan_create(&plan));
  uint32_t ids[kLayers];
  for (int i = 0; i < kLayers; ++i) {
    char name[32];
    snprintf(name, sizeof name, "layer%d", i);
    int64_t shape[1] = {kElements};
    for (int j = 0; j < kElements; ++j) init[j] = (float)i;
    CHECK(strata_store_put(store, name, STRATA_F32, shape, 1, init, kElements * sizeof(float)));
    CHECK(strata_plan_add_tensor(plan, name, kElements * sizeof(float), STRATA_HOME_NVME, &ids[i]));
    CHECK(strata_plan_add_step(plan, name, &ids[i], 1, &ids[i], 1, NULL));
  }
  CHECK(strata_store_commit(store, 0, NULL, NULL, 0));
  free(init);

  strata_sched_config config;
  strata_sched_config_init(&config);
  config.host_budget_bytes = 5 * (kElements * sizeof(float)) / 2;
  config.device_budget_bytes = 2 * kElements * sizeof(float);
  strata_scheduler* sched = NULL;
  CHECK(strata_sched_create(plan, store, &config, &sched));
  strata_plan_destroy(plan);
  for (int iteration = 0; iteration < 2; ++iteration) {
    for (size_t step = 0; step < kLayers; ++step) {
      float* data = NULL;
      CHECK(strata_sched_acquire(sched, step));
      CHECK(strata_sched_data(sched, step, ids[step], (void**)&data));
      for (int j = 0; j < kElements; ++j) data[j] += 1.0f; /* the "compute" */
      CHECK(strata_sched_release(sched, step));
    }
  }
  CHECK(strata_sched_flush(sched));
  strata_sched_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(strata_sched_stats_get(sched, &stats));
  strata_sched_destroy(sched);

  float* back = malloc(kElements * sizeof(float));
  int ok = 1;
  for (int i = 0; i < kLayers; ++i) {
    char name[32];
    snprintf(name, sizeof name, "layer%d", i);
    CHECK(strata_store_get(store, name, back, kElements * sizeof(float)));
    ok &= back[0] == (float)(i + 2) && back[kElements - 1] == (float)(i + 2);
  }
  free(back);
  strata_store_close(store);
  printf("scheduler: %llu steps, stall %.3f ms, %llu bytes read from NVMe, host high water %llu "
         "of %llu: %s\n",
         (unsigned long long)stats.steps_acquired, stats.stall_ns / 1e6,
         (unsigned long long)stats.nvme_read_bytes, (unsigned long long)stats.host_high_water_bytes,
         (unsigned long long)config.host_budget_bytes, ok ? "values right" : "WRONG");
  return ok && stats.host_high_water_bytes <= config.host_budget_bytes ? 0 : 1;
}
