// strata/api/optim_api.cpp — layer 4 of the C API: CPU AdamW over caller buffers, and an AdamW
// that owns the moments of registered parameters in host memory or in a store.
//
// The state is optim::StateLayout's (the optimizer seam), for 32-bit and 8-bit alike: the bytes
// after the master weights (the caller's params are the master) — [m | v] for adamw; absmax,
// codes and padding, or fp32 m and v for a parameter under min_8bit_size, for adamw8bit. Every
// step, state_dict read and write goes through the layout; this file only names the store
// tensors and streams them. NVMe state is streamed in chunks of at most `chunk_elements`, cut
// where the layout allows (snap_cut: 8-bit block boundaries): with 8-bit state each chunk is one
// store tensor "<name>/adamw8bit/<chunk>"; with 32-bit state the chunk's two halves keep
// PyTorch's names, "<name>/exp_avg/<chunk>" and "<name>/exp_avg_sq/<chunk>" (as stores written
// before the seam hold them, so they resume unchanged).
// A step reads chunk i+1 while chunk i is computed, and chunk i's write-back runs while
// chunk i+1 is computed (two buffer slots), so host memory holds four chunks whatever the
// model size. Step counters travel in the commit's metadata ("adamw.step.<name>"), and so does
// the layout (StateLayout::record), which a resume must match.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "api/api_internal.h"
#include "kernels/optim/adamw.h"
#include "kernels/optim/adamw8bit.h"
#include "optim/state.h"

using strata::api::check;
using strata::api::fail;
using strata::api::guarded;
namespace k = strata::kernels;
namespace optim = strata::optim;

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
  std::vector<std::byte> state;  // host offload: the layout's state of the whole parameter as one chunk
  // The parameter as the layout sees it: one tensor, decayed (the C API applies the caller's
  // weight_decay to every parameter; a caller that wants none passes 0).
  optim::TensorSpan span{};
  // nvme: chunk c is elements [cuts[c], cuts[c + 1]).
  std::vector<uint64_t> cuts;
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
  // adamw (state_bits 32) or adamw8bit with the config's rules: the one authority on what the
  // state is (optim/state.h).
  optim::StateLayout layout;
  // Two slots, nvme only, allocated at create: each holds one chunk's state.
  std::unique_ptr<AlignedFloats> slot[2];
  std::vector<k::AdamWChunk> pieces;  // a chunk's kernel calls, reused

  bool eight_bit() const { return layout.kind() == optim::Kind::adamw8bit; }
  std::string chunk_name(const Param& p, const char* which, size_t chunk) const {
    return p.name + "/" + which + "/" + std::to_string(chunk);
  }
  size_t chunk_count(const Param& p) const { return p.cuts.size() - 1; }
  uint64_t chunk_begin(const Param& p, size_t chunk) const { return p.cuts[chunk]; }
  uint64_t chunk_size(const Param& p, size_t chunk) const { return p.cuts[chunk + 1] - p.cuts[chunk]; }
  uint64_t state_bytes(const Param& p, size_t chunk) const {
    return layout.state_bytes({&p.span, 1}, chunk_begin(p, chunk), chunk_size(p, chunk));
  }
};

namespace {

// The store tensors a chunk's state is kept as: a byte range of the layout's state each. 8-bit
// state is one blob; 32-bit state is [m | v], its halves under PyTorch's names.
struct StatePart {
  const char* which;
  uint64_t offset_bytes;
  uint64_t size_bytes;
};
struct StateParts {
  StatePart part[2];
  int count;
};
StateParts state_parts(const strata_adamw* opt, const Param& p, size_t chunk) {
  if (opt->eight_bit()) return {{{"adamw8bit", 0, opt->state_bytes(p, chunk)}, {}}, 1};
  const uint64_t half = opt->state_bytes(p, chunk) / 2;
  return {{{"exp_avg", 0, half}, {"exp_avg_sq", half, half}}, 2};
}

std::byte* slot_bytes(strata_adamw* opt, int slot) { return reinterpret_cast<std::byte*>(opt->slot[slot]->data); }

// The store requests of one chunk in flight (one per state part). Only requests that were
// started are counted (a failed start leaves nothing to wait for).
struct Tickets {
  uint64_t id[2] = {};
  int count = 0;
};

// Starts the write of chunk `chunk` of `p`'s state from `state`.
strata_status put_chunk(strata_adamw* opt, const Param& p, size_t chunk, const std::byte* state, Tickets& tickets) {
  const StateParts parts = state_parts(opt, p, chunk);
  for (int i = 0; i < parts.count; ++i) {
    const StatePart& part = parts.part[i];
    int64_t shape[1] = {static_cast<int64_t>(part.size_bytes / 4)};
    strata_status s =
        strata_store_put_async(opt->store.get(), opt->chunk_name(p, part.which, chunk).c_str(), STRATA_F32, shape, 1,
                               state + part.offset_bytes, part.size_bytes, &tickets.id[tickets.count]);
    if (s != STRATA_OK) return s;
    ++tickets.count;
  }
  return STRATA_OK;
}

// Starts the read of chunk `chunk` of `p`'s state into `state`.
strata_status get_chunk(strata_adamw* opt, const Param& p, size_t chunk, std::byte* state, Tickets& tickets) {
  const StateParts parts = state_parts(opt, p, chunk);
  for (int i = 0; i < parts.count; ++i) {
    const StatePart& part = parts.part[i];
    strata_status s = strata_store_get_async(opt->store.get(), opt->chunk_name(p, part.which, chunk).c_str(),
                                             state + part.offset_bytes, part.size_bytes, &tickets.id[tickets.count]);
    if (s != STRATA_OK) return s;
    ++tickets.count;
  }
  return STRATA_OK;
}

// Waits for every request of `tickets`; the first failure.
strata_status wait_all(strata_adamw* opt, Tickets& tickets) {
  strata_status first = STRATA_OK;
  for (int i = 0; i < tickets.count; ++i) {
    strata_status s = strata_store_wait(opt->store.get(), tickets.id[i]);
    if (first == STRATA_OK) first = s;
  }
  tickets.count = 0;
  return first;
}

// One step of the chunk of `p` whose state is at `state` and whose elements are
// [begin, begin + count): the layout cuts it into kernel calls, run here on the CPU.
void step_chunk(strata_adamw* opt, const Param& p, const strata_adamw_hparams& h, uint64_t begin,
                    uint64_t count, float* params, const float* grads, std::byte* state) {
  opt->layout.update_pieces(to_config(h), static_cast<uint64_t>(p.step), {&p.span, 1}, begin, count,
                            params + begin, state, grads + begin, nullptr, opt->pieces);
  for (const k::AdamWChunk& piece : opt->pieces) {
    k::AdamWStepScalars scalars = piece.scalars;
    scalars.grad_scale = h.grad_scale;  // the layout's scalars are unscaled
    if (piece.block_elements > 0) {
      const size_t blocks = k::adamw8bit_block_count(piece.count, piece.block_elements);
      const k::AdamW8bitState views{{piece.params, piece.count},
                                    {piece.exp_avg_codes, piece.count},
                                    {piece.exp_avg_sq_codes, piece.count},
                                    {piece.exp_avg_absmax, blocks},
                                    {piece.exp_avg_sq_absmax, blocks},
                                    piece.block_elements};
      k::adamw8bit_step(scalars, views, {piece.grads, piece.count});
    } else {
      k::adamw_step(scalars, {piece.params, piece.count}, {piece.grads, piece.count},
                    {piece.exp_avg, piece.count}, {piece.exp_avg_sq, piece.count});
    }
  }
}

// set_state with 8-bit moments: they are requantised, which needs finite values.
strata_status check_finite(const Param& p, const float* values, const char* which) {
  for (size_t i = 0; i < p.count; ++i) {
    if (!std::isfinite(values[i]))
      return fail(STRATA_ERR_INVALID_ARGUMENT,
                  fmt::format("strata_adamw_set_state: parameter {}: {}[{}] is {}; 8-bit state holds finite "
                              "moments only",
                              p.name, which, i, values[i]));
  }
  return STRATA_OK;
}

// The layout a store's commit holds state of, if it holds any: a store written before
// state_bits existed records no layout and holds adamw state (its "adamw.step." keys).
bool holds_state(const std::map<std::string, std::string>& metadata) {
  if (metadata.count("optim_state") != 0) return true;
  auto it = metadata.lower_bound("adamw.step.");
  return it != metadata.end() && it->first.rfind("adamw.step.", 0) == 0;
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
  c->state_bits = 32;
  c->block_size = static_cast<uint32_t>(k::kAdamW8bitBlockElements);
  c->min_8bit_size = k::kAdamW8bitMinElements;
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
    // bitsandbytes' knobs, checked whatever state_bits is: a bad value is a mistake either way.
    if (c.state_bits != 32 && c.state_bits != 8)
      return fail(STRATA_ERR_INVALID_ARGUMENT,
                  fmt::format("strata_adamw_create: state_bits is {}; it must be 32 or 8", c.state_bits));
    if (c.block_size < 64 || c.block_size > k::kAdamW8bitMaxBlockElements || (c.block_size & (c.block_size - 1)) != 0)
      return fail(STRATA_ERR_INVALID_ARGUMENT,
                  fmt::format("strata_adamw_create: block_size is {}; it must be a power of two in [64, {}] "
                              "(bitsandbytes uses 256)",
                              c.block_size, k::kAdamW8bitMaxBlockElements));
    if (c.state_bits == 8) {
      optim::EightBitRules rules;
      rules.block_elements = c.block_size;
      rules.min_8bit_elements = c.min_8bit_size;
      opt->layout = optim::StateLayout(optim::Kind::adamw8bit, rules);
    }
    if (c.offload == STRATA_OFFLOAD_NVME) {
      if (c.store_dir == nullptr)
        return fail(STRATA_ERR_INVALID_ARGUMENT, "strata_adamw_create: offload nvme needs store_dir");
      if (c.chunk_elements == 0) c.chunk_elements = size_t{1} << 22;
      if (c.store_capacity_bytes == 0) c.store_capacity_bytes = uint64_t{1} << 30;
      // A chunk cut inside an 8-bit parameter falls on one of its block boundaries.
      if (opt->eight_bit() && c.chunk_elements < c.block_size)
        return fail(STRATA_ERR_INVALID_ARGUMENT,
                    fmt::format("strata_adamw_create: chunk_elements is {}, smaller than block_size {}: an 8-bit "
                                "chunk holds whole blocks",
                                c.chunk_elements, c.block_size));
      opt->store_dir = c.store_dir;
      c.store_dir = opt->store_dir.c_str();  // the caller's string need not outlive this call
      strata_store* store = nullptr;
      strata_status s = c.resume ? strata_store_open(c.store_dir, 0, &store)
                                 : strata_store_create(c.store_dir, c.store_capacity_bytes, &store);
      if (s != STRATA_OK) return s;
      opt->store.reset(store);
      if (c.resume) {
        // Never reinterpret another layout's bytes: 32-bit state resumed as 8-bit (or 8-bit
        // with other rules) is refused, not converted.
        const auto& metadata = opt->store->store().committed_metadata();
        if (holds_state(metadata)) {
          auto stored = optim::StateLayout::from_metadata(metadata, opt->store_dir);
          if (!stored) return fail(stored.error());
          if (!(*stored == opt->layout))
            return fail(STRATA_ERR_INVALID_ARGUMENT,
                        fmt::format("strata_adamw_create: the store {} holds {} state; this optimizer is {} "
                                    "(state_bits, block_size, min_8bit_size must match the run being resumed)",
                                    opt->store_dir, stored->describe(), opt->layout.describe()));
        }
      }
      // A chunk's state is largest when it is all 8-bit or all fp32 (the layout's bytes grow
      // with the element count either way): size the slots for the larger of the two that the
      // layout can hold (adamw: always fp32).
      const optim::TensorSpan whole{0, c.chunk_elements, true, false};
      uint64_t slot_bytes = optim::StateLayout(optim::Kind::adamw).state_bytes({&whole, 1}, 0, c.chunk_elements);
      if (opt->eight_bit()) {
        optim::EightBitRules all_eight = opt->layout.rules();
        all_eight.min_8bit_elements = 0;
        slot_bytes = std::max(slot_bytes, optim::StateLayout(optim::Kind::adamw8bit, all_eight)
                                              .state_bytes({&whole, 1}, 0, c.chunk_elements));
      }
      for (int i = 0; i < 2; ++i) opt->slot[i] = std::make_unique<AlignedFloats>(slot_bytes / sizeof(float));
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
    p.span = optim::TensorSpan{0, count, true, false};
    if (opt->config.offload == STRATA_OFFLOAD_HOST) {
      p.state.resize(opt->layout.state_bytes({&p.span, 1}, 0, count));
      opt->layout.initialize_state({&p.span, 1}, 0, count, p.state.data());
    } else {
      // Chunks of chunk_elements, each cut where the layout allows (inside an 8-bit
      // parameter: a block boundary, at most a block short).
      p.cuts.push_back(0);
      while (p.cuts.back() < count) {
        const uint64_t next = p.cuts.back() + opt->config.chunk_elements;
        p.cuts.push_back(next >= count ? count : opt->layout.snap_cut({&p.span, 1}, next));
      }
    }
    if (opt->config.offload == STRATA_OFFLOAD_NVME && opt->config.resume) {
      const auto& metadata = opt->store->store().committed_metadata();
      auto it = metadata.find("adamw.step." + p.name);
      if (it != metadata.end()) p.step = std::stoll(it->second);
      if (p.step > 0 && count > 0) {
        const StatePart first = state_parts(opt, p, 0).part[0];
        auto record = opt->store->store().find(opt->chunk_name(p, first.which, 0));
        if (!record || record->size_bytes != first.size_bytes)
          return fail(STRATA_ERR_CORRUPT, "parameter " + p.name + ": the store " + opt->store_dir +
                                              " holds no state of " + std::to_string(count) +
                                              " elements for it (or other chunk_elements)");
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
    if (opt->config.offload == STRATA_OFFLOAD_HOST) {
      step_chunk(opt, p, h, 0, p.count, params, grads, p.state.data());
      ++p.step;
      return STRATA_OK;
    }
    // nvme: stream the state chunk by chunk, reads ahead and writes behind.
    const size_t chunks = opt->chunk_count(p);
    const bool fresh = p.step == 0;  // moments are zero: nothing to read
    Tickets read_t[2], write_t[2];
    auto start_read = [&](size_t c) -> strata_status {
      int slot = static_cast<int>(c % 2);
      if (auto s = wait_all(opt, write_t[slot]); s != STRATA_OK) return s;
      if (fresh) {
        opt->layout.initialize_state({&p.span, 1}, opt->chunk_begin(p, c), opt->chunk_size(p, c),
                                     slot_bytes(opt, slot));
        return STRATA_OK;
      }
      return get_chunk(opt, p, c, slot_bytes(opt, slot), read_t[slot]);
    };
    strata_status status = chunks > 0 ? start_read(0) : STRATA_OK;
    for (size_t c = 0; c < chunks && status == STRATA_OK; ++c) {
      int slot = static_cast<int>(c % 2);
      status = wait_all(opt, read_t[slot]);
      if (status != STRATA_OK) break;
      if (c + 1 < chunks) status = start_read(c + 1);
      if (status != STRATA_OK) break;
      step_chunk(opt, p, h, opt->chunk_begin(p, c), opt->chunk_size(p, c), params, grads, slot_bytes(opt, slot));
      status = put_chunk(opt, p, c, slot_bytes(opt, slot), write_t[slot]);
    }
    // Whatever happened, nothing may stay in flight on the slots.
    for (int slot = 0; slot < 2; ++slot) {
      strata_status r = wait_all(opt, read_t[slot]);
      strata_status w = wait_all(opt, write_t[slot]);
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
    if (exp_avg == nullptr && exp_avg_sq == nullptr) return STRATA_OK;
    // Both moments at once, through the layout (8-bit ones dequantised): a NULL one is read
    // into scratch (a state_dict path, not a step, so it may allocate).
    std::vector<float> scratch(exp_avg == nullptr || exp_avg_sq == nullptr ? p.count : 0);
    float* m = exp_avg != nullptr ? exp_avg : scratch.data();
    float* v = exp_avg_sq != nullptr ? exp_avg_sq : scratch.data();
    if (opt->config.offload == STRATA_OFFLOAD_HOST) {
      opt->layout.read_moments({&p.span, 1}, 0, p.count, p.state.data(), m, v);
      return STRATA_OK;
    }
    for (size_t c = 0; c < opt->chunk_count(p); ++c) {
      const uint64_t base = opt->chunk_begin(p, c), n = opt->chunk_size(p, c);
      std::byte* state = slot_bytes(opt, 0);
      if (p.step == 0) {
        opt->layout.initialize_state({&p.span, 1}, base, n, state);
      } else {
        Tickets tickets;
        strata_status s = get_chunk(opt, p, c, state, tickets);
        const strata_status w = wait_all(opt, tickets);
        if (s == STRATA_OK) s = w;
        if (s != STRATA_OK) return s;
      }
      opt->layout.read_moments({&p.span, 1}, base, n, state, m + base, v + base);
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
    if (opt->layout.eight_bit(p.span)) {
      if (auto s = check_finite(p, exp_avg, "exp_avg"); s != STRATA_OK) return s;
      if (auto s = check_finite(p, exp_avg_sq, "exp_avg_sq"); s != STRATA_OK) return s;
    }
    if (opt->config.offload == STRATA_OFFLOAD_HOST) {
      opt->layout.write_moments({&p.span, 1}, 0, p.count, exp_avg, exp_avg_sq, p.state.data());
      p.step = step;
      return STRATA_OK;
    }
    for (size_t c = 0; c < opt->chunk_count(p); ++c) {
      const uint64_t base = opt->chunk_begin(p, c), n = opt->chunk_size(p, c);
      std::byte* state = slot_bytes(opt, 0);
      opt->layout.write_moments({&p.span, 1}, base, n, exp_avg + base, exp_avg_sq + base, state);
      Tickets tickets;
      strata_status s = put_chunk(opt, p, c, state, tickets);
      const strata_status w = wait_all(opt, tickets);
      if (s == STRATA_OK) s = w;
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
    opt->layout.record(metadata);  // what a resume must match
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
