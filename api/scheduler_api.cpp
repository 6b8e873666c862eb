// strata/api/scheduler_api.cpp — layer 3 of the C API: access plans and the prefetch scheduler.
// The one file that wraps scheduler/scheduler.h, through its public API only, so a change of
// that header is reconciled here. The compute tier is the CPU device with the caller's budget.
#include <cstring>
#include <optional>

#include "api/api_internal.h"
#include "device/device.h"
#include "memory/host_arena.h"
#include "scheduler/scheduler.h"

using strata::api::check;
using strata::api::fail;
using strata::api::guarded;
namespace sched = strata::scheduler;

struct strata_plan {
  sched::AccessPlan plan;
};

struct strata_scheduler {
  // Destroyed in reverse: the scheduler first, then the backing, the store, the arena and the
  // device it uses.
  strata_store* lender = nullptr;  // the caller's handle, given its store back at destroy
  std::unique_ptr<strata::device::Device> device;
  std::optional<strata::memory::Store> store;  // reopened here: its engine belongs to the I/O thread
  std::unique_ptr<strata::memory::HostArena> arena;
  std::unique_ptr<sched::NvmeBacking> backing;
  std::unique_ptr<sched::Scheduler> scheduler;
  std::map<size_t, sched::StepBuffers> held;  // acquired steps, by step index
};

namespace {
strata_status null_arg(const char* entry, const char* what) {
  return fail(STRATA_ERR_INVALID_ARGUMENT, std::string(entry) + ": " + what + " is NULL");
}
}  // namespace

extern "C" {

strata_status strata_plan_create(strata_plan** out) {
  return guarded("strata_plan_create", [&]() -> strata_status {
    if (out == nullptr) return null_arg("strata_plan_create", "out_plan");
    *out = new strata_plan{};
    return STRATA_OK;
  });
}

void strata_plan_destroy(strata_plan* plan) { delete plan; }

strata_status strata_plan_add_tensor(strata_plan* plan, const char* name, uint64_t size_bytes,
                                     strata_home home, uint32_t* out_tensor) {
  return guarded("strata_plan_add_tensor", [&]() -> strata_status {
    if (plan == nullptr || name == nullptr || out_tensor == nullptr)
      return null_arg("strata_plan_add_tensor", "plan/name/out_tensor");
    if (home != STRATA_HOME_NVME && home != STRATA_HOME_HOST)
      return fail(STRATA_ERR_INVALID_ARGUMENT, std::string("tensor ") + name + ": unknown home");
    *out_tensor = plan->plan.add_tensor(name, size_bytes,
                                        home == STRATA_HOME_HOST ? sched::Home::host : sched::Home::nvme);
    return STRATA_OK;
  });
}

strata_status strata_plan_add_step(strata_plan* plan, const char* name, const uint32_t* reads,
                                   size_t read_count, const uint32_t* writes, size_t write_count,
                                   size_t* out_step) {
  return guarded("strata_plan_add_step", [&]() -> strata_status {
    if (plan == nullptr || name == nullptr || (reads == nullptr && read_count > 0) ||
        (writes == nullptr && write_count > 0))
      return null_arg("strata_plan_add_step", "plan/name/reads/writes");
    std::vector<sched::TensorId> r(reads, reads + read_count), w(writes, writes + write_count);
    size_t step = plan->plan.add_step(name, std::move(r), std::move(w));
    if (out_step) *out_step = step;
    return STRATA_OK;
  });
}

void strata_sched_config_init(strata_sched_config* config) {
  if (config == nullptr) return;
  *config = strata_sched_config{};
  config->struct_size = sizeof(*config);
  config->io_queue_tensors = 4;
}

strata_status strata_sched_create(const strata_plan* plan, strata_store* store,
                                  const strata_sched_config* config, strata_scheduler** out) {
  return guarded("strata_sched_create", [&]() -> strata_status {
    if (plan == nullptr || config == nullptr || out == nullptr)
      return null_arg("strata_sched_create", "plan/config/out_sched");
    strata_sched_config c;
    strata_sched_config_init(&c);
    if (!strata::api::read_sized(config, c))
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_sched_create: struct_size not set");
    if (c.host_budget_bytes == 0 || c.device_budget_bytes == 0)
      return fail(STRATA_ERR_INVALID_ARGUMENT,
                  "strata_sched_create: host_budget_bytes and device_budget_bytes are required");
    if (strata::Status v = plan->plan.validate(); !v.ok()) return fail(v.error());
    bool needs_store = false;
    for (const auto& t : plan->plan.tensors()) needs_store |= t.home == sched::Home::nvme;
    if (needs_store && store == nullptr)
      return fail(STRATA_ERR_INVALID_ARGUMENT,
                  "strata_sched_create: the plan has NVMe-homed tensors but no store was given");

    auto handle = std::make_unique<strata_scheduler>();
    auto device = strata::device::make_device(strata::device::Kind::cpu, c.device_budget_bytes);
    if (!device) return fail(device.error());
    handle->device = std::move(device).value();
    strata::memory::HostArenaOptions arena_options;
    arena_options.capacity_bytes = c.host_budget_bytes;
    auto arena = strata::memory::HostArena::create(arena_options);
    if (!arena) return fail(arena.error());
    handle->arena = std::make_unique<strata::memory::HostArena>(std::move(arena).value());
    // Gives a lent store back to the caller's handle, reopened on the caller's thread.
    auto give_back = [&](strata_scheduler& h) {
      if (!h.store) return;
      std::string dir = h.store->dir();
      h.store.reset();
      auto back = strata::memory::Store::open(dir, h.lender->options());
      if (back) h.lender->held.emplace(std::move(back).value());
    };
    if (needs_store) {
      // Lend the store: commit what the caller wrote (durable, and visible to a reopen),
      // close it, and reopen it here so the scheduler's I/O thread is the first — and only —
      // thread to submit to its engine (an io_uring engine belongs to one thread).
      strata::memory::Store& own = store->store();
      if (strata::Status c = own.commit(own.committed_step(), own.committed_metadata()); !c.ok())
        return fail(c.error());
      store->held.reset();
      auto reopened = strata::memory::Store::open(store->dir, store->options());
      if (!reopened) {
        auto back = strata::memory::Store::open(store->dir, store->options());
        if (back) store->held.emplace(std::move(back).value());
        return fail(reopened.error());
      }
      handle->store.emplace(std::move(reopened).value());
      handle->lender = store;
      auto backing = sched::make_store_backing(*handle->store, plan->plan);
      if (!backing) {
        give_back(*handle);
        return fail(backing.error());
      }
      handle->backing = std::move(backing).value();
    }
    sched::SchedulerOptions options;
    options.host_budget_bytes = c.host_budget_bytes;
    options.io_queue_tensors = c.io_queue_tensors == 0 ? 4 : c.io_queue_tensors;
    auto scheduler = sched::Scheduler::create(plan->plan, *handle->device, *handle->arena,
                                              handle->backing.get(), options);
    if (!scheduler) {
      handle->backing.reset();
      give_back(*handle);
      return fail(scheduler.error());
    }
    handle->scheduler = std::move(scheduler).value();
    *out = handle.release();
    return STRATA_OK;
  });
}

void strata_sched_destroy(strata_scheduler* sched) {
  if (sched == nullptr) return;
  try {
    // Give the store back with every write-back committed, reopened for the caller's thread.
    for (auto& [step, buffers] : sched->held) (void)sched->scheduler->release(step);
    sched->held.clear();
    if (sched->store) {
      strata::memory::Store& s = *sched->store;
      strata::Status status = sched->scheduler->flush();
      if (status.ok())
        status = sched->scheduler->run_on_io_thread(
            [&] { return s.commit(s.committed_step(), s.committed_metadata()); });
      if (!status.ok()) strata::api::last_error_text() = status.to_string();
    }
    sched->scheduler.reset();
    sched->backing.reset();
    if (sched->store) {
      std::string dir = sched->store->dir();
      sched->store.reset();
      auto back = strata::memory::Store::open(dir, sched->lender->options());
      if (back) sched->lender->held.emplace(std::move(back).value());
      else strata::api::last_error_text() = back.error().to_string();
    }
    delete sched;
  } catch (...) {
  }
}

strata_status strata_sched_acquire(strata_scheduler* sched, size_t step) {
  return guarded("strata_sched_acquire", [&]() -> strata_status {
    if (sched == nullptr) return null_arg("strata_sched_acquire", "sched");
    if (step >= sched->scheduler->plan().step_count())
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_sched_acquire: step " + std::to_string(step) +
                                                   " is past the plan's " +
                                                   std::to_string(sched->scheduler->plan().step_count()));
    auto buffers = sched->scheduler->acquire(step);
    if (!buffers) return fail(buffers.error());
    sched->held[step] = std::move(buffers).value();
    return STRATA_OK;
  });
}

strata_status strata_sched_data(strata_scheduler* sched, size_t step, uint32_t tensor, void** out) {
  return guarded("strata_sched_data", [&]() -> strata_status {
    if (sched == nullptr || out == nullptr) return null_arg("strata_sched_data", "sched/out_data");
    auto it = sched->held.find(step);
    if (it == sched->held.end())
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_sched_data: step " + std::to_string(step) +
                                                   " is not acquired");
    for (const auto& [id, data] : it->second.all()) {
      if (id == tensor) {
        *out = data;
        return STRATA_OK;
      }
    }
    return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_sched_data: tensor " + std::to_string(tensor) +
                                                 " is not used by step " + std::to_string(step));
  });
}

strata_status strata_sched_release(strata_scheduler* sched, size_t step) {
  return guarded("strata_sched_release", [&]() -> strata_status {
    if (sched == nullptr) return null_arg("strata_sched_release", "sched");
    if (sched->held.erase(step) == 0)
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_sched_release: step " + std::to_string(step) +
                                                   " is not acquired");
    return check(sched->scheduler->release(step));
  });
}

strata_status strata_sched_flush(strata_scheduler* sched) {
  return guarded("strata_sched_flush", [&]() -> strata_status {
    if (sched == nullptr) return null_arg("strata_sched_flush", "sched");
    if (!sched->held.empty())
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_sched_flush: release every step first");
    return check(sched->scheduler->flush());
  });
}

static strata_status check_host_tensor(strata_scheduler* sched, uint32_t tensor, const char* entry) {
  const auto& tensors = sched->scheduler->plan().tensors();
  if (tensor >= tensors.size() || tensors[tensor].home != sched::Home::host)
    return fail(STRATA_ERR_INVALID_ARGUMENT, std::string(entry) + ": tensor " +
                                                 std::to_string(tensor) + " is not host-homed");
  return STRATA_OK;
}

strata_status strata_sched_host_begin(strata_scheduler* sched, uint32_t tensor, void** out) {
  return guarded("strata_sched_host_begin", [&]() -> strata_status {
    if (sched == nullptr || out == nullptr) return null_arg("strata_sched_host_begin", "sched/out");
    if (auto s = check_host_tensor(sched, tensor, "strata_sched_host_begin"); s != STRATA_OK) return s;
    *out = sched->scheduler->begin_host_access(tensor);
    return STRATA_OK;
  });
}

strata_status strata_sched_host_end(strata_scheduler* sched, uint32_t tensor) {
  return guarded("strata_sched_host_end", [&]() -> strata_status {
    if (sched == nullptr) return null_arg("strata_sched_host_end", "sched");
    if (auto s = check_host_tensor(sched, tensor, "strata_sched_host_end"); s != STRATA_OK) return s;
    sched->scheduler->end_host_access(tensor);
    return STRATA_OK;
  });
}

strata_status strata_sched_stats_get(strata_scheduler* sched, strata_sched_stats* out) {
  return guarded("strata_sched_stats_get", [&]() -> strata_status {
    if (sched == nullptr || out == nullptr || out->struct_size < sizeof(size_t))
      return null_arg("strata_sched_stats_get", "sched/out_stats (with struct_size)");
    auto s = sched->scheduler->stats();
    strata_sched_stats full{};
    full.struct_size = out->struct_size;
    full.steps_acquired = s.steps_acquired;
    full.stall_ns = s.stall_ns;
    full.max_step_stall_ns = s.max_step_stall_ns;
    full.nvme_read_bytes = s.transfers[static_cast<size_t>(sched::TierPair::nvme_to_host)].bytes;
    full.nvme_write_bytes = s.transfers[static_cast<size_t>(sched::TierPair::host_to_nvme)].bytes;
    full.host_high_water_bytes = s.host_high_water_bytes;
    full.device_high_water_bytes = s.device_high_water_bytes;
    std::memcpy(out, &full, out->struct_size < sizeof(full) ? out->struct_size : sizeof(full));
    return STRATA_OK;
  });
}

}  // extern "C"
