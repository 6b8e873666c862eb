// models/gemma.cpp — the Gemma definition (model.h): Hugging Face's GemmaForCausalLM (Gemma 1)
// in fp32 — Llama's decoder with RMSNorm x·(1 + w), a GeGLU MLP (tanh GELU) and embeddings
// times √hidden; head_dim apart from hidden / heads; multi-query or grouped-query attention; no
// biases; a tied head (or not). Its units, Hugging Face names, init and store keys are here; its
// training and decoding ops are the decoder composition (models/decoder.h) with Gemma's options.
#include "models/definitions.h"

#include <cmath>

#include "kernels/ops.h"
#include "models/decoder.h"

namespace strata::models {
namespace {

// Gemma's three differences from Llama, and only these (decoder.h: every block norm and the
// final one, the MLP gate, the embedding).
decoder::DecoderOptions gemma_options(const ModelConfig& model) {
  decoder::DecoderOptions options;
  options.norm_weight_offset = 1.0f;  // GemmaRMSNorm: x·rsqrt(mean(x²) + eps)·(1 + w)
  options.gate = kernels::ops::GateKind::gelu_tanh;  // GemmaMLP: gelu_pytorch_tanh(gate)·up
  // GemmaModel's normalizer: torch.tensor(hidden ** 0.5, dtype=hidden dtype) — √C rounded to
  // fp32 before it multiplies (√2048 = 45.254833995939045 becomes 45.25483322143555).
  options.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(model.n_embd)));
  return options;
}

}  // namespace

// Units, Hugging Face names and packing are Llama's (model.embed_tokens, layers.{i}, model.norm
// and lm_head when untied); init as GemmaPreTrainedModel: RMSNorm weights 0 — the gain 1 + w
// starts at 1.
std::unique_ptr<const ModelDefinition> make_gemma_definition(const ModelConfig& config) {
  return make_decoder_definition(config, "gemma", gemma_options(config), /*norm_init=*/0.0f);
}

}  // namespace strata::models
