// strata/models/decoder.h — the Llama family's training and decoding computation, composed from
// the compute backend's operations (kernels/ops.h) instead of model-shaped kernels: the
// embedding, one pre-norm decoder block (RMSNorm, q/k/v projections with optional biases, RoPE,
// causal MHA or GQA attention, o_proj, RMSNorm, a gated MLP) and the final norm, head and loss;
// and the same block, embedding and head over a KV cache for generation (fp32 or bf16 weights). A definition
// of the family (models/llama.cpp: Llama, Qwen 2, Phi-3; a Gemma definition) owns its units,
// names and init and calls these with its shape and its DecoderOptions, so the differences
// between the family's members are the options' lines, not new kernels.
//
// Contract
// - Math: models/llama_shape.h's (Hugging Face's LlamaForCausalLM in fp32), generalised by
//   DecoderOptions. With default options the ops run exactly the sequence, buffer reuse and
//   order of the reference kernels' block_forward / block_backward / head_forward_backward
//   (tests/reference/llama_reference.cpp), so on the CPU backend the results are BIT-IDENTICAL to those kernels
//   (tests/backend/test_compose_llama.cpp proves it).
// - Shape: models::llama::Config — heads, widths, RoPE, norm_eps, biases, tied head. Weights
//   and gradients are models::llama::BlockTensors / HeadWeights / HeadGrads (llama_shape.h's packed
//   canonical layout, bind_block), in the backend's memory; gradients ACCUMULATE, activation
//   gradients are OVERWRITTEN; a null gradient pointer is a frozen tensor whose product is
//   skipped (ops.h); `adapters` are the block's LoRA (llama_shape.h lora_target indices).
// - Step: the ops read begin_step's tokens, targets, packed positions and segments (backend.h
//   StepBatch); the blocks always apply a packed step's packing, the embedding never needs it.
//   The head adds each trained row's loss to the step's loss (CrossEntropy), once per row.
// - Workspace: the caller's, 64-byte aligned, at least workspace_size_bytes for the shape —
//   the layout is this file's own (the block's activations, one attention scratch of the
//   backend's attention_scratch_bytes, the RoPE tables; or the head's chunk buffers). A
//   backward with recompute = false reads what the forward with the same inputs left there.
// - Ordering and errors: every call enqueues ops on the backend's stream and returns the first
//   op's error; nothing waits for the device. One host thread per backend (backend.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "device/device.h"
#include "kernels/backend.h"
#include "models/llama_shape.h"
#include "kernels/lora/lora.h"
#include "kernels/ops.h"

namespace strata::models::decoder {

// What a member of the family changes beyond its shape. The defaults are Llama's (and give
// llama_reference.cpp's bits); Gemma sets all three.
struct DecoderOptions {
  // RMSNorm gain = weight_offset + w (every norm of the blocks and the final one). Gemma: 1
  // (its x·(1 + w), weights stored around 0).
  float norm_weight_offset = 0.0f;
  // The MLP's gate: SiLU (SwiGLU: Llama) or tanh-GELU (GeGLU: Gemma's gelu_pytorch_tanh).
  kernels::ops::GateKind gate = kernels::ops::GateKind::silu;
  // x0 = scale · embed[token]. Gemma: sqrt(n_embd) rounded to fp32 (Hugging Face's normalizer in
  // the hidden dtype); 1 multiplies nothing.
  float embedding_scale = 1.0f;
};

// Workspace the block and head ops need for shapes up to `max_shape`: on `backend`, or on a
// device kind before any backend exists (the attention scratch is the kind's).
size_t workspace_size_bytes(const kernels::ComputeBackend& backend, const models::llama::Config& config,
                            const kernels::BatchShape& max_shape);
size_t workspace_size_bytes(device::Kind kind, const models::llama::Config& config,
                            const kernels::BatchShape& max_shape);

// x0[r, :] = embedding_scale · embed[token_r, :] (the step's tokens).
[[nodiscard]] Status embedding_forward(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                       const DecoderOptions& options, const kernels::BatchShape& shape,
                                       const float* embed, float* x0);
// d_embed[token_r, :] += embedding_scale · d_x0[r, :] in row order.
[[nodiscard]] Status embedding_backward(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                        const DecoderOptions& options, const kernels::BatchShape& shape,
                                        const float* d_x0, float* d_embed);

// One block: x_out = block(x_in) (x_out must not alias x_in), its activations left in
// `workspace`. `adapters`: the block's LoRA (null: none).
[[nodiscard]] Status block_forward(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                   const DecoderOptions& options, const kernels::BatchShape& shape,
                                   const models::llama::BlockWeights& weights, const float* x_in, float* x_out,
                                   const kernels::Workspace& workspace,
                                   const kernels::lora::BlockAdapters* adapters = nullptr);
// d_in (overwritten; may alias d_out) = dLoss/dx_in; `grads` accumulate (null members frozen: a
// default BlockGrads{} gives d_in and the adapters' grads only). recompute: re-run the forward
// from x_in first; false: the workspace holds the forward's activations for the same inputs.
[[nodiscard]] Status block_backward(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                    const DecoderOptions& options, const kernels::BatchShape& shape,
                                    const models::llama::BlockWeights& weights, const float* x_in,
                                    const float* d_out, float* d_in, const models::llama::BlockGrads& grads,
                                    const kernels::Workspace& workspace, bool recompute,
                                    const kernels::lora::BlockAdapters* adapters = nullptr);

// Final RMSNorm, logits = norm(x)·Wᵀ (W = weights.lm_head: lm_head, or the embedding when tied)
// and the loss, kHeadChunkRows rows at a time; each chunk's rows add to the step's loss.
// d_x_final null: the loss only (evaluation; `grads` unused). Otherwise d_x_final is
// overwritten and the non-null grads accumulate (a default HeadGrads{}: a frozen head).
[[nodiscard]] Status head_forward_backward(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                           const DecoderOptions& options, const kernels::BatchShape& shape,
                                           const models::llama::HeadWeights& weights, const float* x_final,
                                           float* d_x_final, const models::llama::HeadGrads& grads,
                                           const kernels::Workspace& workspace);

// --- decoding with a KV cache (generation) ---
// The reference's decode entry points (tests/reference/llama_reference.h) composed of the
// backend's decode ops (ops.h "decoding with a KV cache"), generalised by DecoderOptions: with default options the CPU
// backend gives llama_reference.cpp's block_decode / head_decode / embedding_decode bits (fp32 and bf16
// weights; tests/backend/test_compose_llama.cpp proves it). The cache is a kernels::KvCacheBlock of
// [max_positions, KV·D] keys (after RoPE) and values; `tokens` are HOST memory; everything else
// is the backend's memory. The workspace is the caller's, at least decode_workspace_size_bytes
// for up to `rows` new rows and the cache's max_positions (this file's layout: the block's
// activations, the RoPE tables of the new rows, the backend's attention_decode scratch; or the
// head's normed row); the bf16 calls' `scratch` at least decode_bf16_scratch_bytes (the 1-D
// tensors widened, then the backend's matmul_bf16 scratch for the largest product, the whole
// head included).
size_t decode_workspace_size_bytes(const kernels::ComputeBackend& backend, const models::llama::Config& config,
                                   int64_t max_rows, int64_t max_positions);
size_t decode_workspace_size_bytes(device::Kind kind, const models::llama::Config& config, int64_t max_rows,
                                   int64_t max_positions);
size_t decode_bf16_scratch_bytes(const kernels::ComputeBackend& backend, const models::llama::Config& config);
size_t decode_bf16_scratch_bytes(device::Kind kind, const models::llama::Config& config);

// x0[r, :] = embedding_scale · token_table[tokens[r], :] for `rows` new tokens (host memory), each
// in [0, table_rows): the embedding's token rows, or a gathered piece of them. Positions enter
// through RoPE, in the block.
[[nodiscard]] Status embedding_decode(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                      const DecoderOptions& options, int64_t rows, const int32_t* tokens,
                                      const float* token_table, int64_t table_rows, float* x0);
// One block for `rows` new positions past..past + rows − 1 over the cached 0..past − 1: their k
// and v (after RoPE) written into the cache at row past, x_out (must not alias x_in) the block's
// output for those rows — block_forward's math for them.
[[nodiscard]] Status block_decode(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                  const DecoderOptions& options, int64_t past, int64_t rows,
                                  const models::llama::BlockWeights& weights, const float* x_in, float* x_out,
                                  const kernels::KvCacheBlock& cache, const kernels::Workspace& workspace);
// logits [projection_rows] of the last of `rows` rows of x_final: the final RMSNorm (norm_weight)
// and the product with `projection` ([projection_rows, C]: the output projection, or a piece of
// its vocabulary rows).
[[nodiscard]] Status head_logits(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                 const DecoderOptions& options, int64_t rows, const float* norm_weight,
                                 const float* projection, int64_t projection_rows, const float* x_final,
                                 float* logits, const kernels::Workspace& workspace);
// The same on bf16 weights as the store holds them: the 1-D tensors widened into `scratch`
// (cast_bf16_to_fp32), every product through the backend's matmul_bf16 — equal to widening
// first and the fp32 calls up to fp32 summation order. The head reads config.vocab_size rows.
[[nodiscard]] Status block_decode_bf16(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                       const DecoderOptions& options, int64_t past, int64_t rows,
                                       const models::llama::BlockWeightsBf16& weights, const float* x_in,
                                       float* x_out, const kernels::KvCacheBlock& cache,
                                       const kernels::Workspace& workspace, const kernels::Workspace& scratch);
[[nodiscard]] Status head_logits_bf16(kernels::ComputeBackend& backend, const models::llama::Config& config,
                                      const DecoderOptions& options, int64_t rows,
                                      const models::llama::HeadWeightsBf16& weights, const float* x_final,
                                      float* logits, const kernels::Workspace& workspace,
                                      const kernels::Workspace& scratch);

}  // namespace strata::models::decoder
