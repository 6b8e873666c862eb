// strata/models/lora_fold.h — LoRA adapters folded into their base weights: W + scale·B·A.
//
// One function does the fold for both its users — the merged export (run/run_store.h
// export_merged_weights) and generation on an adapter store (generate/generate.h) — so the two
// give the same bits by construction: generation's tokens on an adapter store are those of its
// merged export, staged.
//
// The math, fp32: each element's delta Σ_r B[o, r]·A[r, i] is summed in float over r in
// ascending order, then W += float(scale)·delta. An nn.Linear base weight (Llama) is [out, in]
// and gets B·A; a Conv1D one (GPT-2) is [in, out] and gets (B·A)ᵀ. A is [r, in], B [out, r]
// either way (PEFT's shapes, models/model_layout.h).
//
// Threads: rows are spread over TBB's workers; the result does not depend on how (each element
// is summed by one thread in the same order). No allocation.
#pragma once

#include <cstdint>
#include <vector>

#include "models/model_layout.h"

namespace strata::models {

// One adapted linear of a block: where its base weight lies in the block unit's packed buffer,
// and where its lora_A and lora_B lie in the adapter unit's.
struct AdaptedLinear {
  BlockLinear linear;
  uint64_t weight_offset_elements = 0;  // in the block unit
  uint64_t a_offset_elements = 0;       // in the adapter unit
  uint64_t b_offset_elements = 0;
};

// The adapted linears of block `block_index` of `layout` (has_adapters()), in adapter order.
std::vector<AdaptedLinear> adapted_linears(const ModelLayout& layout, int64_t block_index);

// weight += scale · (B·A), transposed for a Conv1D (`linear.conv1d`); see the contract.
void fold_lora(const BlockLinear& linear, uint32_t rank, double scale, const float* a, const float* b, float* weight);

// Every adapted linear of block `block_index`: `block` is the block unit's packed fp32 weights,
// `adapter` its adapter unit's packed fp32 weights; scale and rank are the layout's adapter's.
void fold_block_adapters(const ModelLayout& layout, const AdapterConfig& adapter, int64_t block_index,
                         const float* adapter_weights, float* block);

}  // namespace strata::models
