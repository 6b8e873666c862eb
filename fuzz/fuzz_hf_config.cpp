// fuzz/fuzz_hf_config.cpp — libFuzzer harness: any bytes as a Hugging Face config.json. The
// parser must return a ModelConfig or one invalid_argument error; nothing may throw, crash or
// hang. A config it accepts must give a shape the tensor list can be built from without
// overflow, so the list is built too (bounded: the harness skips shapes above a few million
// tensors' worth of names).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "models/hf/hf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  strata::Result<strata::ModelConfig> model = strata::hf::parse_config_json(text, "config.json");
  if (!model.ok()) {
    if (model.error().kind != strata::ErrorKind::invalid_argument) std::abort();
    return 0;
  }
  // What strata writes for an accepted config must parse back to the same shape.
  strata::Result<strata::ModelConfig> again = strata::hf::parse_config_json(strata::hf::config_json(*model), "c");
  if (!again.ok() || again->arch != model->arch || again->n_layer != model->n_layer ||
      again->n_embd != model->n_embd || again->vocab_size != model->vocab_size || again->n_head != model->n_head)
    std::abort();
  if (model->n_layer <= 64) (void)strata::hf::model_tensors(*model);
  return 0;
}
