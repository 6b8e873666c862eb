// strata/kernels/llama/llama_math.h — Llama's scalar math written once for the CPU and CUDA
// kernels (compiles under nvcc as __host__ __device__). Internal to kernels/llama.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/gpt2/gpt2_math.h"  // STRATA_HOST_DEVICE
#include "kernels/llama/llama.h"

namespace strata::kernels::llama {

// The inverse frequency of pair i (op_math.h) of `config`'s RoPE (llama.h rope_spec).
STRATA_HOST_DEVICE inline double rope_inverse_frequency(const Config& config, int64_t i) {
  return op_math::rope_inverse_frequency(rope_spec(config), i);
}

// The k/v head that query head h reads (Hugging Face's repeat_kv: n_head / n_kv_head query
// heads share one).
STRATA_HOST_DEVICE inline int64_t kv_head_of(const Config& config, int64_t h) {
  return h / (config.n_head / config.n_kv_head);
}

using op_math::rope_cos_sin;
using op_math::rope_rotate_pair;
using op_math::silu_sigmoid;

}  // namespace strata::kernels::llama
