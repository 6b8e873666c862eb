// strata/models/hf/hf.h — Hugging Face model folders in and out.
//
// In: a folder as `save_pretrained` writes it — `config.json`, and either `model.safetensors`
// or shards listed by `model.safetensors.index.json` (its `weight_map`: tensor → file). The
// folder is untrusted input. Every refusal is one error of kind invalid_argument (the CLI's
// exit 2) whose text names the file and the key or tensor:
// - config.json: malformed JSON, a key of the wrong type or out of strata's range, or a
//   feature strata's definitions do not compute (MLP biases, a sliding window, a rope type
//   other than llama3, hidden_act other than silu). model_type llama, mistral and qwen2 are
//   the Llama definition: qwen2 with q/k/v biases (always, as Qwen2Attention), llama with
//   `attention_bias: true` with biases on q/k/v and o_proj (as LlamaAttention). model_type
//   gemma is the Gemma definition (GemmaConfig's defaults: head_dim 256; the tanh GELU named by
//   hidden_activation or hidden_act; no biases, no rope scaling).
//   Which architecture a model_type is, and its keys both ways, are models/architectures.h's row
//   and its mapping file (models/hf/hf_config.h: gpt2_config.cpp, llama_config.cpp, …).
// - the index: a file name that leaves the folder (absolute, `..`, a separator, a symlink
//   whose target lies outside the folder), a tensor that its shard does not hold.
// - a tensor: missing, of another shape than the config implies, of a dtype other than
//   F32 / BF16 / F16, or with data offsets outside its file (models/safetensors.h checks those).
// Reading widens bf16 / fp16 to fp32 exactly; fp32 is copied bit for bit. Nothing is mapped:
// one tensor is read at a time (pread), so a checkpoint is never loaded whole.
//
// Names: strata's tensor names are Hugging Face's. GPT-2 is accepted with or without the
// `transformer.` prefix (GPT-2's own repository has none; GPT2LMHeadModel.save_pretrained
// writes it). GPT-2's position table may hold more rows (n_positions) than the run's seq_len:
// the first seq_len rows are read, which is exact for every window a run computes.
//
// Out: `FolderWriter` writes config.json (model_type, torch_dtype float32, every shape key;
// a Llama with q/k/v biases and none on o_proj is written as qwen2, the model transformers
// builds with exactly those biases; a Gemma as gemma, GemmaForCausalLM),
// and model.safetensors — or, above `shard_size_bytes`, `model-0000k-of-0000n.safetensors`
// plus `model.safetensors.index.json` — into a temporary sibling folder, fsyncs, and renames
// it into place: a failed export leaves nothing under the final name. An existing folder at
// the final path is refused, never overwritten.
//
// The tensor list: `model_tensors(model)` is the (name, shape) list a model needs, in Hugging
// Face's order: its definition's (models/model_layout.h), the base's tensors alone. Reading and
// writing work from the list alone.
//
// Threads: none of its own; one Checkpoint or FolderWriter per thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "models/safetensors.h"
#include "run/train_config.h"

namespace strata::hf {

// One tensor a model needs, as a Hugging Face checkpoint names and shapes it.
struct TensorSpec {
  TensorSpec() = default;
  TensorSpec(std::string name_, std::vector<int64_t> shape_, bool rows_may_exceed_ = false)
      : name(std::move(name_)), shape(std::move(shape_)), rows_may_exceed(rows_may_exceed_) {}
  std::string name;
  std::vector<int64_t> shape;
  // GPT-2's wpe: a checkpoint may hold more rows than shape[0]; the first shape[0] are read.
  bool rows_may_exceed = false;
  // Phi-3 (ModelConfig::fused_projections): the checkpoint holds this tensor as rows
  // [fused_row_begin, fused_row_begin + shape[0]) of `fused_name`, shaped [fused_rows, shape[1]]
  // (q, k, v stacked in qkv_proj; gate, up in gate_up_proj). Empty: stored under `name`.
  std::string fused_name;
  int64_t fused_row_begin = 0;
  int64_t fused_rows = 0;
  uint64_t element_count() const;
};

// One of the model's tensors (strata's name and shape, which are Hugging Face's Llama / GPT-2
// names) as `model`'s checkpoints store it: the one place a checkpoint layout is decided.
TensorSpec tensor_spec(const ModelConfig& model, const std::string& name, const std::vector<int64_t>& shape);

// The tensors `model` needs (arch gpt2, llama or gemma), in Hugging Face's order: the base's alone with an
// adapter (LoRA adapters are never in a model checkpoint; a PEFT folder holds them, peft.h).
std::vector<TensorSpec> model_tensors(const ModelConfig& model);

// config.json → ModelConfig (arch, shape; init stays "random", seq_len is the model's context:
// n_positions or max_position_embeddings, capped at 65,536). `path` names the file in errors.
[[nodiscard]] Result<ModelConfig> parse_config_json(std::string_view text, const std::string& path);
[[nodiscard]] Result<ModelConfig> read_config(const std::string& folder);
// The config.json strata writes for `model` (model_type, torch_dtype float32, every shape key).
std::string config_json(const ModelConfig& model);

// model.safetensors.index.json → tensor name → shard file name (relative to the folder). Checks
// the JSON and that every file name stays in the folder by its spelling (one path component,
// not `.` or `..`, ending in .safetensors); Checkpoint::open also resolves symlinks.
[[nodiscard]] Result<std::map<std::string, std::string>> parse_index_json(std::string_view text,
                                                                          const std::string& path);

// Small-file helpers shared with the PEFT adapter folder (models/hf/peft.h): a JSON file read
// whole (at most 64 MiB, else refused naming it); a file written and fsynced; a tokenizer (a
// file, or a folder's tokenizer files, as FolderWriter::copy_tokenizer says) copied into
// `into_folder`, errors naming `final_folder` (the name the user asked for).
[[nodiscard]] Result<std::string> read_small_text_file(const std::string& path);
[[nodiscard]] Status write_small_file(const std::filesystem::path& path, const std::string& text);
// Makes a folder written under a temporary name durable and visible at once: fsyncs it, then
// renames it to `folder` (the HF and PEFT writers' last step; a crash leaves the old state or
// the whole new folder, never half of one).
[[nodiscard]] Status publish_folder(const std::string& temp_folder, const std::string& folder);
[[nodiscard]] Status copy_tokenizer_files(const std::string& path, const std::string& into_folder,
                                         const std::string& final_folder);

// Whether `path` is a folder (an HF model folder, as `model.init` may name) rather than a file.
bool is_folder(const std::string& path);

// A checkpoint to read: an HF folder (single file or sharded) or one .safetensors file.
class Checkpoint {
 public:
  [[nodiscard]] static Result<Checkpoint> open(const std::string& path);
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  const std::string& path() const { return path_; }
  // Every tensor in `tensors` present, with its shape (GPT-2 names also with `transformer.`);
  // the first that is not is the error. Call before any work that writes.
  [[nodiscard]] Status check(const std::vector<TensorSpec>& tensors) const;
  // Reads one checked tensor as fp32 into `out` (spec.element_count() floats).
  [[nodiscard]] Status read_fp32(const TensorSpec& spec, float* out) const;

 private:
  Checkpoint() = default;
  struct Located {
    const SafetensorsReader* reader = nullptr;
    const SafetensorsEntry* entry = nullptr;
  };
  Result<Located> locate(const TensorSpec& spec) const;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;  // one per file
  std::map<std::string, size_t> file_of_;                    // tensor → readers_ index
};

// Writes an HF folder, tensors in declaration order (the order of `tensors`).
class FolderWriter {
 public:
  static constexpr uint64_t kDefaultShardSizeBytes = 5'000'000'000;  // save_pretrained's "5GB"
  [[nodiscard]] static Result<FolderWriter> create(const std::string& folder, const ModelConfig& model,
                                                   const std::vector<TensorSpec>& tensors,
                                                   uint64_t shard_size_bytes,
                                                   const std::map<std::string, std::string>& metadata);
  FolderWriter(FolderWriter&&) noexcept;
  FolderWriter& operator=(FolderWriter&&) noexcept;
  ~FolderWriter();  // an unfinished writer removes its temporary folder

  // The next declared tensor's fp32 values (spec.element_count() floats). The parts of a fused
  // tensor (TensorSpec::fused_name; declared next to each other) are gathered and written as
  // one tensor once its last part arrives.
  [[nodiscard]] Status write_next(const float* values);
  // The model's tokenizer beside its weights, so the folder samples text as is: `path` is a
  // tokenizer file (copied as tokenizer.json or tokenizer.model) or a folder (its tokenizer.json,
  // tokenizer.model, tokenizer_config.json and special_tokens_map.json, those present).
  [[nodiscard]] Status copy_tokenizer(const std::string& path);
  // After every tensor: the index and config.json, fsync, rename into place.
  [[nodiscard]] Status finish();
  size_t shard_count() const { return shards_.size(); }

 private:
  FolderWriter() = default;
  [[nodiscard]] Status open_shard(size_t shard);
  [[nodiscard]] Status write_output(const float* values);

  std::string folder_;
  std::string temp_folder_;
  ModelConfig model_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorSpec> inputs_;               // as declared (fused parts apart)
  size_t next_input_ = 0;
  std::vector<float> fused_parts_;               // the parts of a fused tensor so far
  std::vector<std::vector<TensorSpec>> shards_;  // tensors per shard, as written (fused whole)
  std::vector<std::string> shard_names_;
  std::unique_ptr<SafetensorsWriter> writer_;
  size_t shard_index_ = 0;
  size_t next_in_shard_ = 0;
  bool finished_ = false;
};

}  // namespace strata::hf
