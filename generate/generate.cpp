#include "generate/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <sys/statvfs.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/pages.h"
#include "common/size.h"
#include "models/hf/hf.h"
#include "models/lora_fold.h"
#include "models/model_layout.h"
#include "run/train_plan.h"
#include "run/budgets.h"
#include "run/run_store.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "kernels/optim/cast.h"
#include "kernels/quant/quant.h"
#include "device/device.h"
#include "memory/host_arena.h"
#include "memory/store.h"
#include "scheduler/scheduler.h"
#include "strata_build_config.h"

namespace strata {

namespace {

namespace sch = scheduler;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Peak resident set of this process (VmHWM), in bytes.
uint64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

// Whole DeviceBuffers round up to the device's alignment; the scratch is a handful of them.
uint64_t device_bytes(uint64_t size_bytes) { return align_up(std::max<uint64_t>(size_bytes, 1), device::kDeviceAlignmentBytes); }

// LoRA (an adapter store, docs/lora.md): the adapters are folded into the base at load — each
// block's weights, as the read of them from the store completes, become W + scale·B·A by the
// same fold as the merged export (models/lora_fold.h), so a pass computes on merged weights with
// the base's ops and gives the merged export's tokens by construction. The fold runs on the
// scheduler's I/O thread inside wait(), before the scheduler marks the block resident: every
// copy of a block the passes see is folded, once per read (a block that stays in the pool is
// folded once; one that streams, once per pass). The base as stored:
// - fp32: folded in place.
// - bf16: widened a linear at a time into `widen_` (the largest adapted linear's elements),
//   folded and rounded back to nearest even — what staging the merged export in bf16 does to the
//   same fp32 values.
// - int8 / nf4 (a block's quant layout is set): the store's quantised block is read into the
//   front of the block's buffer (the plan sizes it for the larger of the quantised and the bf16
//   bytes; `store_specs_` holds the store's own sizes, which the reads use), dequantised whole into
//   `widen_` (the largest block's fp32 elements; kernels/quant, the merged export's dequantiser),
//   folded, and rounded to bf16 over the buffer — the merged export staged in bf16, bit for bit.
//   The passes then run the bf16 decode ops, the precision QLoRA computes in.
class AdapterFoldingBacking final : public sch::NvmeBacking {
 public:
  AdapterFoldingBacking(std::unique_ptr<sch::NvmeBacking> inner, std::vector<sch::PlanTensor> store_specs,
                        const ModelLayout& adapter_layout, const AdapterConfig& adapter,
                        std::vector<int64_t> block_of_tensor, std::vector<float> adapter_weights,
                        std::vector<uint64_t> adapter_offsets, bool bf16)
      : inner_(std::move(inner)), store_specs_(std::move(store_specs)), adapter_(adapter),
        block_of_tensor_(std::move(block_of_tensor)), adapter_weights_(std::move(adapter_weights)),
        adapter_offsets_(std::move(adapter_offsets)), bf16_(bf16), pending_(block_of_tensor_.size()) {
    linears_ = models::adapted_linears(adapter_layout, 0);  // every block's are at the same offsets
    quantized_.resize(static_cast<size_t>(adapter_layout.n_layer()));
    for (int64_t block = 0; block < adapter_layout.n_layer(); ++block)
      if (const kernels::quant::UnitLayout* quantized = adapter_layout.quant_layout(adapter_layout.block_unit(block)))
        quantized_[static_cast<size_t>(block)] = *quantized;
    widen_.resize(buffer_bytes(adapter_layout, bf16_) / 4);  // allocated here, once: never per read
  }

  // Host bytes the fold holds beside the pool (its widening buffer), for the budget.
  static uint64_t buffer_bytes(const ModelLayout& adapter_layout, bool bf16) {
    if (!bf16) return 0;
    uint64_t largest = 0;
    for (const models::AdaptedLinear& entry : models::adapted_linears(adapter_layout, 0))
      largest = std::max<uint64_t>(largest, uint64_t(entry.linear.in_features) * uint64_t(entry.linear.out_features));
    for (int64_t block = 0; block < adapter_layout.n_layer(); ++block)
      if (const kernels::quant::UnitLayout* quantized = adapter_layout.quant_layout(adapter_layout.block_unit(block)))
        largest = std::max(largest, quantized->element_count);
    return largest * 4;
  }

  Result<uint64_t> submit_read(sch::TensorId tensor, const sch::PlanTensor& spec, void* host_dst) override {
    (void)spec;  // the plan's size may exceed the store's (a quantised block): read what is stored
    STRATA_ASSIGN_OR_RETURN(const uint64_t ticket, inner_->submit_read(tensor, store_specs_[tensor], host_dst));
    if (block_of_tensor_[tensor] >= 0) pending_[tensor] = Pending{ticket, host_dst, true};
    return ticket;
  }
  Result<uint64_t> submit_write(sch::TensorId tensor, const sch::PlanTensor& spec, const void* host_src) override {
    return inner_->submit_write(tensor, spec, host_src);
  }
  bool wait_some(uint64_t ticket) override { return inner_->wait_some(ticket); }
  Status wait(uint64_t ticket) override {
    STRATA_RETURN_IF_ERROR(inner_->wait(ticket));
    // A handful of tensors (L + 2), at most one read of each in flight: a scan finds the block.
    for (size_t t = 0; t < pending_.size(); ++t) {
      Pending& pending = pending_[t];
      if (!pending.active || pending.ticket != ticket) continue;
      pending.active = false;
      fold(block_of_tensor_[t], pending.host_dst);
      break;
    }
    return Status();
  }
  Status register_host(memory::HostArena& arena) override { return inner_->register_host(arena); }

 private:
  struct Pending {
    uint64_t ticket = 0;
    void* host_dst = nullptr;
    bool active = false;
  };

  void fold(int64_t block, void* weights) {
    const float* adapter = adapter_weights_.data() + adapter_offsets_[static_cast<size_t>(block)];
    if (const std::optional<kernels::quant::UnitLayout>& quantized = quantized_[static_cast<size_t>(block)]) {
      const uint64_t n = quantized->element_count;
      kernels::quant::dequantize_unit(*quantized, static_cast<const std::byte*>(weights), widen_.data());
      for (const models::AdaptedLinear& entry : linears_)
        models::fold_lora(entry.linear, adapter_.rank, adapter_.scale(), adapter + entry.a_offset_elements,
                          adapter + entry.b_offset_elements, widen_.data() + entry.weight_offset_elements);
      // The quantised bytes were all read above: the bf16 block may overwrite them.
      kernels::cast_fp32_to_bf16(std::span<const float>(widen_.data(), n),
                                 std::span<uint16_t>(static_cast<uint16_t*>(weights), n));
      return;
    }
    for (const models::AdaptedLinear& entry : linears_) {
      const float* a = adapter + entry.a_offset_elements;
      const float* b = adapter + entry.b_offset_elements;
      if (!bf16_) {
        models::fold_lora(entry.linear, adapter_.rank, adapter_.scale(), a, b,
                          static_cast<float*>(weights) + entry.weight_offset_elements);
        continue;
      }
      const uint64_t n = uint64_t(entry.linear.in_features) * uint64_t(entry.linear.out_features);
      uint16_t* bits = static_cast<uint16_t*>(weights) + entry.weight_offset_elements;
      kernels::cast_bf16_to_fp32(std::span<const uint16_t>(bits, n), std::span<float>(widen_.data(), n));
      models::fold_lora(entry.linear, adapter_.rank, adapter_.scale(), a, b, widen_.data());
      kernels::cast_fp32_to_bf16(std::span<const float>(widen_.data(), n), std::span<uint16_t>(bits, n));
    }
  }

  std::unique_ptr<sch::NvmeBacking> inner_;
  std::vector<sch::PlanTensor> store_specs_;  // per plan tensor: its name and size as the store holds it
  AdapterConfig adapter_;
  std::vector<int64_t> block_of_tensor_;  // per plan tensor: its block, or -1
  std::vector<float> adapter_weights_;    // every adapter unit's fp32 master, back to back
  std::vector<uint64_t> adapter_offsets_; // per block: where its adapter unit starts in adapter_weights_
  bool bf16_ = false;
  std::vector<Pending> pending_;          // per plan tensor
  std::vector<models::AdaptedLinear> linears_;
  std::vector<std::optional<kernels::quant::UnitLayout>> quantized_;  // per block; int8 / nf4 bases only
  std::vector<float> widen_;  // bf16: one adapted linear widened; int8 / nf4: one block dequantised
};

// The adapters of an adapter store (their fp32 masters, every adapter unit back to back) and
// where each block's starts, read through a read-only handle of their own: the generation
// store's engine belongs to the scheduler's I/O thread (scheduler.h).
struct StoreAdapters {
  std::vector<float> weights;
  std::vector<uint64_t> offsets;  // per block
};
Result<StoreAdapters> read_store_adapters(const std::string& dir, const ModelLayout& layout) {
  STRATA_ASSIGN_OR_RETURN(std::vector<memory::Store> stores, open_store_set({dir}));
  const StoreMetadata& metadata = stores.front().committed_metadata();
  STRATA_ASSIGN_OR_RETURN(const uint64_t chunk_elements, optim_chunk_elements_of(metadata, dir));
  STRATA_ASSIGN_OR_RETURN(const optim::StateLayout state, optim_state_of(metadata, dir));
  StoreAdapters out;
  uint64_t total = 0;
  for (int64_t block = 0; block < layout.n_layer(); ++block) {
    out.offsets.push_back(total);
    total += layout.units()[layout.adapter_unit(block)].element_count;
  }
  out.weights.resize(total);
  std::vector<std::byte> staging;
  for (int64_t block = 0; block < layout.n_layer(); ++block)
    STRATA_RETURN_IF_ERROR(read_master(stores, state, layout.units()[layout.adapter_unit(block)], chunk_elements,
                                       out.weights.data() + out.offsets[size_t(block)], staging));
  return out;
}

// The embedding rows a pass needs, read from the store extent by extent, for a model whose
// head does not reuse the table (an untied Llama): decoding one token then reads one extent
// (≤ the store's max_extent_bytes) instead of the whole [vocab, C] table, which would otherwise
// stream through the pool every token (49 MB of a 125M Llama's 249 MB). A checksum covers a
// whole extent, so whole extents are read and verified (memory/store.h). The reads go through a
// second read-only handle on the same store, owned by the compute thread: the scheduler's I/O
// thread owns the first one (scheduler.h), and a read-only store writes nothing.
class EmbeddingRows {
 public:
  static Result<EmbeddingRows> open(const std::string& dir, memory::StoreOptions options, const std::string& tensor,
                                    uint64_t row_bytes) {
    options.read_only = true;
    EmbeddingRows rows;
    STRATA_ASSIGN_OR_RETURN(memory::Store store, memory::Store::open(dir, options));
    rows.store_ = std::make_unique<memory::Store>(std::move(store));
    std::optional<memory::TensorRecord> record = rows.store_->find(tensor);
    if (!record.has_value()) return make_error(ErrorKind::corrupt, fmt::format("store {}: no tensor '{}'", dir, tensor));
    uint64_t start = 0;
    for (const memory::Extent& extent : record->extents) {
      rows.extent_starts_.push_back(start);
      start += extent.length_bytes;
    }
    rows.extent_starts_.push_back(start);
    rows.tensor_ = tensor;
    rows.row_bytes_ = row_bytes;
    STRATA_ASSIGN_OR_RETURN(rows.bounce_, PageMapping::map(buffer_bytes(*rows.store_, tensor), PageMappingOptions{},
                                                           "embedding rows buffer"));
    return rows;
  }
  // Bytes of host memory this reader holds (its largest extent, in whole huge pages as
  // PageMapping maps it): generation counts them in its budget.
  static uint64_t buffer_bytes(const memory::Store& store, const std::string& tensor) {
    uint64_t largest = 0;
    if (std::optional<memory::TensorRecord> record = store.find(tensor))
      for (const memory::Extent& extent : record->extents) largest = std::max(largest, extent.length_bytes);
    return align_up(std::max<uint64_t>(largest, 4096), kHugePageBytes);
  }
  // Row tokens[r] of the table into out + r · row_bytes, for r < rows; each extent read once.
  Status gather(const int32_t* tokens, int64_t rows, std::byte* out) {
    order_.clear();
    for (int64_t r = 0; r < rows; ++r) order_.emplace_back(uint64_t(tokens[r]) * row_bytes_, r);
    std::sort(order_.begin(), order_.end());
    for (const auto& [offset, r] : order_) {
      uint64_t done = 0;  // a row may straddle two extents
      while (done < row_bytes_) {
        const uint64_t at = offset + done;
        const size_t e = size_t(std::upper_bound(extent_starts_.begin(), extent_starts_.end(), at) -
                                extent_starts_.begin()) - 1;
        if (e + 1 >= extent_starts_.size())
          return make_error(ErrorKind::corrupt, fmt::format("tensor '{}' is shorter than its row {}", tensor_, at / row_bytes_));
        if (e != loaded_extent_) {
          loaded_extent_ = SIZE_MAX;
          STRATA_ASSIGN_OR_RETURN(memory::StoreTicket ticket,
                                  store_->read_extent_async(tensor_, e, bounce_.data(), bounce_.size_bytes()));
          STRATA_RETURN_IF_ERROR(store_->wait(ticket));
          loaded_extent_ = e;
          read_bytes_ += extent_starts_[e + 1] - extent_starts_[e];
        }
        const uint64_t take = std::min(row_bytes_ - done, extent_starts_[e + 1] - at);
        std::memcpy(out + uint64_t(r) * row_bytes_ + done, bounce_.data() + (at - extent_starts_[e]), take);
        done += take;
      }
    }
    return Status();
  }
  uint64_t read_bytes() const { return read_bytes_; }

 private:
  std::unique_ptr<memory::Store> store_;
  std::string tensor_;
  uint64_t row_bytes_ = 0;
  std::vector<uint64_t> extent_starts_;  // each extent's first byte in the tensor, then its size
  PageMapping bounce_;
  size_t loaded_extent_ = SIZE_MAX;      // the extent bounce_ holds (a run of tokens in one extent reads once)
  uint64_t read_bytes_ = 0;
  std::vector<std::pair<uint64_t, int64_t>> order_;
};

}  // namespace

Result<std::vector<int32_t>> ByteCodec::encode(std::string_view text, uint32_t vocab_size) const {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= vocab_size)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("the prompt holds byte 0x{:02x} at offset {}, outside the model's vocabulary of {}",
                                    byte, i, vocab_size));
    tokens.push_back(byte);
  }
  return tokens;
}

std::string ByteCodec::decode(int32_t token) const {
  return token < 256 ? std::string(1, static_cast<char>(token)) : fmt::format("<{}>", token);
}

std::string TokenCodec::decode_all(std::span<const int32_t> tokens) const {
  std::string text;
  for (const int32_t token : tokens) text += decode(token);
  return text;
}

Result<std::vector<int32_t>> TokenizerCodec::encode(std::string_view text, uint32_t vocab_size) const {
  // The prompt starts with BOS where the model's texts do (tokenizer_config.json's add_bos_token).
  std::vector<uint32_t> ids;
  if (tokenizer_->add_bos() && tokenizer_->bos_id()) ids.push_back(*tokenizer_->bos_id());
  STRATA_RETURN_IF_ERROR(tokenizer_->encode_into(text, ids));
  std::vector<int32_t> tokens;
  tokens.reserve(ids.size());
  for (const uint32_t id : ids) {
    if (id >= vocab_size)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("the prompt's token {} is outside the model's vocabulary of {} (the tokenizer is "
                                    "not this model's)", id, vocab_size));
    tokens.push_back(static_cast<int32_t>(id));
  }
  return tokens;
}

std::string TokenizerCodec::decode(int32_t token) const {
  const auto id = static_cast<uint32_t>(token);
  Result<std::string> text = tokenizer_->decode(std::span<const uint32_t>(&id, 1));
  return text.ok() ? *text : fmt::format("<{}>", token);
}

std::string TokenizerCodec::decode_all(std::span<const int32_t> tokens) const {
  std::vector<uint32_t> ids(tokens.begin(), tokens.end());
  if (Result<std::string> text = tokenizer_->decode(ids); text.ok()) return *text;
  // Some id is not the tokenizer's: decode the runs between such ids, and print those as <id>.
  std::string text;
  std::vector<uint32_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    Result<std::string> piece = tokenizer_->decode(run);
    text += piece.ok() ? *piece : std::string();
    run.clear();
  };
  for (const uint32_t id : ids) {
    if (tokenizer_->decode(std::span<const uint32_t>(&id, 1)).ok()) {
      run.push_back(id);
    } else {
      flush();
      text += fmt::format("<{}>", id);
    }
  }
  flush();
  return text;
}

int32_t TokenizerCodec::start_token(uint32_t vocab_size) const {
  if (std::optional<uint32_t> bos = tokenizer_->bos_id(); bos && *bos < vocab_size) return static_cast<int32_t>(*bos);
  if (Result<std::vector<uint32_t>> newline = tokenizer_->encode("\n"); newline.ok() && !newline->empty() &&
                                                                       newline->front() < vocab_size)
    return static_cast<int32_t>(newline->front());
  return 0;
}

Result<std::unique_ptr<TokenCodec>> make_codec(const TrainConfig& config, const std::string& tokenizer_path) {
  const std::string path = tokenizer_path.empty() ? tokenizer_path_for(config) : tokenizer_path;
  if (path.empty()) {
    if (config.data_format != DataFormat::text_bytes)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{}: the data are tokens but no tokenizer is known to turn text into them: give "
                                    "data.tokenizer, a model.init folder with tokenizer.json or tokenizer.model, or "
                                    "--tokenizer PATH (or --prompt-ids)", config.source_path));
    return std::unique_ptr<TokenCodec>(std::make_unique<ByteCodec>());
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tokenizer, tokenizer::load_tokenizer(path));
  return std::unique_ptr<TokenCodec>(std::make_unique<TokenizerCodec>(std::move(tokenizer)));
}

float top2_margin(std::span<const float> logits) {
  float best = -std::numeric_limits<float>::infinity(), second = best;
  for (const float x : logits) {
    if (x > best) {
      second = best;
      best = x;
    } else if (x > second) {
      second = x;
    }
  }
  return logits.size() < 2 ? 0.0f : best - second;
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& options, std::mt19937_64& rng,
                     std::vector<std::pair<float, int32_t>>& order) {
  if (options.temperature <= 0.0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  order.clear();
  double total = 0.0;
  for (size_t v = 0; v < logits.size(); ++v) {
    const auto p = static_cast<float>(std::exp((static_cast<double>(logits[v]) - max_logit) / options.temperature));
    order.emplace_back(p, static_cast<int32_t>(v));
    total += p;
  }
  size_t kept = order.size();
  if (options.top_p < 1.0) {
    // Most likely first; ties by id, so the order never depends on the sort's stability.
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    double cumulative = 0.0;
    for (kept = 0; kept < order.size();) {
      cumulative += order[kept].first;
      ++kept;
      if (cumulative >= options.top_p * total) break;
    }
    total = cumulative;
  }
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  double cumulative = 0.0;
  for (size_t k = 0; k < kept; ++k) {
    cumulative += order[k].first;
    if (u < cumulative) return order[k].second;
  }
  return order[kept - 1].second;
}

Result<GenerateSummary> generate_offloaded(const TrainConfig& config, const std::string& prompt,
                                           const SamplingOptions& options, const TokenCodec& codec) {
  const std::string dir = store_dir_for(config);
  std::error_code exists_error;
  if (!std::filesystem::exists(std::filesystem::path(dir) / memory::kStoreManifestName, exists_error))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{} holds no committed weights: train first (strata train), or stage a Hugging Face "
                                  "folder (strata generate --model DIR)", dir));
  STRATA_ASSIGN_OR_RETURN(device::Kind kind, device::parse_kind(config.device_kind));
  // No GPU where cuda is asked for: the user's configuration error, in one line, as `strata train` says it.
  if (kind == device::Kind::cuda && device::cuda_device_count() == 0)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'device.kind': no CUDA device {}; use kind: cpu", config.source_path,
                                  STRATA_HAVE_CUDA ? "is visible to this process (no GPU, or no driver)"
                                                   : "support in this build (nvcc was not found at setup)"));
  memory::StoreOptions store_options = store_options_for(config);
  store_options.read_only = true;
  STRATA_ASSIGN_OR_RETURN(memory::Store store, memory::Store::open(dir, store_options));
  STRATA_ASSIGN_OR_RETURN(const ModelConfig model, committed_model(store.committed_metadata(), dir));
  auto precision_entry = store.committed_metadata().find("precision");
  Result<DType> precision = precision_entry == store.committed_metadata().end()
                                ? Result<DType>(make_error(ErrorKind::corrupt, "missing"))
                                : parse_dtype(precision_entry->second);
  if (!precision.ok() || *precision == DType::f16)
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'precision' is not fp32 or bf16", dir));
  // An adapter store (LoRA): the passes run over the frozen base, stored in adapter.base_dtype,
  // with the adapters folded in at load (AdapterFoldingBacking).
  // An int8 / NF4 base generates at bf16 (QLoRA's compute dtype): its embedding and final units
  // are stored bf16, and each block is dequantised and rounded to bf16 as its read completes.
  const bool adapters = model.adapter.enabled;
  if (adapters) precision = model.adapter.base_dtype == BaseDType::fp32 ? DType::f32 : DType::bf16;
  const uint64_t element_bytes = dtype_size_bytes(*precision);
  ModelConfig base_model = model;
  base_model.adapter.enabled = false;
  // The definition drives the pass (its units, its decode ops): GPT-2 and Llama share it. With
  // adapters, the base's units alone (the same names and shapes; the adapters are folded in).
  const ModelLayout layout(base_model);
  std::optional<ModelLayout> adapter_layout;
  StoreAdapters store_adapters;
  if (adapters) {
    adapter_layout.emplace(model);
    STRATA_ASSIGN_OR_RETURN(store_adapters, read_store_adapters(dir, *adapter_layout));
  }
  // A unit's bytes in the store, and in the pool: a quantised block is read as stored (fewer
  // bytes than bf16, and what the I/O floor counts) into a buffer that then holds it as bf16.
  auto stored_bytes = [&](size_t u) {
    return adapters ? adapter_layout->frozen_params_bytes(u) : layout.units()[u].element_count * element_bytes;
  };
  auto pool_unit_bytes = [&](size_t u) {
    return std::max(stored_bytes(u), layout.units()[u].element_count * element_bytes);
  };
  const uint64_t adapter_host_bytes = store_adapters.weights.size() * 4;
  // A ZeRO stage-3 rank's store holds only its share of the compute copies (train/zero/zero.h):
  // generation reads whole units from one store, so the set is exported first.
  for (const Unit& unit : layout.units())
    if (!store.find(params_name(unit)).has_value())
      return make_error(ErrorKind::unsupported,
                        fmt::format("store {} holds only this rank's share of tensor '{}' (a ZeRO stage-3 job of {} "
                                    "ranks partitions the parameters): export the whole model first — `strata store "
                                    "export RANK0_STORE RANK1_STORE … OUT_DIR` — then `strata generate --model OUT_DIR "
                                    "--nvme NEW_DIR`",
                                    dir, params_name(unit),
                                    store.committed_metadata().count("parallel.ranks") != 0
                                        ? store.committed_metadata().at("parallel.ranks")
                                        : std::string("several")));
  const models::ModelDefinition& definition = layout.definition();
  const int64_t c = model.n_embd;
  const int64_t vocab = model.vocab_size;
  const int64_t n_layer = model.n_layer;
  // The window: seq_len. GPT-2 cannot pass it (its positions are learned); Llama's RoPE could,
  // but the KV cache is sized for it — either way a full window starts over from its last half.
  const int64_t window = model.seq_len;
  const int64_t learned_positions = definition.learned_positions();
  const int64_t kv_width = definition.kv_cache_width();
  const uint64_t final_norm_elements = definition.final_norm_elements();
  const bool tied = definition.head_tied();

  STRATA_ASSIGN_OR_RETURN(std::vector<int32_t> context, codec.encode(prompt, model.vocab_size));
  if (context.empty()) context.push_back(codec.start_token(model.vocab_size));
  if (static_cast<int64_t>(context.size()) > window)  // the window: the prompt's last `window` tokens
    context.erase(context.begin(), context.end() - window);
  const auto prompt_rows = static_cast<int64_t>(context.size());
  const int64_t refill_rows = std::max<int64_t>(1, window / 2);
  const int64_t max_rows = std::max(prompt_rows, refill_rows);

  // The fixed scratch, on the device (on the CPU device: host memory out of the same budgets).
  const uint64_t kv_block_bytes = uint64_t(window) * uint64_t(kv_width) * 4;
  const uint64_t kv_bytes = uint64_t(n_layer) * 2 * kv_block_bytes;
  const uint64_t activation_bytes = uint64_t(max_rows) * uint64_t(c) * 4;
  // bf16 weights: the blocks and the head run the definition's bf16 decode ops, whose scratch
  // the backend sizes (on the CPU ~1 MiB: the 1-D tensors and L2-sized pieces; a backend that
  // widens first needs a block whole); the embedding's new token rows and their learned
  // positions are widened here into the same scratch, before those ops run.
  const uint64_t embed_piece_elements = uint64_t(max_rows) * uint64_t(c) * (learned_positions > 0 ? 2 : 1);
  const uint64_t widen_bytes =
      *precision == DType::f32 ? 0
                               : std::max<uint64_t>(definition.decode_bf16_scratch_bytes(kind),
                                                    align_up(embed_piece_elements * 4, 64));
  const uint64_t workspace_bytes = definition.decode_workspace_size_bytes(kind, max_rows, window);
  const uint64_t logits_bytes = uint64_t(vocab) * 4;
  const uint64_t fixed_scratch_bytes = uint64_t(n_layer) * 2 * device_bytes(kv_block_bytes) +
                                       2 * device_bytes(activation_bytes) + device_bytes(widen_bytes) +
                                       device_bytes(workspace_bytes) + device_bytes(logits_bytes) +
                                       kernels::fixed_device_bytes(kind, kernels::BatchShape{1, max_rows});
  // The pool before the embedding rows are decided on: the one pool rule (run/budgets.h) with
  // the fixed scratch.
  const uint64_t pool_before_rows_bytes =
      memory_pools(kind, config.device_memory_bytes, config.host_memory_bytes, fixed_scratch_bytes).pool_bytes;
  uint64_t weights_in_pool_bytes = 0;  // as the scheduler places them
  for (size_t u = 0; u < layout.units().size(); ++u) weights_in_pool_bytes += align_up(pool_unit_bytes(u), 4096);
  // An untied table is needed only at the pass's new tokens' rows: when the weights do not all
  // fit the pool, read those (EmbeddingRows) instead of streaming the table through it. When
  // they fit, the table stays in the pool and nothing is read per token. A tied table is the
  // head's projection too, and GPT-2's unit also holds the learned positions: those stream whole.
  const bool embed_by_rows = !tied && learned_positions == 0 && weights_in_pool_bytes > pool_before_rows_bytes;
  // Read by rows: the rows as stored, on the device (the op's table), and their host staging,
  // plus the reader's one-extent buffer — host memory, out of the pool.
  const uint64_t row_bytes = uint64_t(c) * element_bytes;
  const uint64_t embed_rows_bytes = embed_by_rows ? uint64_t(max_rows) * row_bytes : 0;
  const std::string embed_tensor = params_name(layout.units()[layout.embed_unit()]);
  // Host memory beside the scheduler's blocks, out of the pool: the embedding-rows reader's
  // buffers, and an adapter store's adapters with the fold's buffer (a bf16 base: one linear
  // widened; an int8 / NF4 base: one block dequantised to fp32).
  const uint64_t fold_widen_bytes =
      adapters ? AdapterFoldingBacking::buffer_bytes(*adapter_layout, *precision == DType::bf16) : 0;
  const uint64_t embed_reader_bytes =
      (embed_by_rows ? EmbeddingRows::buffer_bytes(store, embed_tensor) + align_up(embed_rows_bytes, kHugePageBytes)
                     : 0) +
      adapter_host_bytes + fold_widen_bytes;
  const uint64_t scratch_bytes = fixed_scratch_bytes + (embed_by_rows ? device_bytes(embed_rows_bytes) : 0);

  // The plan: one pass = embed (unless read by rows), blocks 0 … L−1, head; it repeats per pass.
  // `store_plan` holds the same tensors at the sizes the store holds them, for the store backing
  // (which reads exactly those); the scheduler's `plan` sizes their buffers (pool_unit_bytes).
  sch::AccessPlan plan;
  sch::AccessPlan store_plan;
  std::vector<sch::TensorId> ids;
  uint64_t weight_bytes = 0;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Unit& unit = layout.units()[u];
    weight_bytes += stored_bytes(u);
    if (embed_by_rows && u == layout.embed_unit()) {
      ids.push_back(kNoTensor);
      continue;
    }
    ids.push_back(plan.add_tensor(params_name(unit), pool_unit_bytes(u)));
    store_plan.add_tensor(params_name(unit), stored_bytes(u));
  }
  if (!embed_by_rows) plan.add_step("embed", {ids[layout.embed_unit()]});
  for (int64_t i = 0; i < n_layer; ++i)
    plan.add_step(layout.units()[layout.block_unit(i)].name, {ids[layout.block_unit(i)]});
  if (tied)
    plan.add_step("head", {ids[layout.ln_f_unit()], ids[layout.embed_unit()]});
  else
    plan.add_step("head", {ids[layout.ln_f_unit()]});
  STRATA_RETURN_IF_ERROR(plan.validate());

  uint64_t largest_step_bytes = 0;
  for (size_t s = 0; s < plan.step_count(); ++s)
    largest_step_bytes = std::max(largest_step_bytes, plan.step_bytes(s, 4096));
  // The budgets, by the trainer's rule (run/budgets.h memory_pools): the CPU device computes in
  // place on ONE pool, host.memory + device.memory, that holds the scratch and stages the
  // weights; on a GPU device.memory holds the scratch and the weights staged onto it (at least
  // the largest step), and host.memory is the pinned pool the weights come through from NVMe.
  // The embedding-rows reader's host bytes come out of the pool either way.
  const MemoryPools pools = memory_pools(kind, config.device_memory_bytes, config.host_memory_bytes, scratch_bytes);
  const bool one_pool = pools.one_pool;
  const uint64_t budget_bytes = pools.budget_bytes;
  const uint64_t budget_scratch_bytes = scratch_bytes + (one_pool ? embed_reader_bytes : 0);
  if (budget_bytes < budget_scratch_bytes + largest_step_bytes)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: {} = {} cannot hold generation's scratch ({}: the KV "
                                  "cache {}, bf16 scratch {}{}, activations, workspace{}) and its "
                                  "largest step ({})",
                                  config.source_path, one_pool ? "host.memory + device.memory" : "device.memory",
                                  format_size(budget_bytes), format_size(budget_scratch_bytes),
                                  format_size(kv_bytes), format_size(widen_bytes),
                                  widen_bytes > 0 ? " (the weights are bf16; fp32 weights need none)" : "",
                                  fmt::format("{}{}", embed_by_rows ? ", embedding rows" : "",
                                              adapters ? ", the adapters to fold" : ""),
                                  format_size(largest_step_bytes)));
  if (!one_pool && pools.pool_bytes < largest_step_bytes + embed_reader_bytes)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: host.memory = {} cannot stage generation's largest step ({}) from NVMe{}",
                                  config.source_path, format_size(config.host_memory_bytes),
                                  format_size(largest_step_bytes),
                                  embed_reader_bytes > 0
                                      ? fmt::format(" beside the {} ({})",
                                                    embed_by_rows && adapters ? "embedding rows' buffers and the adapters"
                                                    : embed_by_rows           ? "embedding rows' buffers"
                                                                              : "adapters to fold",
                                                    format_size(embed_reader_bytes))
                                      : std::string()));
  // The checks above leave the pool room for the reader's buffers and the adapters.
  const uint64_t pool_bytes = pools.pool_bytes - embed_reader_bytes;

  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Device> device, device::make_device(kind, pools.device_region_bytes));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<kernels::ComputeBackend> backend,
                          kernels::make_backend(*device, kernels::BatchShape{1, max_rows}));
  std::vector<device::DeviceBuffer> cache_buffers;
  std::vector<kernels::KvCacheBlock> cache(static_cast<size_t>(n_layer));
  for (int64_t i = 0; i < n_layer; ++i) {
    STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer keys, device->allocate(kv_block_bytes));
    STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer values, device->allocate(kv_block_bytes));
    cache[static_cast<size_t>(i)] = {reinterpret_cast<float*>(keys.data()), reinterpret_cast<float*>(values.data()),
                                     window};
    cache_buffers.push_back(std::move(keys));
    cache_buffers.push_back(std::move(values));
  }
  STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer x_a_buffer, device->allocate(activation_bytes));
  STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer x_b_buffer, device->allocate(activation_bytes));
  STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer widen_buffer, device->allocate(std::max<uint64_t>(widen_bytes, 1)));
  STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer workspace_buffer, device->allocate(workspace_bytes));
  STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer logits_buffer, device->allocate(logits_bytes));
  device::DeviceBuffer embed_rows_buffer;
  std::optional<EmbeddingRows> embedding_rows;
  PageMapping embed_rows_staging;
  if (embed_by_rows) {
    STRATA_ASSIGN_OR_RETURN(embed_rows_buffer, device->allocate(embed_rows_bytes));
    STRATA_ASSIGN_OR_RETURN(EmbeddingRows reader, EmbeddingRows::open(dir, store_options, embed_tensor, row_bytes));
    embedding_rows.emplace(std::move(reader));
    STRATA_ASSIGN_OR_RETURN(embed_rows_staging, PageMapping::map(embed_rows_bytes, PageMappingOptions{},
                                                                 "embedding rows staging"));
  }
  // 0, 1, 2...: rows of a widened piece. Token ids are host memory at the backend's interface
  // (a GPU backend copies them onto its stream before the embedding op).
  std::vector<int32_t> row_id_values(static_cast<size_t>(max_rows));
  for (int64_t r = 0; r < max_rows; ++r) row_id_values[static_cast<size_t>(r)] = static_cast<int32_t>(r);
  const int32_t* row_ids = row_id_values.data();
  auto* x_a = reinterpret_cast<float*>(x_a_buffer.data());
  auto* x_b = reinterpret_cast<float*>(x_b_buffer.data());
  const kernels::Workspace workspace{reinterpret_cast<float*>(workspace_buffer.data()), workspace_bytes};
  auto* logits = reinterpret_cast<float*>(logits_buffer.data());
  // Sampling reads host memory: a host backend's logits where they lie, a GPU's copied back
  // once per pass (sampled_logits below).
  std::vector<float> logits_copy(backend->is_host() ? 0 : static_cast<size_t>(vocab));
  const float* sampled_logits = backend->is_host() ? logits : logits_copy.data();

  memory::HostArenaOptions arena_options;
  arena_options.try_cuda = kind == device::Kind::cuda;  // pinned by CUDA only for a CUDA run
  arena_options.capacity_bytes = pool_bytes;
  STRATA_ASSIGN_OR_RETURN(memory::HostArena arena, memory::HostArena::create(arena_options));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<sch::NvmeBacking> backing, sch::make_store_backing(store, store_plan));
  if (adapters) {
    std::vector<int64_t> block_of_tensor(plan.tensors().size(), -1);
    for (int64_t i = 0; i < n_layer; ++i) block_of_tensor[ids[layout.block_unit(i)]] = i;
    backing = std::make_unique<AdapterFoldingBacking>(std::move(backing), store_plan.tensors(), *adapter_layout,
                                                      model.adapter, std::move(block_of_tensor),
                                                      std::move(store_adapters.weights),
                                                      std::move(store_adapters.offsets), *precision == DType::bf16);
  }
  sch::SchedulerOptions scheduler_options;
  scheduler_options.host_budget_bytes = pool_bytes;
  scheduler_options.compute_in_place = one_pool;  // the CPU device computes on the host blocks
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<sch::Scheduler> scheduler,
                          sch::Scheduler::create(plan, *device, arena, backing.get(), scheduler_options));

  auto* widen_scratch = reinterpret_cast<float*>(widen_buffer.data());
  const kernels::Workspace bf16_scratch{widen_scratch, widen_bytes};
  const size_t head_step = plan.step_count() - 1;
  const size_t first_block_step = embed_by_rows ? 0 : 1;
  // The embedding by rows: the new tokens' rows gathered from the store, to the device, then
  // the op over them as a `rows`-row table (ids 0…rows−1), widened first when bf16.
  auto embed_rows = [&](const int32_t* tokens, int64_t rows) -> Status {
    STRATA_RETURN_IF_ERROR(embedding_rows->gather(tokens, rows, embed_rows_staging.data()));
    STRATA_RETURN_IF_ERROR(device->copy_to_device(backend->compute_stream(), embed_rows_buffer.data(),
                                                  embed_rows_staging.data(), uint64_t(rows) * row_bytes));
    // The copy is done before any op reads it: the CPU backend runs its ops on the calling
    // thread, not behind the stream's copies (a few KiB; the stream is idle between passes).
    STRATA_RETURN_IF_ERROR(backend->synchronize());
    const auto* table = reinterpret_cast<const float*>(embed_rows_buffer.data());
    if (*precision != DType::f32) {
      STRATA_RETURN_IF_ERROR(backend->cast_bf16_to_fp32(reinterpret_cast<const uint16_t*>(embed_rows_buffer.data()),
                                                        widen_scratch, uint64_t(rows) * uint64_t(c)));
      table = widen_scratch;
    }
    return definition.embedding_decode(*backend, 0, rows, row_ids, table, rows, nullptr, x_a);
  };
  // The embedding step: x_a = the new tokens' embeddings.
  auto embed_step = [&](const sch::StepBuffers& buffers, const int32_t* tokens, int64_t past, int64_t rows) -> Status {
    void* embed_params = buffers.device_data(ids[layout.embed_unit()]);
    if (*precision == DType::f32) {
      const auto* embed = static_cast<const float*>(embed_params);
      return definition.embedding_decode(*backend, past, rows, tokens, embed, vocab,
                                         learned_positions > 0 ? embed + vocab * c : nullptr, x_a);
    }
    // The new tokens' rows, widened in order, then their positions' rows: the embedding of row
    // r is piece row r (ids 0…rows−1) plus position piece row r — position past + r, so the op
    // is told past 0 over the piece.
    const auto* bits = static_cast<const uint16_t*>(embed_params);
    float* token_rows = widen_scratch;
    float* positions = widen_scratch + uint64_t(max_rows) * uint64_t(c);
    for (int64_t r = 0; r < rows; ++r)
      STRATA_RETURN_IF_ERROR(
          backend->cast_bf16_to_fp32(bits + int64_t{tokens[r]} * c, token_rows + r * c, uint64_t(c)));
    if (learned_positions > 0)
      STRATA_RETURN_IF_ERROR(backend->cast_bf16_to_fp32(bits + (vocab + past) * c, positions,
                                                        uint64_t(rows) * uint64_t(c)));
    return definition.embedding_decode(*backend, 0, rows, row_ids, token_rows, rows,
                                       learned_positions > 0 ? positions : nullptr, x_a);
  };
  // The head step: the logits of the last new row.
  auto head = [&](const sch::StepBuffers& buffers, int64_t rows) -> Status {
    void* final_params = buffers.device_data(ids[layout.ln_f_unit()]);
    // The output projection [vocab, C]: the embedding's token rows (tied) or after the norm.
    const void* projection = tied ? buffers.device_data(ids[layout.embed_unit()])
                                  : static_cast<const char*>(final_params) + final_norm_elements * element_bytes;
    if (*precision == DType::f32)
      return definition.head_logits(*backend, rows, static_cast<const float*>(final_params),
                                    static_cast<const float*>(projection), vocab, x_a, logits, workspace);
    return definition.head_logits_bf16(*backend, rows, static_cast<const uint16_t*>(final_params),
                                       static_cast<const uint16_t*>(projection), x_a, logits, workspace, bf16_scratch);
  };
  // One pass over the weights for `rows` new tokens at positions past…; leaves the logits of
  // the last one in `logits`.
  auto pass = [&](const int32_t* tokens, int64_t past, int64_t rows) -> Status {
    if (embed_by_rows) STRATA_RETURN_IF_ERROR(embed_rows(tokens, rows));
    for (size_t s = 0; s < plan.step_count(); ++s) {
      STRATA_ASSIGN_OR_RETURN(sch::StepBuffers buffers, scheduler->acquire(s));
      Status status;
      const auto block_index = static_cast<int64_t>(s) - static_cast<int64_t>(first_block_step);
      if (s < first_block_step) {
        status = embed_step(buffers, tokens, past, rows);
      } else if (s < head_step) {
        void* block = buffers.device_data(ids[layout.block_unit(block_index)]);
        status = *precision == DType::f32
                     ? definition.block_decode(*backend, past, rows, static_cast<const float*>(block), x_a, x_b,
                                               cache[size_t(block_index)], workspace)
                     : definition.block_decode_bf16(*backend, past, rows, static_cast<const uint16_t*>(block), x_a,
                                                    x_b, cache[size_t(block_index)], workspace, bf16_scratch);
        std::swap(x_a, x_b);
      } else {
        status = head(buffers, rows);
      }
      Status released = scheduler->release_after(s, backend->compute_stream());
      STRATA_RETURN_IF_ERROR(status);
      STRATA_RETURN_IF_ERROR(released);
    }
    if (!backend->is_host())
      STRATA_RETURN_IF_ERROR(device->copy_to_host(backend->compute_stream(), logits_copy.data(), logits, logits_bytes));
    return backend->synchronize();  // the one wait of a pass: its logits are ready to sample
  };

  GenerateSummary summary;
  summary.prompt_tokens = static_cast<uint32_t>(prompt_rows);
  summary.weight_bytes = weight_bytes;
  summary.kv_cache_bytes = kv_bytes;
  summary.bf16_scratch_bytes = widen_bytes;
  summary.pool_bytes = pool_bytes;
  std::mt19937_64 rng(options.seed);
  std::vector<std::pair<float, int32_t>> order;
  const Clock::time_point prefill_start = Clock::now();
  STRATA_RETURN_IF_ERROR(pass(context.data(), 0, prompt_rows));
  summary.prefill_seconds = seconds_since(prefill_start);
  int64_t past = prompt_rows;
  const Clock::time_point decode_start = Clock::now();
  Clock::time_point last_progress = decode_start;
  uint64_t passes = 0;
  for (uint32_t produced = 0; produced < options.tokens; ++produced) {
    const int32_t next = sample_token(std::span<const float>(sampled_logits, static_cast<size_t>(vocab)), options, rng, order);
    summary.tokens.push_back(next);
    summary.top2_margins.push_back(top2_margin(std::span<const float>(sampled_logits, static_cast<size_t>(vocab))));
    context.push_back(next);
    if (produced + 1 == options.tokens) break;  // the last token needs no pass after it
    if (past == window) {
      // The window is full: its last half becomes the prompt again, at positions 0….
      STRATA_RETURN_IF_ERROR(pass(context.data() + context.size() - refill_rows, 0, refill_rows));
      past = refill_rows;
    } else {
      STRATA_RETURN_IF_ERROR(pass(&context.back(), past, 1));
      ++past;
    }
    ++passes;
    if (options.progress && seconds_since(last_progress) >= 1.0) {
      last_progress = Clock::now();
      fmt::print(stderr, "\rgenerate: {} / {} tokens, {:.2f} tokens/s   ", produced + 1, options.tokens,
                 static_cast<double>(passes) / seconds_since(decode_start));
    }
  }
  if (options.progress && passes > 0) fmt::print(stderr, "\n");
  summary.decode_seconds = seconds_since(decode_start);
  summary.text = codec.decode_all(summary.tokens);
  summary.tokens_per_s = summary.decode_seconds > 0 ? static_cast<double>(passes) / summary.decode_seconds : 0.0;
  const sch::SchedulerStats stats = scheduler->stats();
  const sch::TransferStats& reads = stats.transfers[static_cast<size_t>(sch::TierPair::nvme_to_host)];
  scheduler.reset();  // before the store, the arena and the device it uses
  // The bytes the store read (its handle is the scheduler's alone): the scheduler counts its
  // plan's sizes, which exceed the store's for a quantised block (read smaller, held as bf16).
  const memory::StoreStats store_stats = store.stats();  // the scheduler's I/O thread is gone
  summary.nvme_read_bytes = store_stats.bytes_read + (embedding_rows ? embedding_rows->read_bytes() : 0);
  summary.nvme_read_trusted_bytes = store_stats.bytes_read_trusted;
  summary.read_busy_seconds = static_cast<double>(reads.busy_ns) * 1e-9;
  summary.stall_seconds = static_cast<double>(stats.stall_ns) * 1e-9;
  summary.host_high_water_bytes = stats.host_high_water_bytes;
  summary.tuned = config.io.read.measured_MBps.has_value();
  // Untuned: this run's own NVMe read rate while reads were running stands in for the tuned one.
  summary.read_MBps = summary.tuned       ? *config.io.read.measured_MBps
                      : reads.busy_ns == 0 ? 0.0
                                           : static_cast<double>(store_stats.bytes_read) * 1e3 /
                                                 static_cast<double>(reads.busy_ns);
  summary.io_floor_tokens_per_s = summary.read_MBps > 0 ? summary.read_MBps * 1e6 / static_cast<double>(weight_bytes) : 0.0;
  summary.peak_rss_bytes = peak_rss_bytes();
  return summary;
}

Status stage_hf_weights(const TrainConfig& config, bool progress) {
  const std::string dir = store_dir_for(config);
  const ModelLayout layout(config.model);
  const uint64_t element_bytes = dtype_size_bytes(config.precision);
  std::error_code exists_error;
  if (std::filesystem::exists(std::filesystem::path(dir) / memory::kStoreManifestName, exists_error)) {
    memory::StoreOptions options = store_options_for(config);
    options.read_only = true;
    STRATA_ASSIGN_OR_RETURN(memory::Store store, memory::Store::open(dir, options));
    const auto& metadata = store.committed_metadata();
    Result<ModelConfig> stored = committed_model(metadata, dir);
    auto format = metadata.find("format");
    auto source = metadata.find("source");
    auto precision = metadata.find("precision");
    if (stored.ok() && format != metadata.end() && format->second == kWeightsOnlyFormat && source != metadata.end() &&
        source->second == config.model.init && precision != metadata.end() &&
        precision->second == dtype_name(config.precision) && stored->n_layer == config.model.n_layer &&
        stored->n_embd == config.model.n_embd && stored->vocab_size == config.model.vocab_size &&
        stored->seq_len == config.model.seq_len && stored->n_head == config.model.n_head) {
      spdlog::info("{} already holds the weights of {}; generating from them", dir, config.model.init);
      return Status();
    }
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{} already holds another store; give --nvme an empty folder (or the one this model "
                                  "was staged into)", dir));
  }
  STRATA_ASSIGN_OR_RETURN(hf::Checkpoint checkpoint, hf::Checkpoint::open(config.model.init));
  STRATA_RETURN_IF_ERROR(checkpoint.check(hf::model_tensors(config.model)));
  uint64_t weight_bytes = 0;
  for (const Unit& unit : layout.units()) weight_bytes += align_up(unit.element_count * element_bytes, 64 * kKiB);
  const uint64_t capacity_bytes = weight_bytes + std::max<uint64_t>(64 * kMiB, weight_bytes / 50);
  struct statvfs fs {};
  if (::statvfs(config.nvme_paths.front().c_str(), &fs) == 0 && uint64_t{fs.f_bavail} * fs.f_frsize < capacity_bytes)
    return make_error(ErrorKind::no_space, fmt::format("{} has {} free but staging the weights needs {}",
                                                       config.nvme_paths.front(),
                                                       format_size(uint64_t{fs.f_bavail} * fs.f_frsize),
                                                       format_size(capacity_bytes)));
  std::vector<std::string> data_paths;
  for (const std::string& path : config.nvme_paths)
    data_paths.push_back((std::filesystem::path(path) / "strata.data").string());
  // 4 MiB extents (a training store's are 16 MiB): an untied embedding is read by the extents
  // that hold a pass's rows (EmbeddingRows), so a token costs 4 MiB of reads and of buffer.
  // Streamed units read as before: the engine cuts every extent into block_size requests anyway.
  memory::StoreOptions staged_options = store_options_for(config);
  staged_options.max_extent_bytes = std::min<uint64_t>(staged_options.max_extent_bytes, 4 * kMiB);
  STRATA_ASSIGN_OR_RETURN(memory::Store store, memory::Store::create(dir, data_paths, capacity_bytes, staged_options));
  spdlog::info("staging {} ({} parameters, {} as {}) into {} before generating", config.model.init,
               layout.parameter_count(), format_size(weight_bytes), dtype_name(config.precision), dir);
  // One unit at a time through one pinned buffer: the fp32 unit, then its compute copy.
  const uint64_t largest = layout.largest_unit_elements();
  memory::HostArenaOptions arena_options;
  arena_options.capacity_bytes = align_up(largest * 4, 4096) + align_up(largest * 2, 4096) + 8192;
  STRATA_ASSIGN_OR_RETURN(memory::HostArena arena, memory::HostArena::create(arena_options));
  STRATA_ASSIGN_OR_RETURN(memory::HostBuffer master_buffer, memory::HostBuffer::allocate(arena, largest * 4));
  STRATA_ASSIGN_OR_RETURN(memory::HostBuffer copy_buffer, memory::HostBuffer::allocate(arena, std::max<uint64_t>(largest * 2, 1)));
  auto* master = reinterpret_cast<float*>(master_buffer.data());
  auto* copy = reinterpret_cast<uint16_t*>(copy_buffer.data());
  const Clock::time_point start = Clock::now();
  uint64_t done_bytes = 0;
  for (const Unit& unit : layout.units()) {
    for (const UnitTensor& tensor : unit.tensors)
      STRATA_RETURN_IF_ERROR(checkpoint.read_fp32(hf::tensor_spec(config.model, tensor.name, tensor.shape),
                                                  master + tensor.offset_elements));
    const int64_t shape[] = {static_cast<int64_t>(unit.element_count)};
    const void* data = master;
    if (config.precision == DType::bf16) {
      kernels::cast_fp32_to_bf16(std::span<const float>(master, unit.element_count),
                                 std::span<uint16_t>(copy, unit.element_count));
      data = copy;
    }
    STRATA_ASSIGN_OR_RETURN(memory::StoreTicket ticket,
                            store.write_tensor_async(params_name(unit), config.precision, shape, data,
                                                     unit.element_count * element_bytes));
    STRATA_RETURN_IF_ERROR(store.wait(ticket));
    done_bytes += unit.element_count * element_bytes;
    if (progress)
      fmt::print(stderr, "\rstaging: {} / {} ({:.0f} MB/s)   ", format_size(done_bytes), format_size(weight_bytes),
                 static_cast<double>(done_bytes) / 1e6 / std::max(1e-9, seconds_since(start)));
  }
  if (progress) fmt::print(stderr, "\n");
  std::map<std::string, std::string> metadata = commit_metadata(config, 0);
  metadata["format"] = kWeightsOnlyFormat;
  metadata["source"] = config.model.init;
  return store.commit(0, metadata);
}

Result<std::string> generate(const TrainConfig& config, const std::string& prompt, uint32_t tokens,
                             double temperature, uint64_t seed) {
  SamplingOptions options;
  options.tokens = tokens;
  options.temperature = temperature;
  options.seed = seed;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TokenCodec> codec, make_codec(config, std::string()));
  STRATA_ASSIGN_OR_RETURN(GenerateSummary summary, generate_offloaded(config, prompt, options, *codec));
  return summary.text;
}

}  // namespace strata
