/* examples/optimizer_example.c — layer 4: AdamW over caller buffers, then the same steps with
 * the moments in an NVMe store streamed in small chunks; both must give identical bits.
 * Usage: optimizer_example DIR (must not exist) */
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

enum { kCount = 10000, kSteps = 3 };

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  float* a = malloc(kCount * sizeof(float));
  float* b = malloc(kCount * sizeof(float));
  float* g = malloc(kCount * sizeof(float));
  float* m = calloc(kCount, sizeof(float));
  float* v = calloc(kCount, sizeof(float));
  for (int i = 0; i < kCount; ++i) a[i] = b[i] = (float)((i % 97) - 48) / 50.0f;

  strata_adamw_hparams hp;
  strata_adamw_hparams_init(&hp);
  strata_adamw_config config;
  strata_adamw_config_init(&config);
  config.offload = STRATA_OFFLOAD_NVME;
  config.store_dir = argv[1];
  config.store_capacity_bytes = 16 << 20;
  config.chunk_elements = 4096; /* three chunks: exercises the streaming */
  strata_adamw* opt = NULL;
  uint32_t param = 0;
  CHECK(strata_adamw_create(&config, &opt));
  CHECK(strata_adamw_add_param(opt, "w", kCount, &param));
  for (int step = 1; step <= kSteps; ++step) {
    for (int i = 0; i < kCount; ++i) g[i] = (float)(((i * step) % 31) - 15) / 10.0f;
    CHECK(strata_adamw_step_buffers(&hp, step, a, g, STRATA_F32, m, v, NULL, STRATA_F32, kCount));
    CHECK(strata_adamw_step(opt, param, &hp, b, g));
  }
  CHECK(strata_adamw_commit(opt));
  strata_adamw_destroy(opt);
  int same = memcmp(a, b, kCount * sizeof(float)) == 0;
  printf("optimizer: %d steps of %d params, caller buffers vs NVMe state: %s\n", kSteps, kCount,
         same ? "bit-identical" : "DIFFERENT");
  free(a), free(b), free(g), free(m), free(v);
  return same ? 0 : 1;
}
