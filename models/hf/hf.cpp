#include "models/hf/hf.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "models/architectures.h"
#include "models/hf/hf_config.h"
#include "models/model_layout.h"
#include "kernels/optim/cast.h"

namespace strata::hf {

namespace fs = std::filesystem;
using Json = nlohmann::json;

Error refuse(const std::string& path, const std::string& what) {
  return make_error(ErrorKind::invalid_argument, fmt::format("{}: {}", path, what));
}

const nlohmann::json* ConfigKeys::find(const char* key) const {
  auto it = object_.find(key);
  return it == object_.end() || it->is_null() ? nullptr : &*it;
}

Error ConfigKeys::error(const char* key, const std::string& why) const {
  return refuse(path_, fmt::format("key '{}{}' {}", prefix_, key, why));
}

Result<uint32_t> ConfigKeys::integer(const char* key, std::optional<uint32_t> fallback, uint64_t min,
                                     uint64_t max) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) {
    if (fallback) return *fallback;
    return error(key, "is missing");
  }
  if (!value->is_number_unsigned()) return error(key, "is not a non-negative integer");
  const uint64_t number = value->get<uint64_t>();
  if (number < min || number > max) return error(key, fmt::format("is {}, outside [{}, {}]", number, min, max));
  return static_cast<uint32_t>(number);
}

Result<double> ConfigKeys::number(const char* key, std::optional<double> fallback, double min, double max) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) {
    if (fallback) return *fallback;
    return error(key, "is missing");
  }
  if (!value->is_number()) return error(key, "is not a number");
  const double number = value->get<double>();
  if (!(number >= min && number <= max)) return error(key, fmt::format("is {}, outside [{}, {}]", number, min, max));
  return number;
}

Result<bool> ConfigKeys::boolean(const char* key, bool fallback) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return error(key, "is not true or false");
  return value->get<bool>();
}

Result<std::string> ConfigKeys::string(const char* key, std::optional<std::string> fallback) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) {
    if (fallback) return *fallback;
    return error(key, "is missing");
  }
  if (!value->is_string()) return error(key, "is not a string");
  return value->get<std::string>();
}

namespace {

constexpr const char* kConfigName = "config.json";
constexpr const char* kSingleFileName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";
// config.json and the index are a few kB; a bigger one is not a model folder's.
constexpr uint64_t kMaxJsonBytes = 64ull << 20;

Result<std::string> read_text_file_bounded(const std::string& path) {
  std::error_code error;
  const uint64_t size_bytes = fs::file_size(path, error);
  if (error) return make_errno_error(error.value(), "open", path);
  if (size_bytes > kMaxJsonBytes) return refuse(path, fmt::format("{} bytes, more than a model folder's JSON holds", size_bytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_errno_error(errno, "open", path);
  std::string text(size_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size_bytes));
  if (in.gcount() != static_cast<std::streamsize>(size_bytes)) return make_errno_error(EIO, "read", path);
  return text;
}

// A weight_map file name must stay in the folder by its spelling: one path component.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos && name.size() <= 255 &&
         name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
}

// Whether `file` (in `folder`) resolves, through any symlinks, to a path inside the folder.
Result<bool> resolves_inside(const fs::path& folder, const fs::path& file) {
  std::error_code error;
  const fs::path real_folder = fs::canonical(folder, error);
  if (error) return make_errno_error(error.value(), "open", folder.string());
  const fs::path real_file = fs::canonical(file, error);
  if (error) return make_errno_error(error.value(), "open", file.string());
  auto [folder_end, file_it] = std::mismatch(real_folder.begin(), real_folder.end(), real_file.begin(), real_file.end());
  return folder_end == real_folder.end() && file_it != real_file.end();
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace

uint64_t TensorSpec::element_count() const {
  uint64_t count = 1;
  for (int64_t dim : shape) count *= static_cast<uint64_t>(dim);
  return count;
}

TensorSpec tensor_spec(const ModelConfig& model, const std::string& name, const std::vector<int64_t>& shape) {
  TensorSpec spec{name, shape, name == "wpe.weight"};
  if (!model.fused_projections || shape.size() != 2) return spec;
  // Phi-3: q/k/v rows stacked in self_attn.qkv_proj (Phi3Attention slices its output in that
  // order), gate/up in mlp.gate_up_proj (Phi3MLP chunks gate first).
  const int64_t q_rows = int64_t{model.n_head} * model.head_size();
  const int64_t kv_rows = int64_t{model.kv_heads()} * model.head_size();
  const int64_t mlp_rows = model.intermediate_size;
  struct Part { const char* suffix; const char* fused; int64_t begin; int64_t total; };
  const Part parts[] = {{"self_attn.q_proj.weight", "self_attn.qkv_proj.weight", 0, q_rows + 2 * kv_rows},
                        {"self_attn.k_proj.weight", "self_attn.qkv_proj.weight", q_rows, q_rows + 2 * kv_rows},
                        {"self_attn.v_proj.weight", "self_attn.qkv_proj.weight", q_rows + kv_rows, q_rows + 2 * kv_rows},
                        {"mlp.gate_proj.weight", "mlp.gate_up_proj.weight", 0, 2 * mlp_rows},
                        {"mlp.up_proj.weight", "mlp.gate_up_proj.weight", mlp_rows, 2 * mlp_rows}};
  for (const Part& part : parts) {
    const std::string_view suffix = part.suffix;
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    spec.fused_name = name.substr(0, name.size() - suffix.size()) + part.fused;
    spec.fused_row_begin = part.begin;
    spec.fused_rows = part.total;
    break;
  }
  return spec;
}

std::vector<TensorSpec> model_tensors(const ModelConfig& model) {
  // The definition's list (models/model.h): one authority for every architecture.
  // The base's tensors alone: LoRA's adapters are never in a model checkpoint (a PEFT folder
  // holds them: models/hf/peft.h).
  std::vector<TensorSpec> out;
  ModelConfig base = model;
  base.adapter.enabled = false;
  const ModelLayout layout(base);
  for (const Unit& unit : layout.units())
    for (const UnitTensor& tensor : unit.tensors) out.push_back(tensor_spec(model, tensor.name, tensor.shape));
  return out;
}

Result<ModelConfig> parse_config_json(std::string_view text, const std::string& path) {
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return refuse(path, "is not valid JSON");
  if (!json.is_object()) return refuse(path, "is not a JSON object");
  const ConfigKeys keys(json, path);
  std::string model_type;
  HF_READ(model_type, keys.string("model_type", std::nullopt));
  std::vector<std::string_view> known;
  for (const models::Architecture& arch : models::architectures()) {
    for (std::string_view type : arch.hf_model_types)
      if (type == model_type) return arch.read_hf_config(keys, model_type);
    known.insert(known.end(), arch.hf_model_types.begin(), arch.hf_model_types.end());
  }
  const std::string_view last = known.back();
  known.pop_back();
  return keys.error("model_type", fmt::format("is '{}'; strata reads {} and {}", model_type, fmt::join(known, ", "), last));
}

Result<ModelConfig> read_config(const std::string& folder) {
  const std::string path = (fs::path(folder) / kConfigName).string();
  std::error_code error;
  if (!fs::is_regular_file(path, error))
    return refuse(folder, fmt::format("holds no {} (not a Hugging Face model folder)", kConfigName));
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file_bounded(path));
  return parse_config_json(text, path);
}

std::string config_json(const ModelConfig& m) {
  nlohmann::ordered_json json;
  models::architecture_of(m).write_hf_config(m, json);
  json["torch_dtype"] = "float32";
  return json.dump(2) + "\n";
}

Result<std::map<std::string, std::string>> parse_index_json(std::string_view text, const std::string& path) {
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return refuse(path, "is not valid JSON");
  if (!json.is_object()) return refuse(path, "is not a JSON object");
  auto map = json.find("weight_map");
  if (map == json.end() || !map->is_object()) return refuse(path, "key 'weight_map' is missing or not an object");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string()) return refuse(path, fmt::format("key 'weight_map.{}' is not a file name", name));
    const std::string file_name = file.get<std::string>();
    if (!plain_file_name(file_name))
      return refuse(path, fmt::format("key 'weight_map.{}' names '{}', not a .safetensors file in this folder", name,
                                      file_name));
    out.emplace(name, file_name);
  }
  if (out.empty()) return refuse(path, "key 'weight_map' lists no tensor");
  return out;
}

bool is_folder(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error);
}

// --- reading -------------------------------------------------------------------------------

Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Result<Checkpoint> Checkpoint::open(const std::string& path) {
  Checkpoint checkpoint;
  checkpoint.path_ = path;
  // A safetensors header that the reader refuses is the folder's fault: exit 2, naming the file.
  auto open_file = [&](const fs::path& file) -> Status {
    Result<SafetensorsReader> reader = SafetensorsReader::open(file.string());
    if (!reader.ok()) {
      Error error = reader.error();
      if (error.kind == ErrorKind::corrupt) error.kind = ErrorKind::invalid_argument;
      return error;
    }
    checkpoint.readers_.push_back(std::make_unique<SafetensorsReader>(std::move(*reader)));
    for (const auto& [name, entry] : checkpoint.readers_.back()->entries())
      checkpoint.file_of_.emplace(name, checkpoint.readers_.size() - 1);
    return Status();
  };
  if (!is_folder(path)) {
    STRATA_RETURN_IF_ERROR(open_file(path));
    return checkpoint;
  }
  const fs::path folder(path);
  std::error_code error;
  const fs::path index_path = folder / kIndexName;
  if (fs::exists(index_path, error)) {
    STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file_bounded(index_path.string()));
    STRATA_ASSIGN_OR_RETURN(auto weight_map, parse_index_json(text, index_path.string()));
    std::map<std::string, size_t> reader_of_file;
    for (const auto& [name, file] : weight_map) {
      if (reader_of_file.count(file) == 0) {
        const fs::path file_path = folder / file;
        Result<bool> inside = resolves_inside(folder, file_path);
        if (!inside.ok()) return refuse(index_path.string(), fmt::format("key 'weight_map.{}': {}", name,
                                                                          inside.error().to_string()));
        if (!*inside)
          return refuse(index_path.string(), fmt::format("key 'weight_map.{}': '{}' resolves outside the folder", name, file));
        const size_t before = checkpoint.readers_.size();
        STRATA_RETURN_IF_ERROR(open_file(file_path));
        reader_of_file.emplace(file, before);
      }
    }
    checkpoint.file_of_.clear();  // the weight map is the authority on which file holds what
    for (const auto& [name, file] : weight_map) {
      const size_t reader = reader_of_file.at(file);
      if (checkpoint.readers_[reader]->find(name) == nullptr)
        return refuse(index_path.string(), fmt::format("key 'weight_map.{}': {} holds no such tensor", name, file));
      checkpoint.file_of_.emplace(name, reader);
    }
    return checkpoint;
  }
  const fs::path single = folder / kSingleFileName;
  if (!fs::exists(single, error))
    return refuse(path, fmt::format("holds neither {} nor {}", kSingleFileName, kIndexName));
  Result<bool> inside = resolves_inside(folder, single);
  if (!inside.ok()) return inside.error();
  if (!*inside) return refuse(single.string(), "is a symlink that resolves outside the folder");
  STRATA_RETURN_IF_ERROR(open_file(single));
  return checkpoint;
}

Result<Checkpoint::Located> Checkpoint::locate(const TensorSpec& spec) const {
  if (!spec.fused_name.empty()) {
    auto it = file_of_.find(spec.fused_name);
    const std::vector<int64_t> fused_shape = {spec.fused_rows, spec.shape[1]};
    if (it == file_of_.end())
      return refuse(path_, fmt::format("tensor '{}' is missing (the model needs {}, which holds {})", spec.fused_name,
                                       shape_text(fused_shape), spec.name));
    const SafetensorsReader* reader = readers_[it->second].get();
    const SafetensorsEntry* entry = reader->find(spec.fused_name);
    if (entry->shape != fused_shape)
      return refuse(reader->path(), fmt::format("tensor '{}' has shape {}; the model (config.json) needs {}",
                                                spec.fused_name, shape_text(entry->shape), shape_text(fused_shape)));
    return Located{reader, entry};
  }
  std::string name = spec.name;
  auto it = file_of_.find(name);
  if (it == file_of_.end() && spec.name.rfind("model.", 0) != 0 && spec.name != "lm_head.weight") {
    name = "transformer." + spec.name;  // GPT-2 saved by GPT2LMHeadModel
    it = file_of_.find(name);
  }
  if (it == file_of_.end())
    return refuse(path_, fmt::format("tensor '{}' is missing (the model needs {})", spec.name, shape_text(spec.shape)));
  const SafetensorsReader* reader = readers_[it->second].get();
  const SafetensorsEntry* entry = reader->find(name);
  const bool same = entry->shape == spec.shape;
  const bool longer = spec.rows_may_exceed && entry->shape.size() == spec.shape.size() && !spec.shape.empty() &&
                      std::equal(spec.shape.begin() + 1, spec.shape.end(), entry->shape.begin() + 1) &&
                      entry->shape[0] >= spec.shape[0];
  if (!same && !longer)
    return refuse(reader->path(), fmt::format("tensor '{}' has shape {}; the model (config.json) needs {}", name,
                                              shape_text(entry->shape), shape_text(spec.shape)));
  return Located{reader, entry};
}

Status Checkpoint::check(const std::vector<TensorSpec>& tensors) const {
  for (const TensorSpec& spec : tensors) STRATA_RETURN_IF_ERROR(locate(spec).status());
  return Status();
}

Status Checkpoint::read_fp32(const TensorSpec& spec, float* out) const {
  STRATA_ASSIGN_OR_RETURN(Located found, locate(spec));
  // Only the first element_count elements (GPT-2's wpe may have more rows): read a prefix.
  SafetensorsEntry prefix = *found.entry;
  const uint64_t count = spec.element_count();
  // A fused tensor's part: its rows, a contiguous range of the row-major fused tensor.
  if (!spec.fused_name.empty())
    prefix.begin_bytes += static_cast<uint64_t>(spec.fused_row_begin) * static_cast<uint64_t>(spec.shape[1]) *
                          dtype_size_bytes(prefix.dtype);
  prefix.end_bytes = prefix.begin_bytes + count * dtype_size_bytes(prefix.dtype);
  prefix.shape = spec.shape;
  if (prefix.dtype == DType::f32) return found.reader->read(prefix, out);
  // Widen in place: the 16-bit values land in the upper half of `out`, then widen front to
  // back — each float written lies below the halves not yet read.
  auto* half = reinterpret_cast<uint16_t*>(out) + count;
  STRATA_RETURN_IF_ERROR(found.reader->read(prefix, half));
  constexpr uint64_t kPiece = 4096;  // pieces: a piece's output never overlaps its own input
  for (uint64_t begin = 0; begin < count; begin += kPiece) {
    const uint64_t n = std::min(kPiece, count - begin);
    uint16_t staging[kPiece];
    std::copy(half + begin, half + begin + n, staging);
    if (prefix.dtype == DType::bf16)
      kernels::cast_bf16_to_fp32(std::span<const uint16_t>(staging, n), std::span<float>(out + begin, n));
    else
      kernels::cast_fp16_to_fp32(std::span<const uint16_t>(staging, n), std::span<float>(out + begin, n));
  }
  return Status();
}

// --- writing -------------------------------------------------------------------------------

FolderWriter::FolderWriter(FolderWriter&& other) noexcept
    : folder_(std::move(other.folder_)),
      temp_folder_(std::move(other.temp_folder_)),
      model_(std::move(other.model_)),
      metadata_(std::move(other.metadata_)),
      inputs_(std::move(other.inputs_)),
      next_input_(other.next_input_),
      fused_parts_(std::move(other.fused_parts_)),
      shards_(std::move(other.shards_)),
      shard_names_(std::move(other.shard_names_)),
      writer_(std::move(other.writer_)),
      shard_index_(other.shard_index_),
      next_in_shard_(other.next_in_shard_),
      finished_(std::exchange(other.finished_, true)) {}

FolderWriter& FolderWriter::operator=(FolderWriter&& other) noexcept {
  if (this != &other) {
    this->~FolderWriter();
    new (this) FolderWriter(std::move(other));
  }
  return *this;
}

FolderWriter::~FolderWriter() {
  writer_.reset();
  if (!finished_ && !temp_folder_.empty()) {
    std::error_code ignored;
    fs::remove_all(temp_folder_, ignored);
  }
}

Result<FolderWriter> FolderWriter::create(const std::string& folder, const ModelConfig& model,
                                          const std::vector<TensorSpec>& tensors, uint64_t shard_size_bytes,
                                          const std::map<std::string, std::string>& metadata) {
  FolderWriter writer;
  writer.folder_ = fs::path(folder).lexically_normal().string();
  while (writer.folder_.size() > 1 && writer.folder_.back() == '/') writer.folder_.pop_back();
  writer.model_ = model;
  writer.metadata_ = metadata;
  std::error_code error;
  if (fs::exists(writer.folder_, error))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: already exists; export writes a new Hugging Face folder, never over one",
                                  writer.folder_));
  // The tensors as written: the parts of a fused tensor (declared next to each other) as one.
  writer.inputs_ = tensors;
  std::vector<TensorSpec> outputs;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorSpec& spec = tensors[k];
    if (spec.fused_name.empty()) {
      outputs.push_back(spec);
      continue;
    }
    if (k > 0 && tensors[k - 1].fused_name == spec.fused_name) continue;
    int64_t rows = 0;
    for (size_t j = k; j < tensors.size() && tensors[j].fused_name == spec.fused_name; ++j) {
      if (tensors[j].fused_row_begin != rows)
        return make_error(ErrorKind::internal, fmt::format("{}: the parts of '{}' are not declared in order",
                                                           writer.folder_, spec.fused_name));
      rows += tensors[j].shape[0];
    }
    if (rows != spec.fused_rows)
      return make_error(ErrorKind::internal, fmt::format("{}: the parts of '{}' hold {} of its {} rows", writer.folder_,
                                                         spec.fused_name, rows, spec.fused_rows));
    outputs.push_back(TensorSpec{spec.fused_name, {spec.fused_rows, spec.shape[1]}});
  }
  // Shards as save_pretrained cuts them: tensors in order, a new shard when the next tensor
  // would take this one past the limit (a tensor bigger than the limit gets a shard alone).
  std::vector<TensorSpec> current;
  uint64_t current_bytes = 0;
  for (const TensorSpec& spec : outputs) {
    const uint64_t bytes = spec.element_count() * 4;
    if (!current.empty() && current_bytes + bytes > shard_size_bytes) {
      writer.shards_.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(spec);
    current_bytes += bytes;
  }
  writer.shards_.push_back(std::move(current));
  const size_t n = writer.shards_.size();
  for (size_t k = 0; k < n; ++k)
    writer.shard_names_.push_back(n == 1 ? std::string(kSingleFileName)
                                         : fmt::format("model-{:05}-of-{:05}.safetensors", k + 1, n));
  writer.temp_folder_ = writer.folder_ + ".tmp";
  fs::remove_all(writer.temp_folder_, error);  // a previous failed export's leftovers
  if (!fs::create_directory(writer.temp_folder_, error) || error)
    return make_errno_error(error ? error.value() : EEXIST, "mkdir", writer.temp_folder_);
  STRATA_RETURN_IF_ERROR(writer.open_shard(0));
  return writer;
}

Status FolderWriter::open_shard(size_t shard) {
  std::vector<SafetensorsWriter::TensorSpec> specs;
  for (const TensorSpec& spec : shards_[shard]) specs.push_back({spec.name, DType::f32, spec.shape});
  std::map<std::string, std::string> metadata = metadata_;
  metadata["format"] = "pt";  // what transformers' loader asks of a safetensors file
  STRATA_ASSIGN_OR_RETURN(SafetensorsWriter writer,
                          SafetensorsWriter::create((fs::path(temp_folder_) / shard_names_[shard]).string(), specs, metadata));
  writer_ = std::make_unique<SafetensorsWriter>(std::move(writer));
  shard_index_ = shard;
  next_in_shard_ = 0;
  return Status();
}

Status FolderWriter::write_next(const float* values) {
  assert(next_input_ < inputs_.size());
  const TensorSpec& spec = inputs_[next_input_++];
  if (spec.fused_name.empty()) return write_output(values);
  fused_parts_.insert(fused_parts_.end(), values, values + spec.element_count());
  if (next_input_ < inputs_.size() && inputs_[next_input_].fused_name == spec.fused_name) return Status();
  Status written = write_output(fused_parts_.data());
  fused_parts_.clear();
  return written;
}

Status FolderWriter::write_output(const float* values) {
  if (next_in_shard_ == shards_[shard_index_].size()) {
    STRATA_RETURN_IF_ERROR(writer_->finish());
    STRATA_RETURN_IF_ERROR(open_shard(shard_index_ + 1));
  }
  const TensorSpec& spec = shards_[shard_index_][next_in_shard_];
  STRATA_RETURN_IF_ERROR(writer_->write_next(values, spec.element_count() * 4));
  ++next_in_shard_;
  return Status();
}

Result<std::string> read_small_text_file(const std::string& path) { return read_text_file_bounded(path); }

Status publish_folder(const std::string& temp_folder, const std::string& folder) {
  const int dir_fd = ::open(temp_folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
  if (::rename(temp_folder.c_str(), folder.c_str()) != 0) return make_errno_error(errno, "rename", folder);
  return Status();
}

Status write_small_file(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_errno_error(errno, "create", path.string());
  const char* cursor = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t put = ::write(fd, cursor, left);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) {
      const int saved = errno;
      ::close(fd);
      return make_errno_error(saved, "write", path.string());
    }
    cursor += put;
    left -= static_cast<size_t>(put);
  }
  if (::fsync(fd) != 0) {
    const int saved = errno;
    ::close(fd);
    return make_errno_error(saved, "fsync", path.string());
  }
  ::close(fd);
  return Status();
}

Status copy_tokenizer_files(const std::string& path, const std::string& into_folder, const std::string& final_folder) {
  std::error_code error;
  std::vector<std::pair<fs::path, std::string>> files;  // source, name in the folder
  if (fs::is_directory(path, error)) {
    for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"})
      if (fs::is_regular_file(fs::path(path) / name, error)) files.emplace_back(fs::path(path) / name, name);
  } else {
    files.emplace_back(path, fs::path(path).extension() == ".json" ? "tokenizer.json" : "tokenizer.model");
  }
  for (const auto& [source, name] : files) {
    fs::copy_file(source, fs::path(into_folder) / name, fs::copy_options::overwrite_existing, error);
    if (error)
      return make_error(ErrorKind::io, fmt::format("copying the tokenizer {} into {}: {}", source.string(), final_folder,
                                                   error.message()));
  }
  return Status();
}

Status FolderWriter::copy_tokenizer(const std::string& path) { return copy_tokenizer_files(path, temp_folder_, folder_); }

Status FolderWriter::finish() {
  STRATA_RETURN_IF_ERROR(writer_->finish());
  writer_.reset();
  const fs::path temp(temp_folder_);
  if (shards_.size() > 1) {
    nlohmann::ordered_json index;
    uint64_t total_bytes = 0;
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    for (size_t k = 0; k < shards_.size(); ++k)
      for (const TensorSpec& spec : shards_[k]) {
        map[spec.name] = shard_names_[k];
        total_bytes += spec.element_count() * 4;
      }
    index["metadata"] = {{"total_size", total_bytes}};
    index["weight_map"] = std::move(map);
    STRATA_RETURN_IF_ERROR(write_small_file(temp / kIndexName, index.dump(2) + "\n"));
  }
  STRATA_RETURN_IF_ERROR(write_small_file(temp / kConfigName, config_json(model_)));
  STRATA_RETURN_IF_ERROR(publish_folder(temp_folder_, folder_));
  finished_ = true;
  return Status();
}

}  // namespace strata::hf
