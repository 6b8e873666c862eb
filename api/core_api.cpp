// strata/api/core_api.cpp — the C API's common part (version, errors) and its first two
// layers: I/O engines and files (over io/io.h) and the store (over memory/store.h).
#include <cerrno>
#include <cstring>
#include <span>

#include "api/api_internal.h"
#include "io/io_config.h"
#include "strata_build_config.h"

namespace strata::api {

std::string& last_error_text() {
  thread_local std::string text;
  return text;
}

strata_status status_from_kind(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::retryable: return STRATA_ERR_RETRYABLE;
    case ErrorKind::io: return STRATA_ERR_IO;
    case ErrorKind::no_space: return STRATA_ERR_NO_SPACE;
    case ErrorKind::not_found: return STRATA_ERR_NOT_FOUND;
    case ErrorKind::corrupt: return STRATA_ERR_CORRUPT;
    case ErrorKind::invalid_argument: return STRATA_ERR_INVALID_ARGUMENT;
    case ErrorKind::unsupported: return STRATA_ERR_UNSUPPORTED;
    case ErrorKind::internal: return STRATA_ERR_INTERNAL;
  }
  return STRATA_ERR_INTERNAL;
}

}  // namespace strata::api

using strata::api::check;
using strata::api::fail;
using strata::api::guarded;

namespace {

strata_status null_arg(const char* entry, const char* what) {
  return fail(STRATA_ERR_INVALID_ARGUMENT, std::string(entry) + ": " + what + " is NULL");
}

}  // namespace

strata::memory::StoreOptions strata::api::default_store_options() {
  strata::memory::StoreOptions options;
  auto backends = strata::io::available_backends();
  if (!backends.empty()) options.engine.backend = backends.front();
  return options;
}
using strata::api::default_store_options;

extern "C" {

const char* strata_version(void) { return STRATA_VERSION; }
const char* strata_last_error(void) { return strata::api::last_error_text().c_str(); }

const char* strata_status_name(strata_status status) {
  switch (status) {
    case STRATA_OK: return "ok";
    case STRATA_ERR_RETRYABLE: return "retryable";
    case STRATA_ERR_IO: return "io";
    case STRATA_ERR_NO_SPACE: return "no_space";
    case STRATA_ERR_NOT_FOUND: return "not_found";
    case STRATA_ERR_CORRUPT: return "corrupt";
    case STRATA_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case STRATA_ERR_UNSUPPORTED: return "unsupported";
    case STRATA_ERR_INTERNAL: return "internal";
  }
  return "unknown";
}

// ---- I/O ---------------------------------------------------------------------------------

void strata_io_config_init(strata_io_config* config) {
  if (config == nullptr) return;
  *config = strata_io_config{};
  config->struct_size = sizeof(*config);
  config->queue_depth = 32;
  config->block_size_bytes = 1 << 20;
  config->max_requests = 256;
}

strata_status strata_io_engine_create(const strata_io_config* config, strata_io_engine** out) {
  return guarded("strata_io_engine_create", [&]() -> strata_status {
    if (out == nullptr) return null_arg("strata_io_engine_create", "out_engine");
    strata_io_config c;
    strata_io_config_init(&c);
    if (!strata::api::read_sized(config, c))
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_io_engine_create: struct_size not set "
                                               "(call strata_io_config_init)");
    strata::io::EngineConfig ec;
    auto backends = strata::io::available_backends();
    if (backends.empty()) return fail(STRATA_ERR_UNSUPPORTED, "no I/O backend available");
    ec.backend = backends.front();
    if (c.backend != nullptr) {
      auto parsed = strata::io::parse_backend(c.backend);
      if (!parsed) return fail(parsed.error());
      ec.backend = *parsed;
    }
    ec.queue_depth = c.queue_depth;
    ec.block_size_bytes = c.block_size_bytes;
    ec.max_requests = c.max_requests;
    if (c.settings_path != nullptr) {
      auto settings = strata::io::load_io_settings_file(c.settings_path);
      if (!settings) return fail(settings.error());
      const auto& dir = c.use_write_settings ? settings->write : settings->read;
      uint32_t max_requests = ec.max_requests;
      ec = dir.engine_config(settings->sqpoll);
      ec.max_requests = max_requests;
    }
    auto engine = strata::io::make_engine(ec);
    if (!engine) return fail(engine.error());
    *out = new strata_io_engine{std::move(engine).value(), {}};
    return STRATA_OK;
  });
}

void strata_io_engine_destroy(strata_io_engine* engine) {
  if (engine == nullptr) return;
  try {
    (void)engine->engine->wait_all();
  } catch (...) {
  }
  delete engine;
}

const char* strata_io_engine_describe(strata_io_engine* engine) {
  if (engine == nullptr) return "";
  try {
    engine->description = engine->engine->describe();
  } catch (...) {
    engine->description.clear();
  }
  return engine->description.c_str();
}

strata_status strata_io_file_open(const char* const* paths, size_t count, uint64_t stripe_bytes,
                                  uint32_t flags, strata_io_file** out) {
  return guarded("strata_io_file_open", [&]() -> strata_status {
    if (out == nullptr || paths == nullptr) return null_arg("strata_io_file_open", "paths/out_file");
    if (count == 0) return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_io_file_open: no paths");
    std::vector<std::string> list;
    for (size_t i = 0; i < count; ++i) {
      if (paths[i] == nullptr) return null_arg("strata_io_file_open", "a path");
      list.emplace_back(paths[i]);
    }
    strata::io::OpenOptions options;
    options.create = (flags & STRATA_IO_CREATE) != 0;
    options.read_only = (flags & STRATA_IO_READ_ONLY) != 0;
    auto volume = strata::io::Volume::open(list, stripe_bytes == 0 ? (1u << 20) : stripe_bytes,
                                           options);
    if (!volume) return fail(volume.error());
    *out = new strata_io_file{std::move(volume).value()};
    return STRATA_OK;
  });
}

void strata_io_file_close(strata_io_file* file) { delete file; }

strata_status strata_io_file_size(strata_io_file* file, uint64_t* out_size) {
  return guarded("strata_io_file_size", [&]() -> strata_status {
    if (file == nullptr || out_size == nullptr) return null_arg("strata_io_file_size", "file/out");
    auto size = file->volume.size_bytes();
    if (!size) return fail(size.error());
    *out_size = *size;
    return STRATA_OK;
  });
}

strata_status strata_io_file_preallocate(strata_io_file* file, uint64_t size_bytes) {
  return guarded("strata_io_file_preallocate", [&]() -> strata_status {
    if (file == nullptr) return null_arg("strata_io_file_preallocate", "file");
    return check(file->volume.preallocate(size_bytes));
  });
}

strata_status strata_io_file_sync(strata_io_file* file) {
  return guarded("strata_io_file_sync", [&]() -> strata_status {
    if (file == nullptr) return null_arg("strata_io_file_sync", "file");
    return check(file->volume.sync());
  });
}

uint32_t strata_io_file_alignment(strata_io_file* file) {
  return file == nullptr ? 0 : file->volume.alignment_bytes();
}

strata_status strata_io_register_buffer(strata_io_engine* engine, void* base, uint64_t length) {
  return guarded("strata_io_register_buffer", [&]() -> strata_status {
    if (engine == nullptr || base == nullptr) return null_arg("strata_io_register_buffer", "engine/base");
    return check(engine->engine->register_buffer(base, length));
  });
}

static strata_status submit(const char* entry, strata::io::Op op, strata_io_engine* engine,
                            strata_io_file* file, void* buffer, uint64_t length, uint64_t offset,
                            strata_io_token* out) {
  return guarded(entry, [&]() -> strata_status {
    if (engine == nullptr || file == nullptr || out == nullptr || (buffer == nullptr && length > 0))
      return null_arg(entry, "engine/file/buffer/out_token");
    auto id = engine->engine->submit(op, file->volume, buffer, length, offset);
    if (!id) return fail(id.error());
    *out = *id;
    return STRATA_OK;
  });
}

strata_status strata_io_read_async(strata_io_engine* engine, strata_io_file* file, void* buffer,
                                   uint64_t length, uint64_t offset, strata_io_token* out) {
  return submit("strata_io_read_async", strata::io::Op::read, engine, file, buffer, length, offset, out);
}

strata_status strata_io_write_async(strata_io_engine* engine, strata_io_file* file,
                                    const void* buffer, uint64_t length, uint64_t offset,
                                    strata_io_token* out) {
  // The engine's interface is shared by both directions; a write never writes its buffer.
  return submit("strata_io_write_async", strata::io::Op::write, engine, file,
                const_cast<void*>(buffer), length, offset, out);
}

strata_status strata_io_poll(strata_io_engine* engine, strata_io_token token, int* out_done) {
  return guarded("strata_io_poll", [&]() -> strata_status {
    if (engine == nullptr || out_done == nullptr) return null_arg("strata_io_poll", "engine/out_done");
    *out_done = engine->engine->is_done(token) ? 1 : 0;
    return STRATA_OK;
  });
}

strata_status strata_io_wait(strata_io_engine* engine, strata_io_token token) {
  return guarded("strata_io_wait", [&]() -> strata_status {
    if (engine == nullptr) return null_arg("strata_io_wait", "engine");
    return check(engine->engine->wait(token));
  });
}

strata_status strata_io_wait_all(strata_io_engine* engine) {
  return guarded("strata_io_wait_all", [&]() -> strata_status {
    if (engine == nullptr) return null_arg("strata_io_wait_all", "engine");
    return check(engine->engine->wait_all());
  });
}

// ---- the store ---------------------------------------------------------------------------

strata_status strata_store_create(const char* dir, uint64_t capacity_bytes, strata_store** out) {
  return guarded("strata_store_create", [&]() -> strata_status {
    if (dir == nullptr || out == nullptr) return null_arg("strata_store_create", "dir/out_store");
    auto store = strata::memory::Store::create(dir, {}, capacity_bytes, default_store_options());
    if (!store) return fail(store.error());
    *out = new strata_store{std::move(store).value(), dir, {}};
    return STRATA_OK;
  });
}

strata_status strata_store_create_striped(const char* dir, const char* const* data_paths,
                                         size_t count, uint64_t stripe_bytes,
                                         uint64_t capacity_bytes, strata_store** out) {
  return guarded("strata_store_create_striped", [&]() -> strata_status {
    if (dir == nullptr || out == nullptr || (data_paths == nullptr && count > 0))
      return null_arg("strata_store_create_striped", "dir/data_paths/out_store");
    std::vector<std::string> paths;
    for (size_t i = 0; i < count; ++i) {
      if (data_paths[i] == nullptr) return null_arg("strata_store_create_striped", "a data path");
      paths.emplace_back(data_paths[i]);
    }
    auto options = default_store_options();
    if (stripe_bytes != 0) options.stripe_bytes = stripe_bytes;
    auto store = strata::memory::Store::create(dir, paths, capacity_bytes, options);
    if (!store) return fail(store.error());
    *out = new strata_store{std::move(store).value(), dir, {}};
    return STRATA_OK;
  });
}

strata_status strata_store_open(const char* dir, int read_only, strata_store** out) {
  return guarded("strata_store_open", [&]() -> strata_status {
    if (dir == nullptr || out == nullptr) return null_arg("strata_store_open", "dir/out_store");
    auto options = default_store_options();
    options.read_only = read_only != 0;
    auto store = strata::memory::Store::open(dir, options);
    if (!store) return fail(store.error());
    *out = new strata_store{std::move(store).value(), dir, {}};
    return STRATA_OK;
  });
}

strata_status strata_store_set_verify_once(strata_store* store, int once) {
  return guarded("strata_store_set_verify_once", [&]() -> strata_status {
    if (store == nullptr) return null_arg("strata_store_set_verify_once", "store");
    if (once != 0 && once != 1)
      return fail(STRATA_ERR_INVALID_ARGUMENT,
                  "strata_store_set_verify_once: once is " + std::to_string(once) + "; give 0 (every read) or 1");
    store->verify_reads = once != 0 ? strata::memory::VerifyReads::once : strata::memory::VerifyReads::always;
    if (store->held) store->held->set_verify_reads(store->verify_reads);  // lent: applied when given back
    return STRATA_OK;
  });
}

void strata_store_close(strata_store* store) {
  try {
    delete store;
  } catch (...) {
  }
}

static strata_status check_dtype(const char* entry, strata_dtype dtype) {
  if (dtype != STRATA_F32 && dtype != STRATA_BF16 && dtype != STRATA_F16)
    return fail(STRATA_ERR_INVALID_ARGUMENT, std::string(entry) + ": unknown dtype " +
                                                 std::to_string(static_cast<int>(dtype)));
  return STRATA_OK;
}

strata_status strata_store_put_async(strata_store* store, const char* name, strata_dtype dtype,
                                     const int64_t* shape, size_t ndim, const void* data,
                                     uint64_t size_bytes, uint64_t* out_ticket) {
  return guarded("strata_store_put", [&]() -> strata_status {
    if (store == nullptr || name == nullptr || (shape == nullptr && ndim > 0) ||
        (data == nullptr && size_bytes > 0) || out_ticket == nullptr)
      return null_arg("strata_store_put", "store/name/shape/data");
    if (strata_status s = check_dtype("strata_store_put", dtype); s != STRATA_OK) return s;
    uint64_t elements = 1;
    for (size_t i = 0; i < ndim; ++i) {
      if (shape[i] < 0)
        return fail(STRATA_ERR_INVALID_ARGUMENT,
                    std::string("strata_store_put: tensor ") + name + " has a negative dimension");
      elements *= static_cast<uint64_t>(shape[i]);
    }
    auto type = static_cast<strata::DType>(dtype);
    if (elements * strata::dtype_size_bytes(type) != size_bytes)
      return fail(STRATA_ERR_INVALID_ARGUMENT,
                  std::string("strata_store_put: tensor ") + name + ": " + std::to_string(size_bytes) +
                      " bytes given, its shape and dtype need " +
                      std::to_string(elements * strata::dtype_size_bytes(type)));
    auto ticket = store->store().write_tensor_async(name, type, std::span<const int64_t>(shape, ndim),
                                                  data, size_bytes);
    if (!ticket) return fail(ticket.error());
    *out_ticket = ticket->value;
    return STRATA_OK;
  });
}

strata_status strata_store_put(strata_store* store, const char* name, strata_dtype dtype,
                               const int64_t* shape, size_t ndim, const void* data,
                               uint64_t size_bytes) {
  uint64_t ticket = 0;
  strata_status s = strata_store_put_async(store, name, dtype, shape, ndim, data, size_bytes, &ticket);
  if (s != STRATA_OK) return s;
  return strata_store_wait(store, ticket);
}

strata_status strata_store_get_async(strata_store* store, const char* name, void* data,
                                     uint64_t capacity_bytes, uint64_t* out_ticket) {
  return guarded("strata_store_get", [&]() -> strata_status {
    if (store == nullptr || name == nullptr || out_ticket == nullptr)
      return null_arg("strata_store_get", "store/name/out");
    auto ticket = store->store().read_tensor_async(name, data, capacity_bytes);
    if (!ticket) return fail(ticket.error());
    *out_ticket = ticket->value;
    return STRATA_OK;
  });
}

strata_status strata_store_get(strata_store* store, const char* name, void* data,
                               uint64_t capacity_bytes) {
  uint64_t ticket = 0;
  strata_status s = strata_store_get_async(store, name, data, capacity_bytes, &ticket);
  if (s != STRATA_OK) return s;
  return strata_store_wait(store, ticket);
}

strata_status strata_store_wait(strata_store* store, uint64_t ticket) {
  return guarded("strata_store_wait", [&]() -> strata_status {
    if (store == nullptr) return null_arg("strata_store_wait", "store");
    return check(store->store().wait(strata::memory::StoreTicket{ticket}));
  });
}

strata_status strata_store_info(strata_store* store, const char* name, strata_dtype* out_dtype,
                                size_t* out_ndim, int64_t* out_shape, size_t shape_capacity,
                                uint64_t* out_size_bytes) {
  return guarded("strata_store_info", [&]() -> strata_status {
    if (store == nullptr || name == nullptr) return null_arg("strata_store_info", "store/name");
    auto record = store->store().find(name);
    if (!record)
      return fail(STRATA_ERR_NOT_FOUND, std::string("tensor ") + name + " is not in the store " +
                                            store->store().dir());
    if (out_dtype) *out_dtype = static_cast<strata_dtype>(record->dtype);
    if (out_ndim) *out_ndim = record->shape.size();
    for (size_t i = 0; out_shape && i < record->shape.size() && i < shape_capacity; ++i)
      out_shape[i] = record->shape[i];
    if (out_size_bytes) *out_size_bytes = record->size_bytes;
    return STRATA_OK;
  });
}

strata_status strata_store_remove(strata_store* store, const char* name) {
  return guarded("strata_store_remove", [&]() -> strata_status {
    if (store == nullptr || name == nullptr) return null_arg("strata_store_remove", "store/name");
    return check(store->store().remove_tensor(name));
  });
}

strata_status strata_store_commit(strata_store* store, uint64_t step, const char* const* keys,
                                  const char* const* values, size_t count) {
  return guarded("strata_store_commit", [&]() -> strata_status {
    if (store == nullptr || (count > 0 && (keys == nullptr || values == nullptr)))
      return null_arg("strata_store_commit", "store/keys/values");
    std::map<std::string, std::string> metadata;
    for (size_t i = 0; i < count; ++i) {
      if (keys[i] == nullptr || values[i] == nullptr)
        return null_arg("strata_store_commit", "a metadata key or value");
      metadata[keys[i]] = values[i];
    }
    return check(store->store().commit(step, metadata));
  });
}

strata_status strata_store_committed_step(strata_store* store, uint64_t* out_step) {
  return guarded("strata_store_committed_step", [&]() -> strata_status {
    if (store == nullptr || out_step == nullptr) return null_arg("strata_store_committed_step", "store/out");
    *out_step = store->store().committed_step();
    return STRATA_OK;
  });
}

strata_status strata_store_metadata(strata_store* store, const char* key, char* buffer,
                                    size_t capacity, size_t* out_length) {
  return guarded("strata_store_metadata", [&]() -> strata_status {
    if (store == nullptr || key == nullptr) return null_arg("strata_store_metadata", "store/key");
    const auto& metadata = store->store().committed_metadata();
    auto it = metadata.find(key);
    if (it == metadata.end())
      return fail(STRATA_ERR_NOT_FOUND, std::string("metadata key ") + key +
                                            " is not in the last commit of " + store->store().dir());
    if (out_length) *out_length = it->second.size();
    if (buffer != nullptr && capacity > 0) {
      size_t n = it->second.size() < capacity - 1 ? it->second.size() : capacity - 1;
      std::memcpy(buffer, it->second.data(), n);
      buffer[n] = '\0';
    }
    return STRATA_OK;
  });
}

strata_status strata_store_verify(strata_store* store, uint64_t* out_damaged) {
  return guarded("strata_store_verify", [&]() -> strata_status {
    if (store == nullptr) return null_arg("strata_store_verify", "store");
    auto report = store->store().verify();
    if (!report) return fail(report.error());
    if (out_damaged) *out_damaged = report->damages.size();
    if (!report->ok()) {
      const auto& d = report->damages.front();
      return fail(STRATA_ERR_CORRUPT, "tensor " + d.tensor + " at offset " +
                                          std::to_string(d.file_offset_bytes) + " in " + d.path +
                                          ": " + d.what);
    }
    return STRATA_OK;
  });
}

strata_status strata_store_count(strata_store* store, size_t* out_count) {
  return guarded("strata_store_count", [&]() -> strata_status {
    if (store == nullptr || out_count == nullptr) return null_arg("strata_store_count", "store/out");
    store->names.clear();
    for (const auto& record : store->store().list()) store->names.push_back(record.name);
    *out_count = store->names.size();
    return STRATA_OK;
  });
}

strata_status strata_store_name(strata_store* store, size_t index, const char** out_name) {
  return guarded("strata_store_name", [&]() -> strata_status {
    if (store == nullptr || out_name == nullptr) return null_arg("strata_store_name", "store/out");
    if (index >= store->names.size())
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_store_name: index " + std::to_string(index) +
                                                   " is past the count strata_store_count gave");
    *out_name = store->names[index].c_str();
    return STRATA_OK;
  });
}

}  // extern "C"
