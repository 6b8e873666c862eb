// strata/models/definitions.h — the model definitions behind make_model_definition (model.h),
// one file each, and what they share. Internal to models/.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/gpt2_shape.h"
#include "models/model.h"

namespace strata::models {

// GPT-2 (models/gpt2.cpp) and Llama with its variants — Qwen 2, Phi-3 (models/llama.cpp).
std::unique_ptr<const ModelDefinition> make_gpt2_definition(const ModelConfig& config);
std::unique_ptr<const ModelDefinition> make_llama_definition(const ModelConfig& config);
// Gemma 1 (models/gemma.cpp): the decoder with Gemma's options.
std::unique_ptr<const ModelDefinition> make_gemma_definition(const ModelConfig& config);

namespace decoder {
struct DecoderOptions;  // models/decoder.h
}
// The Llama family's one definition (models/decoder_definition.cpp): the family's units and
// names, RMSNorm weights initialised to `norm_init`, every op models/decoder.h's with `options`,
// reporting `arch` (a string that outlives it).
std::unique_ptr<const ModelDefinition> make_decoder_definition(const ModelConfig& config, const char* arch,
                                                               const decoder::DecoderOptions& options,
                                                               float norm_init);

// A parameter's shape as a vector (1-D or 2-D).
inline std::vector<int64_t> shape_of(const models::gpt2::ParamSpec& spec) {
  return spec.rank == 1 ? std::vector<int64_t>{spec.shape[0]} : std::vector<int64_t>{spec.shape[0], spec.shape[1]};
}

}  // namespace strata::models
