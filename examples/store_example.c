/* examples/store_example.c — layer 2: create a store, put a named fp32 tensor, commit, reopen,
 * list, get it back and verify every checksum. Usage: store_example DIR (DIR must not exist) */
#include <stdio.h>
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

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  float weights[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 42.0f};
  int64_t shape[2] = {2, 3};
  strata_store* store = NULL;
  CHECK(strata_store_create(argv[1], 16 << 20, &store));
  CHECK(strata_store_put(store, "layer0.weight", STRATA_F32, shape, 2, weights, sizeof weights));
  const char* keys[1] = {"note"};
  const char* values[1] = {"first commit"};
  CHECK(strata_store_commit(store, 1, keys, values, 1));
  strata_store_close(store);

  CHECK(strata_store_open(argv[1], 0, &store));
  size_t count = 0;
  CHECK(strata_store_count(store, &count));
  for (size_t i = 0; i < count; ++i) {
    const char* name = NULL;
    CHECK(strata_store_name(store, i, &name));
    printf("store: tensor %s\n", name);
  }
  float back[6] = {0};
  CHECK(strata_store_get(store, "layer0.weight", back, sizeof back));
  uint64_t damaged = 0;
  CHECK(strata_store_verify(store, &damaged));
  /* A missing tensor is an error value with a message naming it, never a crash. */
  strata_status missing = strata_store_get(store, "nope", back, sizeof back);
  printf("store: missing tensor -> %s (%s)\n", strata_status_name(missing), strata_last_error());
  strata_store_close(store);
  int same = memcmp(back, weights, sizeof weights) == 0;
  printf("store: %zu tensor(s), round trip %s, %llu damaged\n", count, same ? "exact" : "WRONG",
         (unsigned long long)damaged);
  return same && missing == STRATA_ERR_NOT_FOUND ? 0 : 1;
}
