// strata/api/api_internal.h — what every C entry point shares: the per-thread last error,
// the mapping of strata::Error to a strata_status, and the catch-all guard that keeps C++
// exceptions from crossing the C boundary. Internal to libstrata; not installed.
#pragma once

#include <cstring>
#include <exception>
#include <string>

#include "common/status.h"
#include "include/strata/strata.h"

namespace strata::api {

// The text strata_last_error() returns; one per thread, overwritten by each failing call.
std::string& last_error_text();

strata_status status_from_kind(ErrorKind kind);

// Records the failure for strata_last_error() and returns its code.
inline strata_status fail(const Error& error) {
  last_error_text() = error.to_string();
  return status_from_kind(error.kind);
}
inline strata_status fail(strata_status code, std::string message) {
  last_error_text() = std::move(message);
  return code;
}
inline strata_status check(const Status& status) {
  return status.ok() ? STRATA_OK : fail(status.error());
}

// Runs `body` (returning strata_status) with every exception turned into a status: no C++
// exception may unwind into C callers.
// Thrown (and caught by `guarded`) when a handle cannot be used now, e.g. a store lent to a
// scheduler: an invalid_argument for the caller, not a crash.
struct Misuse {
  std::string message;
};

template <typename Body>
strata_status guarded(const char* entry, Body&& body) noexcept {
  try {
    return body();
  } catch (const Misuse& misuse) {
    return fail(STRATA_ERR_INVALID_ARGUMENT, std::string(entry) + ": " + misuse.message);
  } catch (const std::bad_alloc&) {
    return fail(STRATA_ERR_NO_SPACE, std::string(entry) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(STRATA_ERR_INTERNAL, std::string(entry) + ": " + e.what());
  } catch (...) {
    return fail(STRATA_ERR_INTERNAL, std::string(entry) + ": unknown exception");
  }
}

// Copies the caller's size-prefixed struct into a default-initialised one: a caller built
// against an older header passes fewer bytes, and the new fields keep their defaults.
template <typename T>
bool read_sized(const T* in, T& out) {
  if (in == nullptr) return true;
  if (in->struct_size < sizeof(size_t)) return false;
  size_t n = in->struct_size < sizeof(T) ? in->struct_size : sizeof(T);
  std::memcpy(static_cast<void*>(&out), in, n);
  out.struct_size = sizeof(T);
  return true;
}

}  // namespace strata::api

namespace strata::memory { struct StoreOptions; }
namespace strata::api {
// Options of every store the C API opens: the first available I/O backend.
strata::memory::StoreOptions default_store_options();
}

// The handles: C names, C++ bodies. Defined here so the layers can reach each other
// (the scheduler wraps a store, the nvme optimizer owns one).
#include <map>
#include <memory>
#include <vector>

#include "io/io.h"
#include "memory/store.h"

struct strata_io_engine {
  std::unique_ptr<strata::io::Engine> engine;
  std::string description;
};
struct strata_io_file {
  strata::io::Volume volume;
};
#include <optional>
struct strata_store {
  // Empty while a scheduler holds the store (its I/O thread must own the store's engine, so
  // the scheduler reopens it there and hands it back, reopened, when destroyed).
  std::optional<strata::memory::Store> held;
  std::string dir;
  std::vector<std::string> names;  // what strata_store_name hands out
  strata::memory::VerifyReads verify_reads = strata::memory::VerifyReads::always;  // strata_store_set_verify_once
  // What the store is reopened with when a scheduler borrows it and gives it back.
  strata::memory::StoreOptions options() const {
    strata::memory::StoreOptions options = strata::api::default_store_options();
    options.verify_reads = verify_reads;
    return options;
  }
  strata::memory::Store& store() {
    if (!held) throw strata::api::Misuse{"store " + dir + " is lent to a scheduler until strata_sched_destroy"};
    return *held;
  }
};
