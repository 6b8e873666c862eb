// strata/scheduler/plan.cpp — the access plan, the timeline, and the store-backed NVMe home.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/size.h"
#include "memory/store.h"
#include "scheduler/scheduler.h"

namespace strata::scheduler {

const char* home_name(Home home) { return home == Home::nvme ? "nvme" : "host"; }

TensorId AccessPlan::add_tensor(std::string name, uint64_t size_bytes, Home home) {
  tensors_.push_back(PlanTensor{std::move(name), size_bytes, home});
  return static_cast<TensorId>(tensors_.size() - 1);
}

TensorId AccessPlan::add_host_only_tensor(std::string name, uint64_t size_bytes) {
  tensors_.push_back(PlanTensor{std::move(name), size_bytes, Home::host, true});
  return static_cast<TensorId>(tensors_.size() - 1);
}

size_t AccessPlan::add_step(std::string name, std::vector<TensorId> reads, std::vector<TensorId> writes) {
  steps_.push_back(PlanStep{std::move(name), std::move(reads), std::move(writes)});
  return steps_.size() - 1;
}

std::vector<TensorId> AccessPlan::step_tensors(size_t step) const {
  std::vector<TensorId> out;
  auto add = [&](TensorId id) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  for (TensorId id : steps_[step].reads) add(id);
  for (TensorId id : steps_[step].writes) add(id);
  return out;
}

uint64_t AccessPlan::step_bytes(size_t step, uint64_t alignment_bytes) const {
  uint64_t total = 0;
  for (TensorId id : step_tensors(step)) total += align_up(tensors_[id].size_bytes, alignment_bytes);
  return total;
}

Status AccessPlan::validate() const {
  auto bad = [](std::string message) { return Status(make_error(ErrorKind::invalid_argument, std::move(message))); };
  if (steps_.empty()) return bad("the access plan has no steps");
  std::set<std::string> names;
  for (const PlanTensor& tensor : tensors_) {
    if (tensor.size_bytes == 0) return bad(fmt::format("plan tensor '{}' has size 0", tensor.name));
    if (!names.insert(tensor.name).second) return bad(fmt::format("plan tensor '{}' is added twice", tensor.name));
  }
  std::vector<bool> used(tensors_.size(), false);
  for (const PlanStep& step : steps_) {
    for (const auto* list : {&step.reads, &step.writes})
      for (TensorId id : *list) {
        if (id >= tensors_.size())
          return bad(fmt::format("plan step '{}' names tensor id {} but the plan has {} tensors", step.name, id,
                                 tensors_.size()));
        used[id] = true;
      }
  }
  // A tensor no step uses is a plan that forgot it, unless it says it is the host's alone; then
  // a step naming it would move state the host updates in place.
  for (size_t id = 0; id < tensors_.size(); ++id) {
    if (tensors_[id].host_only && used[id])
      return bad(fmt::format("plan tensor '{}' is host-only but a step uses it", tensors_[id].name));
    if (!tensors_[id].host_only && !used[id])
      return bad(fmt::format("plan tensor '{}' is used by no step", tensors_[id].name));
  }
  return Status();
}

// --- timeline -------------------------------------------------------------------------

const char* trace_track_name(TraceTrack track) {
  switch (track) {
    case TraceTrack::io: return "io";
    case TraceTrack::h2d: return "h2d";
    case TraceTrack::d2h: return "d2h";
    case TraceTrack::compute: return "compute";
    case TraceTrack::stall: return "stall";
    case TraceTrack::io_write: return "io write";
  }
  return "?";
}

const char* tier_pair_name(TierPair pair) {
  switch (pair) {
    case TierPair::nvme_to_host: return "nvme_to_host";
    case TierPair::host_to_device: return "host_to_device";
    case TierPair::device_to_host: return "device_to_host";
    case TierPair::host_to_nvme: return "host_to_nvme";
  }
  return "?";
}

Timeline::Timeline(size_t capacity_events) : capacity_events_(capacity_events), origin_ns_(now_ns()) {
  events_.reserve(capacity_events);
}

uint64_t Timeline::now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void Timeline::record(TraceTrack track, std::string_view name, uint64_t start_ns, uint64_t end_ns,
                      uint64_t size_bytes) {
  std::lock_guard lock(mutex_);
  if (events_.size() >= capacity_events_) {
    ++dropped_events_;
    return;
  }
  Event event{track, {}, start_ns, end_ns, size_bytes};
  const size_t length = std::min(name.size(), sizeof(event.name) - 1);
  std::memcpy(event.name, name.data(), length);
  event.name[length] = '\0';
  events_.push_back(event);
}

size_t Timeline::event_count() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

uint64_t Timeline::dropped_events() const {
  std::lock_guard lock(mutex_);
  return dropped_events_;
}

Status Timeline::write_json(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  // Track names first, so Perfetto and chrome://tracing label the rows.
  for (TraceTrack track : {TraceTrack::io, TraceTrack::io_write, TraceTrack::h2d, TraceTrack::d2h, TraceTrack::compute,
                            TraceTrack::stall}) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", static_cast<int>(track)},
                      {"args", {{"name", trace_track_name(track)}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 1}, {"tid", static_cast<int>(track)},
                      {"args", {{"sort_index", static_cast<int>(track)}}}});
  }
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", "strata scheduler"}}}});
  {
    std::lock_guard lock(mutex_);
    for (const Event& event : events_) {
      const double ts_us = static_cast<double>(event.start_ns - std::min(event.start_ns, origin_ns_)) / 1e3;
      const double dur_us = static_cast<double>(event.end_ns - std::min(event.end_ns, event.start_ns)) / 1e3;
      nlohmann::json entry = {{"ph", "X"}, {"name", event.name}, {"cat", trace_track_name(event.track)},
                              {"pid", 1}, {"tid", static_cast<int>(event.track)}, {"ts", ts_us}, {"dur", dur_us}};
      if (event.size_bytes != 0) entry["args"] = {{"bytes", event.size_bytes}};
      events.push_back(std::move(entry));
    }
  }
  nlohmann::json document = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  const std::string text = document.dump();
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return make_errno_error(errno, "open", path);
  const size_t written = std::fwrite(text.data(), 1, text.size(), file);
  const int close_result = std::fclose(file);
  if (written != text.size() || close_result != 0) return make_errno_error(errno, "write", path, 0, text.size());
  return Status();
}

// --- the store as NVMe home -----------------------------------------------------------

namespace {

class StoreBacking final : public NvmeBacking {
 public:
  StoreBacking(memory::Store& store, std::vector<memory::TensorRecord> records)
      : store_(store), records_(std::move(records)) {}

  Result<uint64_t> submit_read(TensorId tensor, const PlanTensor& spec, void* host_dst) override {
    Result<memory::StoreTicket> ticket = store_.read_tensor_async(spec.name, host_dst, spec.size_bytes);
    if (!ticket.ok()) return named(ticket.error(), spec);
    (void)tensor;
    return ticket->value;
  }
  Result<uint64_t> submit_write(TensorId tensor, const PlanTensor& spec, const void* host_src) override {
    const memory::TensorRecord& record = records_[tensor];
    Result<memory::StoreTicket> ticket =
        store_.write_tensor_async(spec.name, record.dtype, record.shape, host_src, spec.size_bytes);
    if (!ticket.ok()) return named(ticket.error(), spec);
    return ticket->value;
  }
  Status wait(uint64_t ticket) override { return store_.wait(memory::StoreTicket{ticket}); }
  bool wait_some(uint64_t ticket) override { return store_.wait_some(memory::StoreTicket{ticket}); }
  Status register_host(memory::HostArena& arena) override { return arena.register_with(store_.engine()); }

 private:
  static Error named(Error error, const PlanTensor& spec) {
    if (error.tensor.empty()) error.tensor = spec.name;
    return error;
  }
  memory::Store& store_;
  std::vector<memory::TensorRecord> records_;  // dtype and shape to write back with
};

}  // namespace

Result<std::unique_ptr<NvmeBacking>> make_store_backing(memory::Store& store, const AccessPlan& plan) {
  std::vector<memory::TensorRecord> records(plan.tensors().size());
  for (size_t id = 0; id < plan.tensors().size(); ++id) {
    const PlanTensor& spec = plan.tensors()[id];
    if (spec.home != Home::nvme) continue;
    std::optional<memory::TensorRecord> record = store.find(spec.name);
    if (!record) {
      Error error = make_error(ErrorKind::not_found,
                               fmt::format("plan tensor '{}' is not in the store at {}", spec.name, store.dir()));
      error.tensor = spec.name;
      return error;
    }
    if (record->size_bytes != spec.size_bytes)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("plan tensor '{}' is {} bytes but the store holds {} bytes", spec.name,
                                    spec.size_bytes, record->size_bytes));
    records[id] = std::move(*record);
  }
  return std::unique_ptr<NvmeBacking>(std::make_unique<StoreBacking>(store, std::move(records)));
}

}  // namespace strata::scheduler
