// strata/run/run_store.h — what a run's NVMe store is: where it lives, how it is opened, what a
// commit records, how a committed store is read back (its model, its optimizer layout, its
// master weights) and exported. The one authority for these facts: the trainer (train/), the
// re-slice (train/zero/zero_reslice.h), generation (generate/) and the CLI (apps/cli/store.cpp)
// ask here, so none of them depends on another to learn what a store is.
//
// Names. Rank r's store is the folder `store` inside the first nvme path with `{rank}` = r; its
// data files are `strata.data` in every nvme path (outside the folder; store_options_for lists
// them so a manifest naming any other outside path is refused, memory/store.h).
//
// Commit metadata (commit_metadata): the model's shape keys (models/model.h store_metadata),
// `format` (kRunFormat for a training run; kWeightsOnlyFormat for weights staged for generation
// only: compute copies, no optimizer state — `strata train` refuses such a store), `step`,
// `parallel.ranks` (how the optimizer chunks are split, train/zero/zero.h), `precision`,
// `optim_chunk_elements`, `optim_state` (optim/state.h) and, when the run has one, `tokenizer`
// (the path an exported Hugging Face folder copies its tokenizer from); an adapter run over a
// checkpoint also `adapter.base_model` (its model.init, a PEFT export's base_model_name_or_path).
//
// Metadata read back from a manifest is untrusted input: every reader here parses numbers whole,
// bounds them, and names the key and the store folder when one is bad.
//
// Threads: free functions; each opens what it needs and closes it before returning, except
// open_store_set, whose stores the caller owns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "memory/store.h"
#include "kernels/quant/quant.h"
#include "models/model_layout.h"
#include "optim/state.h"
#include "run/train_config.h"
#include "run/train_plan.h"

namespace strata {

using StoreMetadata = std::map<std::string, std::string>;

inline constexpr const char* kRunFormat = "strata-train-1";            // a training run's commits
inline constexpr const char* kWeightsOnlyFormat = "strata-weights-1";  // weights staged for generation
inline constexpr const char* kStoreFolder = "store";                   // inside the first nvme path

// `path` with every "{rank}" replaced by the rank's number (nvme.paths of a ZeRO job).
std::string expand_rank(const std::string& path, int rank);
// Rank `rank`'s store folder (a single-process run is rank 0).
std::string store_dir_for(const TrainConfig& config, int rank = 0);
// The options every store of a run is opened and created with (the config's io: and
// nvme.verify_reads; its data files as the only outside paths).
memory::StoreOptions store_options_for(const TrainConfig& config);
// The size a training store is created with for `run`: every store tensor twice (the committed
// version and the one being written) plus slack for alignment and holes. Shared by the
// trainer's fresh store and the re-sliced one (train/zero/zero_reslice.h).
uint64_t training_store_capacity_bytes(const TrainPlan& run);
// Removes what a run that never committed left behind (a store folder without a committed step,
// data files) so a fresh store can be created in its place.
[[nodiscard]] Status discard_uncommitted_store(const TrainConfig& config);

// The metadata a training run's commit at `step` records (see the contract above).
StoreMetadata commit_metadata(const TrainConfig& config, uint64_t step, int ranks = 1);
// The optimizer chunk size a store was written with (stores from before chunks: one chunk per
// unit of any size, which is what the largest uint64_t describes).
[[nodiscard]] Result<uint64_t> optim_chunk_elements_of(const StoreMetadata& metadata, const std::string& dir);
// The optimizer state layout a store was written with (stores from before the seam: adamw).
[[nodiscard]] Result<optim::StateLayout> optim_state_of(const StoreMetadata& metadata, const std::string& dir);
// The model a training run's committed metadata describes (held to the same bounds as a
// config's model: section); anything but kRunFormat is refused as "no committed training run".
[[nodiscard]] Result<ModelConfig> model_from_metadata(const StoreMetadata& metadata, const std::string& dir);
// The same for a training run's store or staged weights (kWeightsOnlyFormat), for generation.
[[nodiscard]] Result<ModelConfig> committed_model(const StoreMetadata& metadata, const std::string& dir);

// One store transfer, waited for.
[[nodiscard]] Status write_tensor(memory::Store& store, const std::string& name, DType dtype,
                                  std::span<const int64_t> shape, const void* data, uint64_t size_bytes);
[[nodiscard]] Status read_tensor(memory::Store& store, const std::string& name, void* data, uint64_t size_bytes);

// Opens every store of a run read-only; they must all be at the same committed step (a ZeRO
// commit is global: docs/parallel.md).
[[nodiscard]] Result<std::vector<memory::Store>> open_store_set(const std::vector<std::string>& dirs);
// Reads the fp32 master weights of one unit — where the state layout keeps them in each
// optimizer chunk — into `master` (the unit's element count of floats). A frozen unit (LoRA's
// base) has no optimizer chunks: its weights are its P tensor, fp32 or bf16 as the store
// records it (widened), or quantised (`quantized`: ModelLayout::quant_layout of the unit) and
// dequantised here. A ZeRO job's chunks are spread over its ranks' stores (train/zero/zero.h):
// each is read from whichever store holds it. `staging` grows to the largest chunk's bytes.
[[nodiscard]] Status read_master(std::vector<memory::Store>& stores, const optim::StateLayout& state,
                                 const Unit& unit, uint64_t chunk_elements, float* master,
                                 std::vector<std::byte>& staging,
                                 const kernels::quant::UnitLayout* quantized = nullptr);

// Writes the committed fp32 master weights of the store in `store_dir` under the definition's
// Hugging Face names (GPT-2: without `transformer.`; Llama: HF's exactly, no `lm_head.weight`
// when tied): a path ending in `.safetensors` is one file; any other path a new Hugging Face
// folder (config.json and model.safetensors, or shards of at most `shard_size_bytes` and their
// index; models/hf/hf.h), with the run's tokenizer when its metadata names one that exists.
// An adapter store (LoRA, docs/lora.md) exports its adapters instead, as a new PEFT adapter
// folder (models/hf/peft.h: adapter_config.json, adapter_model.safetensors from the adapters'
// fp32 masters, the tokenizer; base_model_name_or_path the run's model.init, metadata
// `adapter.base_model`); a `.safetensors` path is refused for it.
[[nodiscard]] Status export_store_weights(const std::string& store_dir, const std::string& out_path,
                                          uint64_t shard_size_bytes = 5'000'000'000);
// The same from the stores of every rank of a ZeRO job (each optimizer chunk is in one of them).
[[nodiscard]] Status export_store_weights(const std::vector<std::string>& store_dirs, const std::string& out_path,
                                          uint64_t shard_size_bytes = 5'000'000'000);
// An adapter store's base with every block's adapters folded in (W + scale·B·A in fp32,
// models/lora_fold.h), written as export_store_weights writes a base: a Hugging Face folder or
// one .safetensors file. A store without adapters is refused.
[[nodiscard]] Status export_merged_weights(const std::vector<std::string>& store_dirs, const std::string& out_path,
                                           uint64_t shard_size_bytes = 5'000'000'000);

}  // namespace strata
