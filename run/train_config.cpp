#include "run/train_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/listen_address.h"
#include "common/size.h"
#include "device/device.h"
#include "models/architectures.h"
#include "models/hf/hf.h"
#include "models/model.h"
#include "run/budgets.h"

namespace strata {

bool ModelConfig::decoder_keys() const {
  const models::Architecture* architecture = models::find_architecture(arch);
  return architecture != nullptr && architecture->decoder_keys;
}

static Result<Tier> parse_tier(ConfigNode& node, std::string_view key, Tier fallback) {
  STRATA_ASSIGN_OR_RETURN(std::string name, node.choice(key, {"device", "host", "nvme"}, tier_name(fallback)));
  return memory::parse_tier(name);
}

// Reads one key into a field, keeping the call sites to one line each.
#define STRATA_READ(field, expr)                         \
  do {                                                   \
    auto strata_read_ = (expr);                          \
    if (!strata_read_.ok()) return strata_read_.error(); \
    field = static_cast<decltype(field)>(*strata_read_); \
  } while (0)

const char* base_dtype_name(BaseDType dtype) {
  switch (dtype) {
    case BaseDType::fp32: return "fp32";
    case BaseDType::bf16: return "bf16";
    case BaseDType::int8: return "int8";
    case BaseDType::nf4: return "nf4";
  }
  return "";
}

double AdapterConfig::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

Result<TrainConfig> parse_train_config(ConfigNode root) {
  TrainConfig config;
  config.source_path = root.source_name();

  STRATA_ASSIGN_OR_RETURN(ConfigNode model, root.child("model", true));
  ModelConfig& m = config.model;
  // model.init may name a Hugging Face folder: its config.json is then the architecture and
  // shape, and a shape key also given here must agree with it (models/hf/hf.h).
  STRATA_READ(m.init, model.string("init", std::string("random")));
  std::optional<ModelConfig> folder;
  std::string folder_config;
  if (m.init != "random") {
    m.init = model.resolve_path(m.init);
    std::error_code exists_error;  // EACCES on a parent folder, ENAMETOOLONG...: also "cannot use it"
    if (!std::filesystem::exists(m.init, exists_error))
      return model.error_at("init", fmt::format("'{}' {}; use random, a GPT-2 .safetensors file or a Hugging Face "
                                                "model folder", m.init,
                                                exists_error ? "cannot be reached: " + exists_error.message()
                                                             : std::string("does not exist")));
    if (hf::is_folder(m.init)) {
      STRATA_ASSIGN_OR_RETURN(ModelConfig from_folder, hf::read_config(m.init));
      folder = from_folder;
      folder_config = (std::filesystem::path(m.init) / "config.json").string();
    }
  }
  if (folder) {
    // Every shape key the YAML gives is checked against config.json, naming both.
    auto agree = [&](std::string_view key, auto yaml_value, auto folder_value) -> Status {
      if (static_cast<double>(yaml_value) == static_cast<double>(folder_value)) return Status();
      return model.error_at(key, fmt::format("is {} but {} says {}", yaml_value, folder_config, folder_value));
    };
    const ModelConfig f = *folder;
    if (model.has("arch")) {
      STRATA_READ(m.arch, model.choice("arch", models::architecture_names(), std::nullopt));
      if (m.arch != f.arch)
        return model.error_at("arch", fmt::format("is {} but {} says {}", m.arch, folder_config, f.arch));
    }
    struct IntegerKey { const char* key; uint32_t ModelConfig::*field; int64_t min, max; };
    for (const IntegerKey& k : {IntegerKey{"n_layer", &ModelConfig::n_layer, 1, 1024},
                                IntegerKey{"n_head", &ModelConfig::n_head, 1, 1024},
                                IntegerKey{"n_embd", &ModelConfig::n_embd, 8, 65536},
                                IntegerKey{"vocab_size", &ModelConfig::vocab_size, 2, 1 << 20},
                                IntegerKey{"n_kv_head", &ModelConfig::n_kv_head, 0, 1024},
                                IntegerKey{"head_dim", &ModelConfig::head_dim, 0, 4096},
                                IntegerKey{"intermediate_size", &ModelConfig::intermediate_size, 1, 1 << 20}}) {
      if (!model.has(k.key)) continue;
      uint32_t value = 0;
      STRATA_READ(value, model.integer(k.key, std::nullopt, k.min, k.max));
      STRATA_RETURN_IF_ERROR(agree(k.key, value, f.*k.field));
    }
    for (const char* key : {"rope_theta", "norm_eps"}) {
      if (!model.has(key)) continue;
      double value = 0;
      STRATA_READ(value, model.number(key, std::nullopt, 0.0, 1.0e12));
      STRATA_RETURN_IF_ERROR(agree(key, value, std::string_view(key) == "rope_theta" ? f.rope_theta : f.norm_eps));
    }
    struct FlagKey { const char* key; bool ModelConfig::*field; };
    for (const FlagKey& k : {FlagKey{"tie_word_embeddings", &ModelConfig::tie_word_embeddings},
                             FlagKey{"qkv_bias", &ModelConfig::qkv_bias},
                             FlagKey{"o_proj_bias", &ModelConfig::o_proj_bias}}) {
      if (!model.has(k.key)) continue;
      bool value = false;
      STRATA_READ(value, model.boolean(k.key, std::nullopt));
      if (value != f.*k.field)
        return model.error_at(k.key, fmt::format("is {} but {} says {}", value, folder_config, f.*k.field));
    }
    if (model.has("rope_scaling"))
      return model.error_at("rope_scaling", fmt::format("comes from {} when model.init is a folder", folder_config));
    const std::string init = m.init;
    m = f;
    m.init = init;
    // seq_len: the window; at most the folder's context for GPT-2 (its learned positions).
    STRATA_READ(m.seq_len, model.integer("seq_len", f.seq_len, 1, 1 << 16));
    if (models::architecture_of(m).learned_positions && m.seq_len > f.seq_len)
      return model.error_at("seq_len", fmt::format("is {} but {} has {} positions (n_positions)", m.seq_len,
                                                   folder_config, f.seq_len));
    if (f.attention_window > 0 && m.seq_len > f.attention_window)
      return model.error_at("seq_len", fmt::format("is {} but {} has a sliding window of {} tokens; strata's attention "
                                                   "is full causal, the same only up to {} tokens", m.seq_len,
                                                   folder_config, f.attention_window, f.attention_window));
    STRATA_READ(m.seed, model.integer("seed", 1, 0, INT64_MAX));
    STRATA_READ(m.init_std, model.number("init_std", 0.02, 0.0, 1.0));
  } else {
    STRATA_READ(m.arch, model.choice("arch", models::architecture_names(), std::string("gpt2")));
    const models::Architecture& arch = models::architecture_of(m);
    STRATA_READ(m.n_layer, model.integer("n_layer", std::nullopt, 1, 1024));
    STRATA_READ(m.n_head, model.integer("n_head", std::nullopt, 1, 1024));
    STRATA_READ(m.n_embd, model.integer("n_embd", std::nullopt, 8, 65536));
    STRATA_READ(m.vocab_size, model.integer("vocab_size", std::nullopt, 2, 1 << 20));
    STRATA_READ(m.seq_len, model.integer("seq_len", std::nullopt, 1, 1 << 16));
    STRATA_READ(m.seed, model.integer("seed", 1, 0, INT64_MAX));
    STRATA_READ(m.init_std, model.number("init_std", 0.02, 0.0, 1.0));
    if (m.decoder_keys()) {
      STRATA_READ(m.n_kv_head, model.integer("n_kv_head", 0, 0, 1024));
      STRATA_READ(m.head_dim, model.integer("head_dim", 0, 0, 4096));
      STRATA_READ(m.intermediate_size, model.integer("intermediate_size", std::nullopt, 1, 1 << 20));
      STRATA_READ(m.rope_theta, model.number("rope_theta", 10000.0, 1.0, 1.0e12));
      // The HF config class's rms_norm_eps default (Gemma's 1e-6; Llama's YAML default stays 1e-5).
      STRATA_READ(m.norm_eps, model.number("norm_eps", arch.default_norm_eps, 0.0, 1.0));
      STRATA_READ(m.tie_word_embeddings, model.boolean("tie_word_embeddings", true));
      // A key the architecture's definition does not compute (Gemma 1's attention biases and
      // rope scaling) would be read and ignored, so it is refused by name.
      for (auto [key, computed, what] : {std::tuple{"qkv_bias", arch.attention_biases, "attention biases"},
                                         std::tuple{"o_proj_bias", arch.attention_biases, "attention biases"},
                                         std::tuple{"rope_scaling", arch.rope_scaling, "rope scaling"}})
        if (!computed && model.has(key))
          return model.error_at(key, fmt::format("is not a {} key ({} has no {})", arch.label, arch.label, what));
      STRATA_READ(m.qkv_bias, model.boolean("qkv_bias", false));
      STRATA_READ(m.o_proj_bias, model.boolean("o_proj_bias", false));
      if (m.o_proj_bias && !m.qkv_bias)
        return model.error_at("o_proj_bias",
                              "is true without model.qkv_bias (Hugging Face's attention_bias sets both)");
      if (model.has("rope_scaling")) {
        STRATA_ASSIGN_OR_RETURN(ConfigNode scaling, model.child("rope_scaling"));
        RopeScaling& r = m.rope_scaling;
        STRATA_READ(r.type, scaling.choice("type", {"llama3"}, std::nullopt));
        STRATA_READ(r.factor, scaling.number("factor", std::nullopt, 1.0, 1.0e6));
        STRATA_READ(r.low_freq_factor, scaling.number("low_freq_factor", 1.0, 1.0e-6, 1.0e6));
        STRATA_READ(r.high_freq_factor, scaling.number("high_freq_factor", 4.0, 1.0e-6, 1.0e6));
        STRATA_READ(r.original_max_position_embeddings,
                    scaling.integer("original_max_position_embeddings", 8192, 1, 1 << 24));
        STRATA_RETURN_IF_ERROR(scaling.finish());
        if (r.high_freq_factor <= r.low_freq_factor)
          return scaling.error_at("high_freq_factor", fmt::format("{} must exceed low_freq_factor = {}",
                                                                  r.high_freq_factor, r.low_freq_factor));
      }
    }
  }
  STRATA_RETURN_IF_ERROR(model.finish());
  if (!m.decoder_keys() && m.n_embd % m.n_head != 0)
    return model.error_at("n_embd", fmt::format("{} is not divisible by model.n_head = {}", m.n_embd, m.n_head));
  if (m.decoder_keys()) {
    if (m.n_kv_head != 0 && m.n_head % m.n_kv_head != 0)
      return model.error_at("n_kv_head", fmt::format("{} does not divide model.n_head = {}", m.n_kv_head, m.n_head));
    if (m.head_dim == 0 && m.n_embd % m.n_head != 0)
      return model.error_at("n_embd", fmt::format("{} is not divisible by model.n_head = {} (or give model.head_dim)",
                                                  m.n_embd, m.n_head));
    if (m.head_size() % 2 != 0)
      return model.error_at("head_dim", fmt::format("{} is odd; rotary embeddings rotate pairs", m.head_size()));
  }

  STRATA_ASSIGN_OR_RETURN(ConfigNode data, root.child("data", true));
  STRATA_READ(config.data_path, data.string("path", std::nullopt));
  config.data_path = data.resolve_path(config.data_path);
  STRATA_ASSIGN_OR_RETURN(std::string format,
                          data.choice("format", {"text-bytes", "tokens-u16", "tokens-u32", "text", "completion", "chat",
                                                 "examples"},
                                      "text-bytes"));
  config.data_format = format == "text-bytes"   ? DataFormat::text_bytes
                       : format == "tokens-u16" ? DataFormat::tokens_u16
                       : format == "tokens-u32" ? DataFormat::tokens_u32
                       : format == "text"       ? DataFormat::text
                       : format == "completion" ? DataFormat::completion
                       : format == "chat"       ? DataFormat::chat
                                                : DataFormat::examples;
  // data.tokenizer: the tokenizer that encodes a text corpus or JSONL examples at start-up
  // (docs/tokenizers.md, docs/data.md); `examples` files were tokenized by `strata tokenize`.
  const bool tokenizes = config.data_format == DataFormat::text || config.data_format == DataFormat::completion ||
                         config.data_format == DataFormat::chat;
  if (tokenizes) {
    STRATA_READ(config.data_tokenizer, data.string("tokenizer", std::nullopt));
    config.data_tokenizer = data.resolve_path(config.data_tokenizer);
  } else if (data.has("tokenizer")) {
    return data.error_at("tokenizer", fmt::format("is only read with format: text, completion or chat (the format is {})", format));
  }
  // The example keys mean nothing to a token stream: refused there rather than ignored.
  ExampleDataConfig& e = config.examples;
  if (is_example_format(config.data_format)) {
    if (config.data_format != DataFormat::examples) {
      STRATA_READ(e.train_on_input, data.boolean("train_on_input", false));
      STRATA_READ(e.skip_bad_lines, data.boolean("skip_bad_lines", false));
    }
    STRATA_READ(e.packing, data.boolean("packing", false));
    STRATA_READ(e.truncate, data.boolean("truncate", false));
  }
  for (const char* key : {"train_on_input", "skip_bad_lines", "packing", "truncate"})
    if (data.has(key) && !is_example_format(config.data_format))
      return data.error_at(key, fmt::format("is only read with format: completion, chat or examples (the format is {})", format));
  for (const char* key : {"train_on_input", "skip_bad_lines"})
    if (data.has(key) && config.data_format == DataFormat::examples)
      return data.error_at(key, "is applied when the examples are tokenized (strata tokenize), not with format: examples");
  STRATA_RETURN_IF_ERROR(data.finish());
  if (config.data_format == DataFormat::text_bytes && m.vocab_size < 256)
    return model.error_at("vocab_size", fmt::format("{} is too small for data.format text-bytes; use 256 or more", m.vocab_size));

  STRATA_READ(config.batch_size, root.integer("batch_size", 8, 1, 1 << 16));
  STRATA_READ(config.gradient_accumulation_steps, root.integer("gradient_accumulation_steps", 1, 1, 1 << 16));
  STRATA_READ(config.steps, root.integer("steps", 200, 0, INT64_MAX));
  STRATA_READ(config.epochs, root.integer("epochs", 0, 1, 1 << 20));
  if (root.has("epochs") && !is_example_format(config.data_format))
    return root.error_at("epochs", "counts passes over fine-tuning examples (data.format completion, chat or examples); "
                                   "give steps for a token stream");
  if (root.has("epochs") && root.has("steps"))
    return root.error_at("epochs", "and steps are two ways to say how long to train: give one");
  STRATA_READ(config.checkpoint_every, root.integer("checkpoint_every", 10, 1, INT64_MAX));

  // eval: held-out loss (train/trainer.h "Evaluation"); checkpoint: {keep_best}.
  config.eval.enabled = root.has("eval");
  STRATA_ASSIGN_OR_RETURN(ConfigNode eval, root.child("eval"));
  EvalConfig& ev = config.eval;
  STRATA_READ(ev.path, eval.string("path", std::string()));
  if (!ev.path.empty()) ev.path = eval.resolve_path(ev.path);
  STRATA_READ(ev.split, eval.number("split", 0.0, 0.0, 0.5));
  STRATA_READ(ev.every, eval.integer("every", 0, 1, INT64_MAX));
  STRATA_READ(ev.batches, eval.integer("batches", 0, 1, INT64_MAX));
  if (ev.enabled && ev.path.empty() == (ev.split == 0.0))
    return root.error_at("eval", ev.path.empty() ? "needs the held-out data: path: FILE, or split: a fraction of data.path "
                                                   "(0 < split <= 0.5)"
                                                 : "takes path or split, not both");
  STRATA_RETURN_IF_ERROR(eval.finish());
  if (ev.every == 0) ev.every = config.checkpoint_every;
  STRATA_ASSIGN_OR_RETURN(ConfigNode checkpoint, root.child("checkpoint"));
  STRATA_READ(ev.keep_best, checkpoint.boolean("keep_best", false));
  STRATA_RETURN_IF_ERROR(checkpoint.finish());
  if (ev.keep_best && !ev.enabled)
    return checkpoint.error_at("keep_best", "needs an eval: block (the best commit is the one with the lowest eval loss)");

  STRATA_ASSIGN_OR_RETURN(ConfigNode optimizer, root.child("optimizer"));
  OptimizerConfig& o = config.optimizer;
  STRATA_READ(o.lr, optimizer.number("lr", 3.0e-4, 0.0, 10.0));
  STRATA_ASSIGN_OR_RETURN(std::vector<double> betas, optimizer.number_list("betas", 2, std::vector<double>{0.9, 0.95}, 0.0, 0.999999999));
  o.beta1 = betas[0];
  o.beta2 = betas[1];
  STRATA_READ(o.eps, optimizer.number("eps", 1.0e-8, 0.0, 1.0));
  STRATA_READ(o.weight_decay, optimizer.number("weight_decay", 0.1, 0.0, 10.0));
  STRATA_READ(o.grad_clip, optimizer.number("grad_clip", 1.0, 0.0, 1.0e9));
  o.chunk_elements_set = optimizer.has("chunk_elements");
  STRATA_READ(o.chunk_elements, optimizer.integer("chunk_elements", int64_t{16} << 20, 1024, int64_t{1} << 40));
  STRATA_READ(o.interleave, optimizer.boolean("interleave", true));
  // The optimizer's kind and, for adamw8bit, bitsandbytes' rules (optim/state.h, docs/optim.md).
  STRATA_ASSIGN_OR_RETURN(std::string kind, optimizer.choice("kind", {"adamw", "adamw8bit"}, std::string("adamw")));
  o.kind = *optim::kind_named(kind);
  if (o.kind != optim::Kind::adamw8bit) {
    for (const char* key : {"block_size", "min_8bit_size", "embedding_state"})
      if (optimizer.has(key))
        return optimizer.error_at(key, "applies to 8-bit optimizer state only: set optimizer.kind: adamw8bit, or "
                                       "remove it");
  } else {
    optim::EightBitRules& rules = o.rules;
    int64_t block_size = 0;
    STRATA_READ(block_size, optimizer.integer("block_size", static_cast<int64_t>(kernels::kAdamW8bitBlockElements), 64,
                                              static_cast<int64_t>(kernels::kAdamW8bitMaxBlockElements)));
    if (!is_power_of_two(static_cast<uint64_t>(block_size)))
      return optimizer.error_at("block_size", fmt::format("is {}; it must be a power of two in [64, {}] (bitsandbytes "
                                                          "uses 256)",
                                                          block_size, kernels::kAdamW8bitMaxBlockElements));
    rules.block_elements = static_cast<uint32_t>(block_size);
    STRATA_READ(rules.min_8bit_elements,
                optimizer.integer("min_8bit_size", static_cast<int64_t>(kernels::kAdamW8bitMinElements), 0,
                                  int64_t{1} << 40));
    STRATA_ASSIGN_OR_RETURN(std::string embedding, optimizer.choice("embedding_state", {"8bit", "fp32"}, std::string("8bit")));
    rules.embedding_fp32 = embedding == "fp32";
    // A chunk cut inside an 8-bit tensor falls on one of its block boundaries (optim/state.h):
    // a chunk smaller than a block could not be cut at all.
    if (o.chunk_elements_set && o.chunk_elements < rules.block_elements)
      return optimizer.error_at("chunk_elements", fmt::format("is {}, smaller than optimizer.block_size {}: an 8-bit "
                                                              "chunk holds whole blocks",
                                                              o.chunk_elements, rules.block_elements));
  }
  STRATA_RETURN_IF_ERROR(optimizer.finish());

  // schedule: Hugging Face's warmup + constant / linear / cosine (train/lr_schedule.h).
  config.schedule.enabled = root.has("schedule");
  STRATA_ASSIGN_OR_RETURN(ConfigNode schedule, root.child("schedule"));
  ScheduleConfig& sc = config.schedule;
  STRATA_READ(sc.warmup_steps, schedule.integer("warmup_steps", 0, 0, INT64_MAX));
  STRATA_ASSIGN_OR_RETURN(std::string decay, schedule.choice("decay", {"constant", "linear", "cosine"}, "constant"));
  sc.decay = decay == "linear" ? LrDecay::linear : decay == "cosine" ? LrDecay::cosine : LrDecay::constant;
  STRATA_READ(sc.min_lr_ratio, schedule.number("min_lr_ratio", 0.0, 0.0, 1.0));
  if (sc.decay == LrDecay::constant && schedule.has("min_lr_ratio"))
    return schedule.error_at("min_lr_ratio", "is only read with decay: linear or cosine (the decay is constant)");
  STRATA_RETURN_IF_ERROR(schedule.finish());

  STRATA_ASSIGN_OR_RETURN(std::string precision, root.choice("precision", {"fp32", "bf16"}, "bf16"));
  config.precision = precision == "fp32" ? DType::f32 : DType::bf16;

  // adapter: LoRA over a frozen base (docs/lora.md); PEFT's LoraConfig defaults.
  STRATA_ASSIGN_OR_RETURN(ConfigNode adapter, root.child("adapter"));
  if (root.has("adapter")) {
    AdapterConfig& a = config.model.adapter;
    STRATA_ASSIGN_OR_RETURN(std::string kind, adapter.choice("kind", {"lora"}, std::nullopt));
    a.enabled = kind == "lora";
    STRATA_READ(a.rank, adapter.integer("rank", 8, 1, 4096));
    STRATA_READ(a.alpha, adapter.number("alpha", 8.0, 1.0e-6, 1.0e6));
    STRATA_READ(a.dropout, adapter.number("dropout", 0.0, 0.0, 0.99));
    STRATA_READ(a.rslora, adapter.boolean("rslora", false));
    const models::Architecture& arch = models::architecture_of(config.model);
    const std::vector<std::string>& all = arch.adapter_targets;
    STRATA_READ(a.targets, adapter.string_list("targets", arch.default_adapter_targets));
    if (a.targets.empty()) return adapter.error_at("targets", "is empty: name at least one linear to adapt");
    for (const std::string& target : a.targets)
      if (std::find(all.begin(), all.end(), target) == all.end())
        return adapter.error_at("targets", fmt::format("'{}' is not a linear of a {} block; targets are {}", target,
                                                       config.model.arch, fmt::join(all, ", ")));
    const std::string precision_name = config.precision == DType::f32 ? "fp32" : "bf16";
    STRATA_ASSIGN_OR_RETURN(std::string base, adapter.choice("base_dtype", {"fp32", "bf16", "int8", "nf4"},
                                                             precision_name));
    a.base_dtype = base == "fp32" ? BaseDType::fp32 : base == "bf16" ? BaseDType::bf16 : base == "int8" ? BaseDType::int8 : BaseDType::nf4;
    STRATA_READ(a.double_quant, adapter.boolean("double_quant", false));
    if (a.double_quant && a.base_dtype != BaseDType::nf4)
      return adapter.error_at("double_quant", "quantises NF4's block scales: it needs base_dtype: nf4");
    STRATA_READ(a.init, adapter.string("init", std::string()));
    if (!a.init.empty()) a.init = adapter.resolve_path(a.init);
    STRATA_RETURN_IF_ERROR(adapter.finish());
  }

  STRATA_ASSIGN_OR_RETURN(ConfigNode device, root.child("device"));
  STRATA_READ(config.device_kind, device.choice("kind", {"cpu", "cuda", "emulated"}, "cpu"));
  STRATA_READ(config.device_memory_bytes, device.size("memory", 256ull << 20, 1u << 20));
  STRATA_RETURN_IF_ERROR(device.finish());

  STRATA_ASSIGN_OR_RETURN(ConfigNode host, root.child("host"));
  STRATA_READ(config.host_memory_bytes, host.size("memory", 512ull << 20, 1u << 20));
  STRATA_RETURN_IF_ERROR(host.finish());

  STRATA_ASSIGN_OR_RETURN(ConfigNode placement, root.child("placement"));
  STRATA_READ(config.placement.params, parse_tier(placement, "params", Tier::nvme));
  STRATA_READ(config.placement.grads, parse_tier(placement, "grads", Tier::host));
  STRATA_READ(config.placement.optimizer, parse_tier(placement, "optimizer", Tier::nvme));
  STRATA_RETURN_IF_ERROR(placement.finish());
  // Optimizer state is the bulk of the state and streams through the device chunk by chunk;
  // its lasting home is host or nvme.
  if (config.placement.optimizer == Tier::device)
    return placement.error_at("optimizer", "'device' is not accepted; optimizer state lives on host or nvme");
  // Device-resident gradients are consumed by each unit's update right after its backward;
  // clipping needs every gradient before the first update, which they cannot wait for.
  if (config.placement.grads == Tier::device && config.optimizer.grad_clip > 0)
    return placement.error_at("grads", fmt::format("'device' needs optimizer.grad_clip: 0 (it is {}): clipping waits "
                                                   "for every gradient before the first update, so they must be "
                                                   "parked on host or nvme",
                                                   config.optimizer.grad_clip));
  // With gradient_accumulation_steps > 1, `grads: device` holds every unit's gradients on the
  // device for the whole update (run/train_plan.h device_grads_offsets); check_budgets says when
  // device.memory cannot hold them.

  STRATA_ASSIGN_OR_RETURN(ConfigNode nvme, root.child("nvme"));
  STRATA_READ(config.nvme_paths, nvme.string_list("paths", std::vector<std::string>{}));
  for (std::string& nvme_path : config.nvme_paths) {
    nvme_path = nvme.resolve_path(nvme_path);
    std::error_code directory_error;
    // A per-rank path (`{rank}`, train/zero/zero.h) is created by each rank; what holds it must exist.
    if (const size_t rank_at = nvme_path.find("{rank}"); rank_at != std::string::npos) {
      std::filesystem::path parent = std::filesystem::path(nvme_path.substr(0, rank_at)).parent_path();
      if (parent.empty()) parent = ".";  // `rank{rank}` beside a config given as a bare file name
      if (!std::filesystem::is_directory(parent, directory_error))
        return nvme.error_at("paths", fmt::format("'{}' (of '{}') is not an existing directory; create it or list "
                                                  "another", parent.string(), nvme_path));
      continue;
    }
    if (!std::filesystem::is_directory(nvme_path, directory_error))
      return nvme.error_at("paths", fmt::format("'{}' is not an existing directory; create it or list another", nvme_path));
  }
  STRATA_ASSIGN_OR_RETURN(std::string verify_reads, nvme.choice("verify_reads", {"always", "once"}, "always"));
  config.verify_reads = *memory::parse_verify_reads(verify_reads);  // choice() took only its names
  // The io: section `strata tune` writes: inline under nvme.io, or the file itself.
  STRATA_ASSIGN_OR_RETURN(std::string io_file, nvme.string("io_file", std::string()));
  if (!io_file.empty() && nvme.has("io"))
    return nvme.error_at("io_file", "give either nvme.io or nvme.io_file, not both");
  if (!io_file.empty()) {
    STRATA_READ(config.io, io::load_io_settings_file(nvme.resolve_path(io_file)));
  } else {
    STRATA_ASSIGN_OR_RETURN(ConfigNode io_node, nvme.child("io"));
    STRATA_READ(config.io, io::parse_io_settings(io_node));
  }
  STRATA_RETURN_IF_ERROR(nvme.finish());
  if (config.nvme_paths.empty())
    return nvme.error_at("paths", "is required: strata keeps the committed state (the checkpoint) in the store on NVMe");

  STRATA_ASSIGN_OR_RETURN(ConfigNode parallel, root.child("parallel"));
  STRATA_READ(config.parallel.zero_stage, parallel.integer("zero_stage", 1, 0, 3));
  STRATA_READ(config.parallel.timeout_s, parallel.number("timeout_s", 120.0, 1.0, 86400.0));
  STRATA_RETURN_IF_ERROR(parallel.finish());

  STRATA_ASSIGN_OR_RETURN(ConfigNode sample, root.child("sample"));
  STRATA_READ(config.sample_prompt, sample.string("prompt", std::string("The ")));
  STRATA_READ(config.sample_tokens, sample.integer("tokens", 0, 0, 1 << 20));
  STRATA_RETURN_IF_ERROR(sample.finish());
  // The sample goes through the run's tokenizer (tokenizer_path_for below; generate/generate.h
  // make_codec loads it): token data with none to be found would print noise.
  if (config.sample_tokens > 0 && config.data_format != DataFormat::text_bytes && tokenizer_path_for(config).empty())
    return sample.error_at("tokens", "needs a tokenizer with token data: give data.tokenizer or a model.init folder "
                                     "holding tokenizer.json / tokenizer.model (or drop sample:)");

  STRATA_ASSIGN_OR_RETURN(ConfigNode monitor_node, root.child("monitor"));
  STRATA_READ(config.monitor_serve, monitor_node.string("serve", std::string()));
  STRATA_RETURN_IF_ERROR(monitor_node.finish());
  if (!config.monitor_serve.empty()) {
    if (Result<ListenAddress> address = parse_listen_address(config.monitor_serve, "");
        !address.ok())
      return monitor_node.error_at("serve", address.error().message);
  }

  if (config.model.adapter.enabled) {
    if (config.parallel.zero_stage >= 3 && root.has("parallel"))
      return root.error_at("adapter", "with parallel.zero_stage 3 is not supported: a frozen base has no optimizer "
                                      "chunks to partition it by; use stage 1 or 2 (adapters and their state are small)");
    if (config.placement.grads == Tier::device)
      return root.error_at("adapter", "needs placement.grads host or nvme (the adapters' gradients are small)");
  }

  STRATA_RETURN_IF_ERROR(root.finish());
  if (!config.optimizer.chunk_elements_set) config.optimizer.chunk_elements = chunk_elements_for_budgets(config);
  return config;
}

uint64_t chunk_elements_for_budgets(const TrainConfig& config) {
  // The memory optimizer chunks stream through (run/budgets.h, the one pool rule; no scratch is
  // known before the layout): on the CPU device the budgets are one pool (docs/train.md);
  // elsewhere a chunk is staged in host memory and updated on the device.
  const uint64_t pool_bytes = memory_pools(config, 0).streaming_bytes();
  // A sixteenth of it per chunk (state().bytes_per_element() an element): several chunks are
  // in flight beside the parameters and gradients of the unit being updated, so the drive
  // always has the next chunk's read queued. A power of two, 64 Ki … 16 Mi elements (the old
  // fixed value: what large budgets keep).
  constexpr uint64_t kMinElements = uint64_t{64} << 10, kMaxElements = uint64_t{16} << 20;
  const auto target =
      static_cast<uint64_t>(static_cast<double>(pool_bytes / 16) / config.optimizer.state().bytes_per_element());
  uint64_t elements = kMinElements;
  while (elements * 2 <= std::min(target, kMaxElements)) elements *= 2;
  return elements;
}

Result<TrainConfig> load_train_config(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(ConfigNode root, ConfigNode::load_file(path));
  return parse_train_config(std::move(root));
}

std::string tokenizer_path_for(const TrainConfig& config) {
  if (!config.data_tokenizer.empty()) return config.data_tokenizer;
  if (config.model.init != "random" && hf::is_folder(config.model.init)) {
    for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
      std::error_code error;
      const std::filesystem::path path = std::filesystem::path(config.model.init) / name;
      if (std::filesystem::is_regular_file(path, error)) return config.model.init;
    }
  }
  return std::string();
}

}  // namespace strata
