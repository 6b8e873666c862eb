// models/llama.cpp — the Llama definition (model.h) and its variants (Qwen 2's q/k/v biases,
// Phi-3's fused checkpoint tensors, Mistral's window: their differences are config keys and
// checkpoint names, models/hf): the family's definition (decoder_definition.cpp) with Llama's
// options — the defaults: RMSNorm w·x·rstd, SwiGLU, the embedding as it is — and RMSNorm
// weights initialised to 1, as LlamaPreTrainedModel does.
#include "models/definitions.h"

#include "models/decoder.h"

namespace strata::models {

std::unique_ptr<const ModelDefinition> make_llama_definition(const ModelConfig& config) {
  return make_decoder_definition(config, "llama", decoder::DecoderOptions{}, /*norm_init=*/1.0f);
}

}  // namespace strata::models
