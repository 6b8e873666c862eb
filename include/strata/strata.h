/* strata/strata.h — the C API of libstrata: the one public boundary of the offload engine.
 *
 * C99, usable from C and C++. Link with `cc $(pkg-config --cflags --libs strata)`.
 *
 * Conventions, for every call below:
 *   - Every call returns a strata_status: 0 (STRATA_OK) or a kind of failure. The failure's
 *     one-line detail — operation, path, byte offset and length, tensor, errno, what the CLI
 *     would print — is in strata_last_error(), a per-thread text valid until that thread's next
 *     strata call. No C++ exception ever crosses this boundary (each entry point catches all;
 *     an escaped exception becomes STRATA_ERR_INTERNAL).
 *   - Handles are opaque pointers. Each *_create / *_open has a matching *_close / *_destroy
 *     that accepts NULL. Output pointers are written only on success.
 *   - Config structs start with `struct_size`, set by strata_*_config_init (or by the caller
 *     to sizeof the struct): a newer library reads only the bytes an older caller passed, so
 *     fields can be added at the end without breaking the ABI.
 *   - Buffers the caller passes stay the caller's: the library never frees them and keeps a
 *     pointer only where a call says so (asynchronous I/O: until that token is waited for).
 *   - Threads: a handle belongs to one thread at a time unless the call says otherwise
 *     (an I/O engine to the one thread that submits to it). Different handles are independent.
 *
 * Four layers, each usable alone: I/O (strata_io_*), the checksummed NVMe store
 * (strata_store_*), the prefetch scheduler (strata_plan_*, strata_sched_*) and the CPU AdamW
 * optimizer (strata_adamw_*). See docs/embedding.md for the contract of each in prose.
 */
#ifndef STRATA_STRATA_H
#define STRATA_STRATA_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define STRATA_API __attribute__((visibility("default")))
#else
#define STRATA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0

/* ---- status, errors, version ----------------------------------------------------------- */
typedef enum strata_status {
  STRATA_OK = 0,
  STRATA_ERR_RETRYABLE = 1,        /* EINTR/EAGAIN-like: try again */
  STRATA_ERR_IO = 2,               /* the device failed (EIO and friends) */
  STRATA_ERR_NO_SPACE = 3,         /* ENOSPC, a full store, a budget that cannot be met */
  STRATA_ERR_NOT_FOUND = 4,        /* a missing file or tensor */
  STRATA_ERR_CORRUPT = 5,          /* checksum mismatch, garbled manifest */
  STRATA_ERR_INVALID_ARGUMENT = 6, /* bad input or configuration: nothing was done */
  STRATA_ERR_UNSUPPORTED = 7,      /* the kernel or the build lacks a feature */
  STRATA_ERR_INTERNAL = 8
} strata_status;

/* "0.1.0": the library's version (may be newer than the header's STRATA_VERSION_*). */
STRATA_API const char* strata_version(void);
/* The detail of this thread's last failed call ("" if none). Owned by the library; valid
 * until this thread's next strata call. */
STRATA_API const char* strata_last_error(void);
/* "io", "no_space", ...: the name of a status. Static storage. */
STRATA_API const char* strata_status_name(strata_status status);

typedef enum strata_dtype { STRATA_F32 = 0, STRATA_BF16 = 1, STRATA_F16 = 2 } strata_dtype;

/* ---- layer 1: I/O ------------------------------------------------------------------------
 * An engine (io_uring, libaio or a psync thread pool) moves bytes between caller buffers and
 * files opened O_DIRECT (buffered with a warning where the filesystem refuses O_DIRECT).
 * Any buffer, offset and length work; aligned ones (strata_io_file_alignment) take the fast
 * path. An engine belongs to the one thread that submits to it; a file may be used by several
 * engines on several threads. A file must outlive the requests submitted on it. */
typedef struct strata_io_engine strata_io_engine;
typedef struct strata_io_file strata_io_file;
typedef uint64_t strata_io_token;

typedef struct strata_io_config {
  size_t struct_size;
  const char* backend;          /* "uring", "aio", "psync" or NULL: the best available */
  uint32_t queue_depth;         /* pieces in flight (default 32) */
  uint64_t block_size_bytes;    /* requests are split into pieces of this (default 1 MiB) */
  uint32_t max_requests;        /* submitted and not yet waited for, at most (default 256) */
  /* A YAML file as `strata tune` writes (`io:` with read/write sections), or NULL. When
   * given, its `read` settings choose backend, block size and queue depth (`use_write`: the
   * `write` ones), overriding the fields above. */
  const char* settings_path;
  int use_write_settings;
} strata_io_config;

STRATA_API void strata_io_config_init(strata_io_config* config);
STRATA_API strata_status strata_io_engine_create(const strata_io_config* config,
                                                 strata_io_engine** out_engine);
/* Waits for every request still in flight, then frees the engine. */
STRATA_API void strata_io_engine_destroy(strata_io_engine* engine);
/* "uring qd=32 ...": one line describing what the kernel granted. Valid until the next call
 * on this engine. */
STRATA_API const char* strata_io_engine_describe(strata_io_engine* engine);

#define STRATA_IO_CREATE 1u    /* create (mode 0600) when missing */
#define STRATA_IO_READ_ONLY 2u
/* One file (count 1) or a volume striped over `count` files in units of `stripe_bytes`. */
STRATA_API strata_status strata_io_file_open(const char* const* paths, size_t count,
                                             uint64_t stripe_bytes, uint32_t flags,
                                             strata_io_file** out_file);
STRATA_API void strata_io_file_close(strata_io_file* file);
STRATA_API strata_status strata_io_file_size(strata_io_file* file, uint64_t* out_size_bytes);
/* Reserves space (fallocate) so later writes cannot hit ENOSPC. */
STRATA_API strata_status strata_io_file_preallocate(strata_io_file* file, uint64_t size_bytes);
STRATA_API strata_status strata_io_file_sync(strata_io_file* file);
/* The alignment of buffer addresses, offsets and lengths that takes the direct path. */
STRATA_API uint32_t strata_io_file_alignment(strata_io_file* file);

/* Registers a long-lived buffer region (io_uring fixed buffers). Optional; the region must
 * outlive the engine. */
STRATA_API strata_status strata_io_register_buffer(strata_io_engine* engine, void* base,
                                                   uint64_t length_bytes);
/* Starts an asynchronous read/write and returns at once with a token. The buffer must stay
 * valid (for a write: unchanged) until the token has been waited for. */
STRATA_API strata_status strata_io_read_async(strata_io_engine* engine, strata_io_file* file,
                                              void* buffer, uint64_t length_bytes,
                                              uint64_t offset_bytes, strata_io_token* out_token);
STRATA_API strata_status strata_io_write_async(strata_io_engine* engine, strata_io_file* file,
                                               const void* buffer, uint64_t length_bytes,
                                               uint64_t offset_bytes, strata_io_token* out_token);
/* *out_done = 1 once strata_io_wait(token) would not block. Never blocks. */
STRATA_API strata_status strata_io_poll(strata_io_engine* engine, strata_io_token token,
                                        int* out_done);
/* Blocks until that request is complete; its status. Each token is waited for once. */
STRATA_API strata_status strata_io_wait(strata_io_engine* engine, strata_io_token token);
/* Waits for every outstanding request; the first error. */
STRATA_API strata_status strata_io_wait_all(strata_io_engine* engine);

/* ---- layer 2: the store ------------------------------------------------------------------
 * Named tensors in preallocated, checksummed files; crash-safe versions (a commit makes every
 * write since the last one durable at once; a crash leaves the last commit intact). A store
 * belongs to one thread at a time. */
typedef struct strata_store strata_store;

/* Creates a store directory with one data file of `capacity_bytes`; refuses one that exists. */
STRATA_API strata_status strata_store_create(const char* dir, uint64_t capacity_bytes,
                                             strata_store** out_store);
/* The same with its data striped over `count` files (e.g. one per NVMe drive) in units of
 * `stripe_bytes` (0: 1 MiB). */
STRATA_API strata_status strata_store_create_striped(const char* dir, const char* const* data_paths,
                                                     size_t count, uint64_t stripe_bytes,
                                                     uint64_t capacity_bytes,
                                                     strata_store** out_store);
/* Opens at its last commit. `read_only`: inspect and verify only. */
STRATA_API strata_status strata_store_open(const char* dir, int read_only,
                                           strata_store** out_store);
/* Which reads check their extents' checksums (docs/memory.md, "Read checksums"): 0, the default,
 * every read; 1, an extent only until this handle has seen it intact (it wrote it, or verified a
 * read of it) — faster where the CPU is the bottleneck, blind to damage that appears on the drive
 * while the handle is open. Takes effect from the next read; other values: INVALID_ARGUMENT. */
STRATA_API strata_status strata_store_set_verify_once(strata_store* store, int once);
/* Waits for outstanding I/O; does not commit (uncommitted writes are forgotten on reopen). */
STRATA_API void strata_store_close(strata_store* store);
/* Writes a new version of `name` (synchronously; visible to get at once, durable at commit).
 * size_bytes must equal the element count of `shape` times the dtype size. */
STRATA_API strata_status strata_store_put(strata_store* store, const char* name,
                                          strata_dtype dtype, const int64_t* shape, size_t ndim,
                                          const void* data, uint64_t size_bytes);
/* Reads `name` into `data` (capacity_bytes ≥ its size), checksums verified. */
STRATA_API strata_status strata_store_get(strata_store* store, const char* name, void* data,
                                          uint64_t capacity_bytes);
/* The asynchronous pair: `data` must stay valid until strata_store_wait(ticket). */
STRATA_API strata_status strata_store_get_async(strata_store* store, const char* name,
                                                void* data, uint64_t capacity_bytes,
                                                uint64_t* out_ticket);
STRATA_API strata_status strata_store_put_async(strata_store* store, const char* name,
                                                strata_dtype dtype, const int64_t* shape,
                                                size_t ndim, const void* data,
                                                uint64_t size_bytes, uint64_t* out_ticket);
STRATA_API strata_status strata_store_wait(strata_store* store, uint64_t ticket);
/* A tensor's dtype, rank, shape (up to `shape_capacity` dims written) and size.
 * STRATA_ERR_NOT_FOUND when absent. */
STRATA_API strata_status strata_store_info(strata_store* store, const char* name,
                                           strata_dtype* out_dtype, size_t* out_ndim,
                                           int64_t* out_shape, size_t shape_capacity,
                                           uint64_t* out_size_bytes);
STRATA_API strata_status strata_store_remove(strata_store* store, const char* name);
/* Makes every write and removal since the last commit durable as one version, with `step`
 * and `count` key/value metadata strings. */
STRATA_API strata_status strata_store_commit(strata_store* store, uint64_t step,
                                             const char* const* keys, const char* const* values,
                                             size_t count);
STRATA_API strata_status strata_store_committed_step(strata_store* store, uint64_t* out_step);
/* Committed metadata value of `key` copied into `buffer` (NUL-terminated); *out_length is the
 * full length, so a caller can size the buffer. NOT_FOUND when the key is absent. */
STRATA_API strata_status strata_store_metadata(strata_store* store, const char* key,
                                               char* buffer, size_t capacity, size_t* out_length);
/* Reads every committed extent and checks its checksum. *out_damaged = extents damaged; the
 * first damage's detail is in strata_last_error() (and the status is STRATA_ERR_CORRUPT). */
STRATA_API strata_status strata_store_verify(strata_store* store, uint64_t* out_damaged);
/* The visible tensors, by name: count, then names by index (valid until the next call that
 * changes the store on this handle). */
STRATA_API strata_status strata_store_count(strata_store* store, size_t* out_count);
STRATA_API strata_status strata_store_name(strata_store* store, size_t index,
                                           const char** out_name);

/* ---- layer 3: the scheduler --------------------------------------------------------------
 * Declare tensors (size, home tier) and an access plan (ordered steps reading and writing
 * them); the scheduler then keeps each step's tensors resident ahead of use within hard host
 * and device byte budgets, prefetching from the store, and counts every stall. The plan
 * repeats. The compute device is the CPU (CUDA builds: see docs/embedding.md). */
typedef struct strata_plan strata_plan;
typedef struct strata_scheduler strata_scheduler;

typedef enum strata_home { STRATA_HOME_NVME = 0, STRATA_HOME_HOST = 1 } strata_home;

STRATA_API strata_status strata_plan_create(strata_plan** out_plan);
STRATA_API void strata_plan_destroy(strata_plan* plan);
STRATA_API strata_status strata_plan_add_tensor(strata_plan* plan, const char* name,
                                                uint64_t size_bytes, strata_home home,
                                                uint32_t* out_tensor);
STRATA_API strata_status strata_plan_add_step(strata_plan* plan, const char* name,
                                              const uint32_t* reads, size_t read_count,
                                              const uint32_t* writes, size_t write_count,
                                              size_t* out_step);

typedef struct strata_sched_config {
  size_t struct_size;
  uint64_t host_budget_bytes;    /* required */
  uint64_t device_budget_bytes;  /* required: the compute tier's budget */
  uint32_t io_queue_tensors;     /* NVMe tensor transfers in flight (default 4) */
} strata_sched_config;

STRATA_API void strata_sched_config_init(strata_sched_config* config);
/* Copies the plan (destroy it whenever). `store` (NULL when every tensor is host-homed) holds
 * every NVMe-homed tensor under the same name and size. The store is LENT: create commits it
 * (what the caller put becomes durable) and reopens it for the scheduler's I/O thread (an
 * io_uring engine serves one thread); until strata_sched_destroy, calls on the caller's store
 * handle fail with STRATA_ERR_INVALID_ARGUMENT. The handle must outlive the scheduler. */
STRATA_API strata_status strata_sched_create(const strata_plan* plan, strata_store* store,
                                             const strata_sched_config* config,
                                             strata_scheduler** out_sched);
/* Releases held steps, flushes every write-back, commits the store and gives it back to the
 * caller's handle (reopened for the caller's thread). A failure there is left in
 * strata_last_error(). */
STRATA_API void strata_sched_destroy(strata_scheduler* sched);
/* Blocks until every tensor of `step` (the next in plan order) is resident at its newest
 * version; pins them until release. The caller (compute) thread only. */
STRATA_API strata_status strata_sched_acquire(strata_scheduler* sched, size_t step);
/* Address of an acquired step's tensor (valid until release of that step). */
STRATA_API strata_status strata_sched_data(strata_scheduler* sched, size_t step,
                                           uint32_t tensor, void** out_data);
STRATA_API strata_status strata_sched_release(strata_scheduler* sched, size_t step);
/* Every tensor's home copy holds its newest version (no step may be held). */
STRATA_API strata_status strata_sched_flush(strata_scheduler* sched);
/* A host-homed tensor's bytes, to fill or read while no step using it is held. */
STRATA_API strata_status strata_sched_host_begin(strata_scheduler* sched, uint32_t tensor,
                                                 void** out_data);
STRATA_API strata_status strata_sched_host_end(strata_scheduler* sched, uint32_t tensor);

typedef struct strata_sched_stats {
  size_t struct_size;
  uint64_t steps_acquired;
  uint64_t stall_ns;
  uint64_t max_step_stall_ns;
  uint64_t nvme_read_bytes;
  uint64_t nvme_write_bytes;
  uint64_t host_high_water_bytes;
  uint64_t device_high_water_bytes;
} strata_sched_stats;
STRATA_API strata_status strata_sched_stats_get(strata_scheduler* sched,
                                                strata_sched_stats* out_stats);

/* ---- layer 4: the optimizer --------------------------------------------------------------
 * torch.optim.AdamW (torch 1.13 semantics, amsgrad off) on the CPU, bit-identical in fp32;
 * or, with strata_adamw_config.state_bits = 8, bitsandbytes' 8-bit block-wise AdamW
 * (AdamW8bit: dynamic-map codes and one fp32 absmax per block for each moment; docs/optim.md
 * says where strata differs from it). */
typedef struct strata_adamw_hparams {
  size_t struct_size;
  double lr, beta1, beta2, eps, weight_decay;
  float grad_scale; /* gradients are multiplied by this (1: exact) */
} strata_adamw_hparams;
STRATA_API void strata_adamw_hparams_init(strata_adamw_hparams* hparams);

/* One step (1-based `step`, torch's state['step'] after its increment) over caller buffers:
 * fp32 params, exp_avg, exp_avg_sq updated in place; grads fp32 (grads_dtype STRATA_F32) or
 * bf16 bits (STRATA_BF16); `copy` (NULL or `count` uint16) receives the updated params as
 * copy_dtype (STRATA_BF16/STRATA_F16). Runs on the caller's thread and TBB's workers; calls on
 * disjoint buffers may run concurrently. */
STRATA_API strata_status strata_adamw_step_buffers(const strata_adamw_hparams* hparams,
                                                   int64_t step, float* params,
                                                   const void* grads, strata_dtype grads_dtype,
                                                   float* exp_avg, float* exp_avg_sq,
                                                   uint16_t* copy, strata_dtype copy_dtype,
                                                   size_t count);

/* An optimizer that owns the moments (and step counts) of registered parameters, in host
 * memory or in a store, streamed through in chunks with reads ahead and writes behind. The
 * caller's fp32 parameter buffer is the master copy, passed at each step. One thread at a time.
 *
 * 8-bit state (state_bits 8): a parameter of at least min_8bit_size elements keeps m and v as
 * one byte each (codes into bitsandbytes' signed / unsigned dynamic maps) plus one fp32 absmax
 * per block of block_size elements and moment, blocks counted from the parameter's first
 * element — about 2 bytes an element instead of 8; a smaller one keeps fp32 moments. Each step
 * dequantises, updates in fp32 (the weight update reads the fresh fp32 moments), and
 * requantises against the block's new absmax; a NaN/inf gradient leaves its element's param
 * and moments as they were. The layout is the one `strata train` uses (optimizer.kind:
 * adamw8bit). */
typedef struct strata_adamw strata_adamw;
typedef enum strata_offload { STRATA_OFFLOAD_HOST = 0, STRATA_OFFLOAD_NVME = 1 } strata_offload;

typedef struct strata_adamw_config {
  size_t struct_size;
  strata_offload offload;
  const char* store_dir;          /* nvme: the store directory (created when missing) */
  uint64_t store_capacity_bytes;  /* nvme, when creating the store: its size (0: 1 GiB) */
  uint64_t chunk_elements;        /* nvme: elements streamed per chunk (default 4 Mi) */
  int resume;                     /* nvme: open the store and continue from its last commit */
  /* Added after 0.1.0 (an older caller's smaller struct_size keeps these defaults): */
  uint32_t state_bits;            /* 32 (default): fp32 moments; 8: 8-bit block-wise moments */
  uint32_t block_size;            /* 8-bit: elements per absmax block, a power of two in
                                     [64, 4096] (default 256, bitsandbytes'); with nvme,
                                     chunk_elements must be at least this */
  uint64_t min_8bit_size;         /* 8-bit: parameters with fewer elements keep fp32 moments
                                     (default 4096, bitsandbytes' min_8bit_size) */
} strata_adamw_config;
STRATA_API void strata_adamw_config_init(strata_adamw_config* config);
/* INVALID_ARGUMENT, naming the field, for state_bits other than 32 or 8, a block_size that is
 * not a power of two in [64, 4096] (checked whatever state_bits is), or (8-bit, nvme)
 * chunk_elements < block_size. On resume, the store's committed state must have been written
 * with the same state_bits, block_size and min_8bit_size (the commit records them): anything
 * else is INVALID_ARGUMENT — a store's state is never converted between layouts. */
STRATA_API strata_status strata_adamw_create(const strata_adamw_config* config,
                                             strata_adamw** out_opt);
STRATA_API void strata_adamw_destroy(strata_adamw* opt);
/* Registers parameter `name` of `count` elements: moments zero and step 0, or on resume what
 * the last commit holds for that name (a name the commit lacks starts fresh). */
STRATA_API strata_status strata_adamw_add_param(strata_adamw* opt, const char* name,
                                                size_t count, uint32_t* out_param);
/* One AdamW step of parameter `param`: increments its step, updates `params` (fp32, count
 * elements) in place from `grads` (fp32) and the owned moments. */
STRATA_API strata_status strata_adamw_step(strata_adamw* opt, uint32_t param,
                                           const strata_adamw_hparams* hparams, float* params,
                                           const float* grads);
/* Copies the parameter's state out / in (torch's state_dict): step, exp_avg, exp_avg_sq
 * (count floats each; NULL skips). 8-bit state comes out dequantised (code value × block
 * absmax, in fp32: the moments the next step starts from) and goes in requantised (absmax per
 * block, nearest code, as a step does); set_state then refuses a non-finite moment
 * (INVALID_ARGUMENT). get → set gives back the same state except in blocks whose largest |m|
 * is negative: the signed map's most negative code is -0.9922, so there the block's absmax
 * shrinks to 0.9922 of itself and its codes are rederived (docs/embedding.md). */
STRATA_API strata_status strata_adamw_get_state(strata_adamw* opt, uint32_t param,
                                                int64_t* out_step, float* exp_avg,
                                                float* exp_avg_sq);
STRATA_API strata_status strata_adamw_set_state(strata_adamw* opt, uint32_t param, int64_t step,
                                                const float* exp_avg, const float* exp_avg_sq);
/* nvme: makes the state durable (a store commit, recording the state layout beside the step
 * counts). host: STRATA_ERR_UNSUPPORTED. With 8-bit state the codes and absmax are stored as
 * they are, so a resume continues bit-identically. */
STRATA_API strata_status strata_adamw_commit(strata_adamw* opt);
/* The store under an nvme optimizer (NULL for host), e.g. to keep the master params in it. */
STRATA_API strata_store* strata_adamw_store(strata_adamw* opt);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_STRATA_H */
