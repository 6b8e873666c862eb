// models/architectures.cpp — the rows (architectures.h).
#include "models/architectures.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/definitions.h"
#include "models/hf/hf_config.h"

namespace strata::models {

namespace {

std::vector<Architecture> make_rows() {
  std::vector<Architecture> rows;

  Architecture gpt2;
  gpt2.name = "gpt2";
  gpt2.label = "GPT-2";
  gpt2.learned_positions = true;
  gpt2.conv1d = true;
  gpt2.peft_prefix = "transformer.";
  // "c_proj" names both c_projs (PEFT's suffix rule); the dotted names pick one.
  gpt2.adapter_targets = {"c_attn", "c_proj", "c_fc", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  gpt2.default_adapter_targets = {"c_attn"};
  gpt2.hf_model_types = {"gpt2"};
  gpt2.read_hf_config = hf::read_gpt2_config;
  gpt2.write_hf_config = hf::write_gpt2_config;
  gpt2.make_definition = make_gpt2_definition;
  rows.push_back(std::move(gpt2));

  // Llama 2/3, Mistral, Qwen 2 / 2.5 and Phi-3: one definition, with the checkpoint's biases,
  // fused projections or window.
  Architecture llama;
  llama.name = "llama";
  llama.label = "Llama";
  llama.decoder_keys = true;
  llama.attention_biases = true;
  llama.rope_scaling = true;
  llama.fused_projections = true;
  llama.attention_window = true;
  llama.default_norm_eps = 1e-5;
  llama.adapter_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  llama.default_adapter_targets = {"q_proj", "v_proj"};
  llama.hf_model_types = {"llama", "mistral", "qwen2", "phi3"};
  llama.read_hf_config = hf::read_llama_config;
  llama.write_hf_config = hf::write_llama_config;
  llama.make_definition = make_llama_definition;
  rows.push_back(llama);

  // Gemma 1: the decoder with Gemma's options; names its linears as Llama does. GemmaConfig's
  // rms_norm_eps is 1e-6.
  Architecture gemma = llama;
  gemma.name = "gemma";
  gemma.label = "Gemma";
  gemma.attention_biases = false;
  gemma.rope_scaling = false;
  gemma.fused_projections = false;
  gemma.attention_window = false;
  gemma.default_norm_eps = 1e-6;
  gemma.hf_model_types = {"gemma"};
  gemma.read_hf_config = hf::read_gemma_config;
  gemma.write_hf_config = hf::write_gemma_config;
  gemma.make_definition = make_gemma_definition;
  rows.push_back(std::move(gemma));
  return rows;
}

}  // namespace

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> rows = make_rows();
  return rows;
}

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture& arch : architectures())
    if (arch.name == name) return &arch;
  return nullptr;
}

const Architecture& architecture_of(const ModelConfig& model) {
  // model.arch is checked where a config, a store or a folder is read: an unknown one here is a
  // broken invariant, never input — stop rather than compute some other model.
  const Architecture* arch = find_architecture(model.arch);
  if (arch == nullptr) {
    std::fprintf(stderr, "strata: internal error: model.arch '%s' is not an architecture\n", model.arch.c_str());
    std::abort();
  }
  return *arch;
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const Architecture& arch : architectures()) names.emplace_back(arch.name);
  return names;
}

std::string architecture_list() {
  std::vector<std::string> names = architecture_names();
  const std::string last = names.back();
  names.pop_back();
  return fmt::format("{} or {}", fmt::join(names, ", "), last);
}

}  // namespace strata::models
