// strata/run/run_store.cpp — a run's store: names, options, commit metadata, read-back and
// export (run/run_store.h).
#include "run/run_store.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "kernels/optim/cast.h"
#include "models/hf/hf.h"
#include "models/hf/peft.h"
#include "models/lora_fold.h"
#include "models/model.h"
#include "models/safetensors.h"

namespace strata {

std::string expand_rank(const std::string& path, int rank) {
  std::string out = path;
  const std::string token = "{rank}";
  for (size_t at = out.find(token); at != std::string::npos; at = out.find(token, at))
    out.replace(at, token.size(), std::to_string(rank));
  return out;
}

std::string store_dir_for(const TrainConfig& config, int rank) {
  return (std::filesystem::path(expand_rank(config.nvme_paths.front(), rank)) / kStoreFolder).string();
}

memory::StoreOptions store_options_for(const TrainConfig& config) {
  memory::StoreOptions options;
  options.engine = config.io.write.engine_config();
  // Reads dominate a step; the read settings get the deeper queue when they differ.
  options.engine.queue_depth = std::max(config.io.read.queue_depth, config.io.write.queue_depth);
  options.engine.block_size_bytes = std::max(config.io.read.block_size_bytes, config.io.write.block_size_bytes);
  options.verify_reads = config.verify_reads;
  // The data files this config puts outside the store folder (the trainer creates them there):
  // a manifest naming any other outside path is refused (memory/store.h).
  for (const std::string& path : config.nvme_paths)
    options.external_data_paths.push_back((std::filesystem::path(path) / "strata.data").string());
  return options;
}

uint64_t training_store_capacity_bytes(const TrainPlan& run) {
  // Two versions of what a commit rewrites (the new one is written beside the committed one);
  // a frozen base (LoRA) is written once, at init, and never again: one version of it.
  uint64_t rewritten_bytes = 0, written_once_bytes = 0;
  for (scheduler::TensorId id = 0; id < run.plan.tensors().size(); ++id) {
    if (!is_store_tensor(run, id)) continue;
    const uint64_t bytes = align_up(run.plan.tensors()[id].size_bytes, 64 * kKiB);
    (is_persistent(run, id) && !is_rewritten(run, id) ? written_once_bytes : rewritten_bytes) += bytes;
  }
  const uint64_t store_bytes = rewritten_bytes + written_once_bytes;
  return 2 * rewritten_bytes + written_once_bytes + std::max<uint64_t>(64 * kMiB, store_bytes / 50);
}

// Removes what a run that never committed left behind (a store directory without a committed
// step, data files) so a fresh store can be created in its place.
Status discard_uncommitted_store(const TrainConfig& config) {
  std::error_code error;
  std::filesystem::remove_all(store_dir_for(config), error);
  if (error) return make_errno_error(error.value(), "remove", store_dir_for(config));
  for (const std::string& path : config.nvme_paths) {
    std::filesystem::remove(std::filesystem::path(path) / "strata.data", error);
    if (error) return make_errno_error(error.value(), "remove", path + "/strata.data");
  }
  return Status();
}

StoreMetadata commit_metadata(const TrainConfig& config, uint64_t step, int ranks) {
  StoreMetadata metadata = models::store_metadata(config.model);
  metadata.insert({{"format", kRunFormat},
                   {"parallel.ranks", std::to_string(ranks)},  // train/zero/zero.h: how the optimizer chunks are split
                   {"step", std::to_string(step)},
                   {"precision", dtype_name(config.precision)},
                   {"optim_chunk_elements", std::to_string(config.optimizer.chunk_elements)}});
  config.optimizer.state().record(metadata);  // optim_state and its kind's keys (optim/state.h)
  // The run's tokenizer, for an exported Hugging Face folder to carry (export_store_weights).
  if (const std::string tokenizer = tokenizer_path_for(config); !tokenizer.empty()) metadata["tokenizer"] = tokenizer;
  // An adapter's base, for an exported PEFT folder's base_model_name_or_path (export_store_weights).
  if (config.model.adapter.enabled && config.model.init != "random") metadata["adapter.base_model"] = config.model.init;
  return metadata;
}

// The optimizer chunk size a store was written with (stores from before chunks: one chunk
// per unit of any size, which is what a huge chunk size describes).
Result<uint64_t> optim_chunk_elements_of(const StoreMetadata& metadata, const std::string& dir) {
  if (metadata.count("optim_chunk_elements") == 0) return std::numeric_limits<uint64_t>::max();
  return models::metadata_integer(metadata, "optim_chunk_elements", 1, std::numeric_limits<uint64_t>::max(), dir);
}

// The optimizer state layout a store was written with (stores from before the seam: adamw, the
// one layout there was).
Result<optim::StateLayout> optim_state_of(const StoreMetadata& metadata, const std::string& dir) {
  return optim::StateLayout::from_metadata(metadata, dir);
}

// The model a store was trained with, from its committed metadata (model.h's shape keys, held
// to the same bounds as a config's model: section, so a layout is never built from a shape a
// config could not give).
Result<ModelConfig> model_from_metadata(const StoreMetadata& metadata,
                                        const std::string& dir) {
  auto it = metadata.find("format");
  if (it == metadata.end() || it->second != kRunFormat)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("store {} holds no committed strata training run", dir));
  return models::model_from_store_metadata(metadata, dir);
}

Result<ModelConfig> committed_model(const StoreMetadata& metadata, const std::string& dir) {
  auto format = metadata.find("format");
  if (format == metadata.end() || format->second != kWeightsOnlyFormat) return model_from_metadata(metadata, dir);
  std::map<std::string, std::string> as_run = metadata;  // the same shape keys as a run's
  as_run["format"] = kRunFormat;
  return model_from_metadata(as_run, dir);
}

// One store transfer, waited for.
Status write_tensor(memory::Store& store, const std::string& name, DType dtype, std::span<const int64_t> shape,
                    const void* data, uint64_t size_bytes) {
  STRATA_ASSIGN_OR_RETURN(memory::StoreTicket ticket, store.write_tensor_async(name, dtype, shape, data, size_bytes));
  return store.wait(ticket);
}
Status read_tensor(memory::Store& store, const std::string& name, void* data, uint64_t size_bytes) {
  STRATA_ASSIGN_OR_RETURN(memory::StoreTicket ticket, store.read_tensor_async(name, data, size_bytes));
  return store.wait(ticket);
}

// Opens every store of a run read-only; they must all be at the same committed step (a ZeRO
// commit is global: docs/parallel.md).
Result<std::vector<memory::Store>> open_store_set(const std::vector<std::string>& dirs) {
  std::vector<memory::Store> stores;
  memory::StoreOptions options;
  options.read_only = true;
  for (const std::string& dir : dirs) {
    STRATA_ASSIGN_OR_RETURN(memory::Store store, memory::Store::open(dir, options));
    if (!stores.empty() && store.committed_step() != stores.front().committed_step())
      return make_error(ErrorKind::corrupt, fmt::format("store {} is at step {} but {} is at step {}: the stores of "
                                                        "one job must be at the same global commit",
                                                        dir, store.committed_step(), dirs.front(),
                                                        stores.front().committed_step()));
    stores.push_back(std::move(store));
  }
  return stores;
}

// A frozen unit's weights (LoRA's base): its P tensor, in the dtype the store records for it —
// fp32 copied, bf16 widened. A quantised base (int8, NF4) is not read here yet.
Status read_frozen(std::vector<memory::Store>& stores, const Unit& unit, float* master,
                   const kernels::quant::UnitLayout* quantized, std::vector<std::byte>& staging) {
  const std::string name = params_name(unit);
  memory::Store* holder = nullptr;
  std::optional<memory::TensorRecord> record;
  for (memory::Store& store : stores)
    if (auto found = store.find(name); found.has_value()) {
      holder = &store;
      record = std::move(found);
    }
  if (holder == nullptr)
    return make_error(ErrorKind::corrupt, fmt::format("store {} has no tensor '{}' (the frozen base's weights)",
                                                      stores.front().dir(), name));
  const uint64_t n = unit.element_count;
  if (quantized != nullptr && record->size_bytes == quantized->size_bytes) {
    // 64-byte aligned for the dequantiser: a std::vector<std::byte> is only new's alignment.
    staging.resize(quantized->size_bytes + 64);
    auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(staging.data()) + 63) & ~uintptr_t{63});
    STRATA_RETURN_IF_ERROR(read_tensor(*holder, name, aligned, quantized->size_bytes));
    kernels::quant::dequantize_unit(*quantized, aligned, master);
    return Status();
  }
  if (record->dtype == DType::f32 && record->size_bytes == n * 4) return read_tensor(*holder, name, master, n * 4);
  if (record->dtype == DType::bf16 && record->size_bytes == n * 2) {
    // The 16-bit values land in the upper half of `master`, then widen front to back (float i
    // is written after the bits it overlaps have been read).
    auto* bits = reinterpret_cast<uint16_t*>(master + n) - n;
    STRATA_RETURN_IF_ERROR(read_tensor(*holder, name, bits, n * 2));
    for (uint64_t i = 0; i < n; ++i) master[i] = kernels::bf16_bits_to_fp32(bits[i]);
    return Status();
  }
  return make_error(ErrorKind::corrupt,
                    fmt::format("store {}: tensor '{}' is {} bytes for {} elements, which is neither fp32, bf16 nor the "
                                "quantised layout the store's adapter.base_dtype gives",
                                holder->dir(), name, record->size_bytes, n));
}

// Reads the fp32 master weights of one unit — where the state layout keeps them in each
// optimizer chunk — into `master` (the unit's element count of floats). A ZeRO job's chunks are
// spread over its ranks' stores (train/zero/zero.h): each is read from whichever store holds it.
Status read_master(std::vector<memory::Store>& stores, const optim::StateLayout& state, const Unit& unit,
                   uint64_t chunk_elements, float* master, std::vector<std::byte>& staging,
                   const kernels::quant::UnitLayout* quantized) {
  if (unit.frozen) return read_frozen(stores, unit, master, quantized, staging);  // no optimizer chunks: P is the weights
  const std::vector<ElementRange> chunks = optim_chunks(unit, chunk_elements, state);
  const std::vector<optim::TensorSpan> spans = optim_spans(unit);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const uint64_t count = chunks[c].element_count;
    const uint64_t chunk_bytes = state.chunk_bytes(spans, chunks[c].begin_elements, count);
    staging.resize(std::max<size_t>(staging.size(), chunk_bytes));
    const std::string name = optim_name(unit, c, chunks.size());
    memory::Store* holder = &stores.front();
    for (memory::Store& store : stores)
      if (store.find(name).has_value()) holder = &store;
    STRATA_RETURN_IF_ERROR(read_tensor(*holder, name, staging.data(), chunk_bytes));
    const float* chunk_master = state.master(staging.data());
    std::copy(chunk_master, chunk_master + count, master + chunks[c].begin_elements);
  }
  return Status();
}

namespace {

// The tokenizer the run's metadata names, if it still exists (said on the log when it is gone).
std::optional<std::string> run_tokenizer(const memory::Store& store, const std::string& out_path) {
  auto tokenizer = store.committed_metadata().find("tokenizer");
  if (tokenizer == store.committed_metadata().end()) return std::nullopt;
  if (std::error_code error; std::filesystem::exists(tokenizer->second, error)) return tokenizer->second;
  spdlog::warn("the run's tokenizer {} is gone; {} is exported without one", tokenizer->second, out_path);
  return std::nullopt;
}

// The base's weights under their Hugging Face names (a file or a folder); `merged`: each block's
// adapters folded in (models/lora_fold.h).
Status export_hf(std::vector<memory::Store>& stores, const std::string& store_dir, const ModelConfig& model,
                 const std::string& out_path, uint64_t shard_size_bytes, bool merged) {
  memory::Store& store = stores.front();
  ModelLayout layout(model);
  // The base's tensors in the layout's order, which is the order they are read from the store
  // (an adapter store's adapter units follow the base's and are not exported here).
  std::vector<hf::TensorSpec> tensors;
  for (const Unit& unit : layout.units())
    if (unit.adapter_block < 0)
      for (const UnitTensor& tensor : unit.tensors) tensors.push_back(hf::tensor_spec(model, tensor.name, tensor.shape));
  std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                 {"strata_step", std::to_string(store.committed_step())}};
  if (merged) metadata["strata_merged_adapter"] = fmt::format("lora r={} scale={}", model.adapter.rank, model.adapter.scale());
  // A path ending in .safetensors is one file, as before; any other is a Hugging Face folder.
  const bool one_file = out_path.size() >= 12 && out_path.compare(out_path.size() - 12, 12, ".safetensors") == 0;
  std::optional<SafetensorsWriter> file_writer;
  std::optional<hf::FolderWriter> folder_writer;
  if (one_file) {
    std::vector<SafetensorsWriter::TensorSpec> specs;
    for (const hf::TensorSpec& tensor : tensors) specs.push_back({tensor.name, DType::f32, tensor.shape});
    STRATA_ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::create(out_path, specs, metadata));
    file_writer.emplace(std::move(writer));
  } else {
    STRATA_ASSIGN_OR_RETURN(hf::FolderWriter writer,
                            hf::FolderWriter::create(out_path, model, tensors, shard_size_bytes, metadata));
    folder_writer.emplace(std::move(writer));
  }
  STRATA_ASSIGN_OR_RETURN(const uint64_t chunk_elements, optim_chunk_elements_of(store.committed_metadata(), store_dir));
  STRATA_ASSIGN_OR_RETURN(const optim::StateLayout state, optim_state_of(store.committed_metadata(), store_dir));
  std::vector<float> master(layout.largest_unit_elements());
  std::vector<float> adapter(merged ? layout.largest_unit_elements() : 0);
  std::vector<std::byte> staging;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Unit& unit = layout.units()[u];
    if (unit.adapter_block >= 0) continue;
    STRATA_RETURN_IF_ERROR(
        read_master(stores, state, unit, chunk_elements, master.data(), staging, layout.quant_layout(u)));
    if (merged && unit.block_index >= 0) {
      const Unit& adapter_unit = layout.units()[layout.adapter_unit(unit.block_index)];
      STRATA_RETURN_IF_ERROR(read_master(stores, state, adapter_unit, chunk_elements, adapter.data(), staging));
      models::fold_block_adapters(layout, model.adapter, unit.block_index, adapter.data(), master.data());
    }
    for (const UnitTensor& tensor : unit.tensors) {
      const float* values = master.data() + tensor.offset_elements;
      if (file_writer) STRATA_RETURN_IF_ERROR(file_writer->write_next(values, tensor.element_count * 4));
      else STRATA_RETURN_IF_ERROR(folder_writer->write_next(values));
    }
  }
  if (folder_writer)
    if (std::optional<std::string> tokenizer = run_tokenizer(store, out_path))
      STRATA_RETURN_IF_ERROR(folder_writer->copy_tokenizer(*tokenizer));
  if (file_writer) STRATA_RETURN_IF_ERROR(file_writer->finish());
  else STRATA_RETURN_IF_ERROR(folder_writer->finish());
  spdlog::info("exported {} tensors of step {}{} to {}{}", tensors.size(), store.committed_step(),
               merged ? " with the adapters merged" : "", out_path,
               folder_writer ? fmt::format(" (a Hugging Face folder, {} shard{})", folder_writer->shard_count(),
                                           folder_writer->shard_count() == 1 ? "" : "s")
                             : std::string());
  return Status();
}

// An adapter store's adapters as a PEFT folder (models/hf/peft.h).
Status export_peft(std::vector<memory::Store>& stores, const std::string& store_dir, const ModelConfig& model,
                   const std::string& out_path) {
  memory::Store& store = stores.front();
  if (out_path.ends_with(".safetensors"))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: an adapter store exports a PEFT adapter folder (adapter_config.json and "
                                  "adapter_model.safetensors): give a folder path; --export-merged writes the base "
                                  "with the adapters folded in",
                                  out_path));
  ModelLayout layout(model);
  std::vector<hf::PeftFolderWriter::Tensor> tensors;
  for (const Unit& unit : layout.units())
    if (unit.adapter_block >= 0)
      for (const UnitTensor& tensor : unit.tensors) tensors.push_back({tensor.name, tensor.shape});
  auto base = store.committed_metadata().find("adapter.base_model");
  const std::string base_model = base == store.committed_metadata().end() ? std::string() : base->second;
  STRATA_ASSIGN_OR_RETURN(hf::PeftFolderWriter writer,
                          hf::PeftFolderWriter::create(out_path, model, base_model, tensors,
                                                       {{"strata_step", std::to_string(store.committed_step())}}));
  STRATA_ASSIGN_OR_RETURN(const uint64_t chunk_elements, optim_chunk_elements_of(store.committed_metadata(), store_dir));
  STRATA_ASSIGN_OR_RETURN(const optim::StateLayout state, optim_state_of(store.committed_metadata(), store_dir));
  std::vector<float> master(layout.largest_unit_elements());
  std::vector<std::byte> staging;
  for (const Unit& unit : layout.units()) {
    if (unit.adapter_block < 0) continue;
    // The adapters' fp32 master weights (the optimizer's), not their compute copies.
    STRATA_RETURN_IF_ERROR(read_master(stores, state, unit, chunk_elements, master.data(), staging));
    for (const UnitTensor& tensor : unit.tensors)
      STRATA_RETURN_IF_ERROR(writer.write_next(master.data() + tensor.offset_elements, tensor.element_count));
  }
  if (std::optional<std::string> tokenizer = run_tokenizer(store, out_path))
    STRATA_RETURN_IF_ERROR(writer.copy_tokenizer(*tokenizer));
  STRATA_RETURN_IF_ERROR(writer.finish());
  spdlog::info("exported the LoRA adapters of step {} ({} tensors) to {} (a PEFT adapter folder)",
               store.committed_step(), tensors.size(), out_path);
  return Status();
}

}  // namespace

Status export_store_weights(const std::string& store_dir, const std::string& out_path, uint64_t shard_size_bytes) {
  return export_store_weights(std::vector<std::string>{store_dir}, out_path, shard_size_bytes);
}

Status export_store_weights(const std::vector<std::string>& store_dirs, const std::string& out_path,
                            uint64_t shard_size_bytes) {
  STRATA_ASSIGN_OR_RETURN(std::vector<memory::Store> stores, open_store_set(store_dirs));
  STRATA_ASSIGN_OR_RETURN(ModelConfig model, model_from_metadata(stores.front().committed_metadata(), store_dirs.front()));
  if (model.adapter.enabled) return export_peft(stores, store_dirs.front(), model, out_path);
  return export_hf(stores, store_dirs.front(), model, out_path, shard_size_bytes, /*merged=*/false);
}

Status export_merged_weights(const std::vector<std::string>& store_dirs, const std::string& out_path,
                             uint64_t shard_size_bytes) {
  STRATA_ASSIGN_OR_RETURN(std::vector<memory::Store> stores, open_store_set(store_dirs));
  STRATA_ASSIGN_OR_RETURN(ModelConfig model, model_from_metadata(stores.front().committed_metadata(), store_dirs.front()));
  if (!model.adapter.enabled)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("store {} has no adapters to merge (no adapter: in its run); --export writes its "
                                  "weights",
                                  store_dirs.front()));
  return export_hf(stores, store_dirs.front(), model, out_path, shard_size_bytes, /*merged=*/true);
}

}  // namespace strata
