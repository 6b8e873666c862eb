// The CUDA twin of quant.h's dequantiser (quant_cuda.h): one grid-stride kernel per quantised
// tensor — a thread per code byte for NF4 (two elements), per code for int8 — reading its
// block's absmax (or rebuilding it from the double-quantised trio) as the CPU does, with the
// same per-element functions (quant_element.h), so the bits match. Each thread block first puts
// the 16 NF4 levels and (double quant) the 256-entry map in shared memory.
#include <string>

#include "kernels/optim/adamw8bit.h"
#include "kernels/quant/quant_cuda.h"
#include "kernels/quant/quant_element.h"

namespace strata::kernels::quant::cuda {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
constexpr uint64_t kMaxBlocks = 8192;  // a grid-stride loop covers the rest

unsigned blocks_for(uint64_t count) {
  const uint64_t blocks = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::ok_status();
  return make_error(ErrorKind::internal, std::string("CUDA ") + what + " failed: " + cudaGetErrorString(error));
}

// Everything a tensor's kernel reads besides its codes, by value (the 1 KiB map included: kernel
// arguments may take 4 KiB, and this way the op needs no device copy of the table).
struct AbsmaxArgs {
  const float* plain;      // fp32 absmax, or null with double quant
  const uint8_t* codes;    // double quant: u8 per block
  const float* absmax2;    // double quant: fp32 per 256 blocks
  const float* mean;       // double quant: one fp32 (device memory)
  float code_values[256];  // the signed dynamic map
};

// The tables a block's threads index by data-dependent codes, in shared memory: indexed
// kernel-argument or constant memory would serialise divergent lookups, a per-thread array would
// live in local memory.
struct SharedTables {
  float nf4[16];
  float map[256];
};

// quant.h's levels, as device constants (read once per thread block into shared memory).
__constant__ detail::Nf4Table kDeviceNf4 = detail::nf4_table();

__device__ inline void load_tables(const AbsmaxArgs& a, SharedTables& tables) {
  for (unsigned i = threadIdx.x; i < 16; i += blockDim.x) tables.nf4[i] = kDeviceNf4.levels[i];
  if (a.plain == nullptr)
    for (unsigned i = threadIdx.x; i < 256; i += blockDim.x) tables.map[i] = a.code_values[i];
  __syncthreads();
}

__device__ inline float read_absmax(const AbsmaxArgs& a, const SharedTables& tables, uint64_t block) {
  if (a.plain != nullptr) return a.plain[block];
  return detail::double_quant_absmax(tables.map[a.codes[block]], a.absmax2[block / kAbsmaxBlockElements], *a.mean);
}

__global__ void dequantize_nf4_kernel(AbsmaxArgs absmax, const uint8_t* __restrict__ codes, uint64_t element_count,
                                      float* __restrict__ out) {
  __shared__ SharedTables tables;
  load_tables(absmax, tables);
  const uint64_t bytes = (element_count + 1) / 2;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t byte = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; byte < bytes; byte += stride) {
    const uint64_t element = 2 * byte;
    const float scale = read_absmax(absmax, tables, element / kBlockElements);  // both elements share the block
    const uint8_t code = codes[byte];
    out[element] = detail::mul_rn(tables.nf4[code >> 4], scale);
    if (element + 1 < element_count) out[element + 1] = detail::mul_rn(tables.nf4[code & 0xF], scale);
  }
}

__global__ void dequantize_int8_kernel(AbsmaxArgs absmax, const int8_t* __restrict__ codes, uint64_t element_count,
                                       float* __restrict__ out) {
  __shared__ SharedTables tables;
  load_tables(absmax, tables);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < element_count; i += stride) {
    const float scale = detail::int8_scale(read_absmax(absmax, tables, i / kBlockElements));
    out[i] = detail::mul_rn(static_cast<float>(codes[i]), scale);
  }
}

}  // namespace

Status dequantize_unit(const UnitLayout& layout, const void* src, float* dst, cudaStream_t stream) {
  const auto* base = static_cast<const std::byte*>(src);
  AbsmaxArgs args{};
  if (layout.double_quant) {
    const auto& map = dynamic_code(true);
    for (size_t i = 0; i < map.size(); ++i) args.code_values[i] = map[i];
  }
  for (const TensorLayout& t : layout.tensors) {
    if (t.element_count == 0) continue;
    float* out = dst + t.element_offset;
    if (!t.quantized) {
      STRATA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(out, base + t.raw_offset_bytes, sizeof(float) * t.element_count,
                                                         cudaMemcpyDeviceToDevice, stream),
                                         "cudaMemcpyAsync"));
      continue;
    }
    if (layout.double_quant) {
      args.plain = nullptr;
      args.codes = reinterpret_cast<const uint8_t*>(base + t.absmax_offset_bytes);
      args.absmax2 = reinterpret_cast<const float*>(base + t.absmax2_offset_bytes);
      args.mean = reinterpret_cast<const float*>(base + t.absmax_mean_offset_bytes);
    } else {
      args.plain = reinterpret_cast<const float*>(base + t.absmax_offset_bytes);
    }
    if (layout.kind == Kind::nf4) {
      const auto* codes = reinterpret_cast<const uint8_t*>(base + t.codes_offset_bytes);
      dequantize_nf4_kernel<<<blocks_for((t.element_count + 1) / 2), kThreadsPerBlock, 0, stream>>>(
          args, codes, t.element_count, out);
    } else {
      const auto* codes = reinterpret_cast<const int8_t*>(base + t.codes_offset_bytes);
      dequantize_int8_kernel<<<blocks_for(t.element_count), kThreadsPerBlock, 0, stream>>>(args, codes,
                                                                                            t.element_count, out);
    }
    STRATA_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "launch of the dequantize kernel"));
  }
  return Status::ok_status();
}

}  // namespace strata::kernels::quant::cuda
