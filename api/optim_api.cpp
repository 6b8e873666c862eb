// strata/api/optim_api.cpp — layer 4 of the C API: CPU AdamW over caller buffers, and an AdamW
// that owns the moments of registered parameters in host memory or in a store.
//
// NVMe state is streamed in chunks of `chunk_elements`: each parameter's exp_avg and
// exp_avg_sq are store tensors "<name>/exp_avg/<chunk>" and "<name>/exp_avg_sq/<chunk>".
// A step reads chunk i+1 while chunk i is computed, and chunk i's write-back runs while
// chunk i+1 is computed (two buffer slots), so host memory holds four chunks whatever the
// model size. Step counters travel in the commit's metadata ("adamw.step.<name>").
#include <cstdlib>
#include <cstring>

#include "api/api_internal.h"
#include "kernels/optim/adamw.h"

using strata::api::check;
using strata::api::fail;
using strata::api::guarded;
namespace k = strata::kernels;

namespace {

strata_status null_arg(const char* entry, const char* what) {
  return fail(STRATA_ERR_INVALID_ARGUMENT, std::string(entry) + ": " + what + " is NULL");
}

// A page-aligned float buffer (direct I/O takes it without bouncing).
struct AlignedFloats {
  float* data = nullptr;
  size_t count = 0;
  explicit AlignedFloats(size_t n) : count(n) {
    size_t bytes = (n * sizeof(float) + 4095) / 4096 * 4096;
    data = static_cast<float*>(std::aligned_alloc(4096, bytes == 0 ? 4096 : bytes));
    if (data == nullptr) throw std::bad_alloc();
  }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  ~AlignedFloats() { std::free(data); }
};

struct Param {
  std::string name;
  size_t count = 0;
  int64_t step = 0;
  std::vector<float> exp_avg, exp_avg_sq;  // host offload only
};

k::AdamWConfig to_config(const strata_adamw_hparams& h) {
  k::AdamWConfig c;
  c.lr = h.lr;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.weight_decay = h.weight_decay;
  return c;
}

bool read_hparams(const strata_adamw_hparams* in, strata_adamw_hparams& out) {
  strata_adamw_hparams_init(&out);
  return strata::api::read_sized(in, out);
}

}  // namespace

struct strata_adamw {
  strata_adamw_config config{};
  std::string store_dir;
  std::unique_ptr<strata_store> store;  // nvme only
  std::vector<Param> params;
  std::map<std::string, uint32_t> by_name;
  // Two slots of (exp_avg, exp_avg_sq) chunks: nvme only, allocated at create.
  std::unique_ptr<AlignedFloats> slot_m[2], slot_v[2];

  std::string chunk_name(const Param& p, const char* which, size_t chunk) const {
    return p.name + "/" + which + "/" + std::to_string(chunk);
  }
  size_t chunk_count(const Param& p) const {
    return (p.count + config.chunk_elements - 1) / config.chunk_elements;
  }
};

namespace {

// Writes a chunk pair asynchronously; returns the two tickets.
strata_status put_chunk(strata_adamw* opt, const Param& p, size_t chunk, const float* m,
                        const float* v, size_t n, uint64_t tickets[2]) {
  int64_t shape[1] = {static_cast<int64_t>(n)};
  strata_status s = strata_store_put_async(opt->store.get(), opt->chunk_name(p, "exp_avg", chunk).c_str(),
                                           STRATA_F32, shape, 1, m, n * 4, &tickets[0]);
  if (s != STRATA_OK) return s;
  return strata_store_put_async(opt->store.get(), opt->chunk_name(p, "exp_avg_sq", chunk).c_str(),
                                STRATA_F32, shape, 1, v, n * 4, &tickets[1]);
}

strata_status get_chunk(strata_adamw* opt, const Param& p, size_t chunk, float* m, float* v,
                        size_t n, uint64_t tickets[2]) {
  strata_status s = strata_store_get_async(opt->store.get(), opt->chunk_name(p, "exp_avg", chunk).c_str(),
                                           m, n * 4, &tickets[0]);
  if (s != STRATA_OK) return s;
  return strata_store_get_async(opt->store.get(), opt->chunk_name(p, "exp_avg_sq", chunk).c_str(), v,
                                n * 4, &tickets[1]);
}

strata_status wait_pair(strata_adamw* opt, uint64_t tickets[2], bool& pending) {
  if (!pending) return STRATA_OK;
  pending = false;
  strata_status a = strata_store_wait(opt->store.get(), tickets[0]);
  strata_status b = strata_store_wait(opt->store.get(), tickets[1]);
  return a != STRATA_OK ? a : b;
}

}  // namespace

extern "C" {

void strata_adamw_hparams_init(strata_adamw_hparams* h) {
  if (h == nullptr) return;
  *h = strata_adamw_hparams{};
  h->struct_size = sizeof(*h);
  h->lr = 1e-3;
  h->beta1 = 0.9;
  h->beta2 = 0.999;
  h->eps = 1e-8;
  h->weight_decay = 1e-2;
  h->grad_scale = 1.0f;
}

strata_status strata_adamw_step_buffers(const strata_adamw_hparams* hparams, int64_t step,
                                        float* params, const void* grads, strata_dtype grads_dtype,
                                        float* exp_avg, float* exp_avg_sq, uint16_t* copy,
                                        strata_dtype copy_dtype, size_t count) {
  return guarded("strata_adamw_step_buffers", [&]() -> strata_status {
    if (count > 0 && (params == nullptr || grads == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr))
      return null_arg("strata_adamw_step_buffers", "params/grads/exp_avg/exp_avg_sq");
    strata_adamw_hparams h;
    if (!read_hparams(hparams, h))
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_step_buffers: hparams struct_size not set");
    if (step < 1) return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_step_buffers: step is 1-based");
    if (grads_dtype != STRATA_F32 && grads_dtype != STRATA_BF16)
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_step_buffers: grads must be fp32 or bf16");
    k::ComputeCopy compute_copy;
    if (copy != nullptr) {
      if (copy_dtype != STRATA_BF16 && copy_dtype != STRATA_F16)
        return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_step_buffers: copy must be bf16 or fp16");
      compute_copy.dtype = static_cast<strata::DType>(copy_dtype);
      compute_copy.bits = std::span<uint16_t>(copy, count);
    }
    auto scalars = k::adamw_step_scalars(to_config(h), step, h.grad_scale);
    if (grads_dtype == STRATA_F32)
      k::adamw_step(scalars, {params, count}, {static_cast<const float*>(grads), count},
                    {exp_avg, count}, {exp_avg_sq, count}, compute_copy);
    else
      k::adamw_step_bf16_grads(scalars, {params, count}, {static_cast<const uint16_t*>(grads), count},
                               {exp_avg, count}, {exp_avg_sq, count}, compute_copy);
    return STRATA_OK;
  });
}

void strata_adamw_config_init(strata_adamw_config* c) {
  if (c == nullptr) return;
  *c = strata_adamw_config{};
  c->struct_size = sizeof(*c);
  c->offload = STRATA_OFFLOAD_HOST;
  c->store_capacity_bytes = uint64_t{1} << 30;
  c->chunk_elements = size_t{1} << 22;
}

strata_status strata_adamw_create(const strata_adamw_config* config, strata_adamw** out) {
  return guarded("strata_adamw_create", [&]() -> strata_status {
    if (out == nullptr) return null_arg("strata_adamw_create", "out_opt");
    auto opt = std::make_unique<strata_adamw>();
    strata_adamw_config_init(&opt->config);
    if (!strata::api::read_sized(config, opt->config))
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_create: struct_size not set");
    auto& c = opt->config;
    if (c.offload != STRATA_OFFLOAD_HOST && c.offload != STRATA_OFFLOAD_NVME)
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_create: offload must be host or nvme");
    if (c.offload == STRATA_OFFLOAD_NVME) {
      if (c.store_dir == nullptr)
        return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_create: offload nvme needs store_dir");
      if (c.chunk_elements == 0) c.chunk_elements = size_t{1} << 22;
      if (c.store_capacity_bytes == 0) c.store_capacity_bytes = uint64_t{1} << 30;
      opt->store_dir = c.store_dir;
      c.store_dir = opt->store_dir.c_str();  // the caller's string need not outlive this call
      strata_store* store = nullptr;
      strata_status s = c.resume ? strata_store_open(c.store_dir, 0, &store)
                                 : strata_store_create(c.store_dir, c.store_capacity_bytes, &store);
      if (s != STRATA_OK) return s;
      opt->store.reset(store);
      for (int i = 0; i < 2; ++i) {
        opt->slot_m[i] = std::make_unique<AlignedFloats>(c.chunk_elements);
        opt->slot_v[i] = std::make_unique<AlignedFloats>(c.chunk_elements);
      }
    } else {
      c.store_dir = nullptr;
    }
    *out = opt.release();
    return STRATA_OK;
  });
}

void strata_adamw_destroy(strata_adamw* opt) {
  try {
    delete opt;
  } catch (...) {
  }
}

strata_status strata_adamw_add_param(strata_adamw* opt, const char* name, size_t count,
                                     uint32_t* out_param) {
  return guarded("strata_adamw_add_param", [&]() -> strata_status {
    if (opt == nullptr || name == nullptr || out_param == nullptr)
      return null_arg("strata_adamw_add_param", "opt/name/out_param");
    if (opt->by_name.count(name) != 0)
      return fail(STRATA_ERR_INVALID_ARGUMENT, std::string("parameter ") + name + " is registered twice");
    if (std::strchr(name, '/') != nullptr)
      return fail(STRATA_ERR_INVALID_ARGUMENT, std::string("parameter ") + name + ": '/' is reserved");
    Param p;
    p.name = name;
    p.count = count;
    if (opt->config.offload == STRATA_OFFLOAD_HOST) {
      p.exp_avg.assign(count, 0.0f);
      p.exp_avg_sq.assign(count, 0.0f);
    } else if (opt->config.resume) {
      const auto& metadata = opt->store->store().committed_metadata();
      auto it = metadata.find("adamw.step." + p.name);
      if (it != metadata.end()) p.step = std::stoll(it->second);
      if (p.step > 0) {
        auto record = opt->store->store().find(opt->chunk_name(p, "exp_avg", 0));
        size_t first = std::min<size_t>(count, opt->config.chunk_elements);
        if (!record || record->size_bytes != first * 4)
          return fail(STRATA_ERR_CORRUPT, "parameter " + p.name + ": the store " + opt->store_dir +
                                              " holds no state of " + std::to_string(count) +
                                              " elements for it");
      }
    }
    *out_param = static_cast<uint32_t>(opt->params.size());
    opt->by_name[p.name] = *out_param;
    opt->params.push_back(std::move(p));
    return STRATA_OK;
  });
}

strata_status strata_adamw_step(strata_adamw* opt, uint32_t param, const strata_adamw_hparams* hparams,
                                float* params, const float* grads) {
  return guarded("strata_adamw_step", [&]() -> strata_status {
    if (opt == nullptr || params == nullptr || grads == nullptr)
      return null_arg("strata_adamw_step", "opt/params/grads");
    if (param >= opt->params.size())
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_step: unknown parameter " + std::to_string(param));
    strata_adamw_hparams h;
    if (!read_hparams(hparams, h))
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_step: hparams struct_size not set");
    Param& p = opt->params[param];
    auto scalars = k::adamw_step_scalars(to_config(h), p.step + 1, h.grad_scale);
    if (opt->config.offload == STRATA_OFFLOAD_HOST) {
      k::adamw_step(scalars, {params, p.count}, {grads, p.count}, p.exp_avg, p.exp_avg_sq);
      ++p.step;
      return STRATA_OK;
    }
    // nvme: stream the moments chunk by chunk, reads ahead and writes behind.
    const size_t chunk_elements = opt->config.chunk_elements;
    const size_t chunks = opt->chunk_count(p);
    const bool fresh = p.step == 0;  // moments are zero: nothing to read
    uint64_t read_t[2][2] = {}, write_t[2][2] = {};
    bool read_pending[2] = {false, false}, write_pending[2] = {false, false};
    auto size_of = [&](size_t c) { return std::min(chunk_elements, p.count - c * chunk_elements); };
    auto start_read = [&](size_t c) -> strata_status {
      int slot = static_cast<int>(c % 2);
      if (auto s = wait_pair(opt, write_t[slot], write_pending[slot]); s != STRATA_OK) return s;
      if (fresh) {
        std::memset(opt->slot_m[slot]->data, 0, size_of(c) * 4);
        std::memset(opt->slot_v[slot]->data, 0, size_of(c) * 4);
        return STRATA_OK;
      }
      read_pending[slot] = true;
      return get_chunk(opt, p, c, opt->slot_m[slot]->data, opt->slot_v[slot]->data, size_of(c), read_t[slot]);
    };
    strata_status status = chunks > 0 ? start_read(0) : STRATA_OK;
    for (size_t c = 0; c < chunks && status == STRATA_OK; ++c) {
      int slot = static_cast<int>(c % 2);
      status = wait_pair(opt, read_t[slot], read_pending[slot]);
      if (status != STRATA_OK) break;
      if (c + 1 < chunks) status = start_read(c + 1);
      if (status != STRATA_OK) break;
      size_t n = size_of(c), base = c * chunk_elements;
      k::adamw_step(scalars, {params + base, n}, {grads + base, n}, {opt->slot_m[slot]->data, n},
                    {opt->slot_v[slot]->data, n});
      write_pending[slot] = true;
      status = put_chunk(opt, p, c, opt->slot_m[slot]->data, opt->slot_v[slot]->data, n, write_t[slot]);
    }
    // Whatever happened, nothing may stay in flight on the slots.
    for (int slot = 0; slot < 2; ++slot) {
      strata_status r = wait_pair(opt, read_t[slot], read_pending[slot]);
      strata_status w = wait_pair(opt, write_t[slot], write_pending[slot]);
      if (status == STRATA_OK) status = r != STRATA_OK ? r : w;
    }
    if (status == STRATA_OK) ++p.step;
    return status;
  });
}

strata_status strata_adamw_get_state(strata_adamw* opt, uint32_t param, int64_t* out_step,
                                     float* exp_avg, float* exp_avg_sq) {
  return guarded("strata_adamw_get_state", [&]() -> strata_status {
    if (opt == nullptr) return null_arg("strata_adamw_get_state", "opt");
    if (param >= opt->params.size())
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_get_state: unknown parameter " + std::to_string(param));
    const Param& p = opt->params[param];
    if (out_step) *out_step = p.step;
    if (opt->config.offload == STRATA_OFFLOAD_HOST) {
      if (exp_avg) std::memcpy(exp_avg, p.exp_avg.data(), p.count * 4);
      if (exp_avg_sq) std::memcpy(exp_avg_sq, p.exp_avg_sq.data(), p.count * 4);
      return STRATA_OK;
    }
    const size_t ce = opt->config.chunk_elements;
    for (size_t c = 0; c < opt->chunk_count(p); ++c) {
      size_t n = std::min(ce, p.count - c * ce);
      if (p.step == 0) {
        if (exp_avg) std::memset(exp_avg + c * ce, 0, n * 4);
        if (exp_avg_sq) std::memset(exp_avg_sq + c * ce, 0, n * 4);
        continue;
      }
      if (exp_avg) {
        auto s = strata_store_get(opt->store.get(), opt->chunk_name(p, "exp_avg", c).c_str(), exp_avg + c * ce, n * 4);
        if (s != STRATA_OK) return s;
      }
      if (exp_avg_sq) {
        auto s = strata_store_get(opt->store.get(), opt->chunk_name(p, "exp_avg_sq", c).c_str(), exp_avg_sq + c * ce, n * 4);
        if (s != STRATA_OK) return s;
      }
    }
    return STRATA_OK;
  });
}

strata_status strata_adamw_set_state(strata_adamw* opt, uint32_t param, int64_t step,
                                     const float* exp_avg, const float* exp_avg_sq) {
  return guarded("strata_adamw_set_state", [&]() -> strata_status {
    if (opt == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr)
      return null_arg("strata_adamw_set_state", "opt/exp_avg/exp_avg_sq");
    if (param >= opt->params.size())
      return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_set_state: unknown parameter " + std::to_string(param));
    if (step < 0) return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_set_state: negative step");
    Param& p = opt->params[param];
    if (opt->config.offload == STRATA_OFFLOAD_HOST) {
      std::memcpy(p.exp_avg.data(), exp_avg, p.count * 4);
      std::memcpy(p.exp_avg_sq.data(), exp_avg_sq, p.count * 4);
      p.step = step;
      return STRATA_OK;
    }
    const size_t ce = opt->config.chunk_elements;
    for (size_t c = 0; c < opt->chunk_count(p); ++c) {
      size_t n = std::min(ce, p.count - c * ce);
      int64_t shape[1] = {static_cast<int64_t>(n)};
      auto s = strata_store_put(opt->store.get(), opt->chunk_name(p, "exp_avg", c).c_str(), STRATA_F32,
                                shape, 1, exp_avg + c * ce, n * 4);
      if (s == STRATA_OK)
        s = strata_store_put(opt->store.get(), opt->chunk_name(p, "exp_avg_sq", c).c_str(), STRATA_F32,
                             shape, 1, exp_avg_sq + c * ce, n * 4);
      if (s != STRATA_OK) return s;
    }
    p.step = step;
    return STRATA_OK;
  });
}

strata_status strata_adamw_commit(strata_adamw* opt) {
  return guarded("strata_adamw_commit", [&]() -> strata_status {
    if (opt == nullptr) return null_arg("strata_adamw_commit", "opt");
    if (!opt->store)
      return fail(STRATA_ERR_UNSUPPORTED, "strata_adamw_commit: a host-offload optimizer has no store");
    std::map<std::string, std::string> metadata = opt->store->store().committed_metadata();
    int64_t max_step = 0;
    for (const auto& p : opt->params) {
      metadata["adamw.step." + p.name] = std::to_string(p.step);
      max_step = std::max(max_step, p.step);
    }
    return check(opt->store->store().commit(static_cast<uint64_t>(max_step), metadata));
  });
}

strata_store* strata_adamw_store(strata_adamw* opt) {
  return opt == nullptr ? nullptr : opt->store.get();
}

}  // extern "C"
