// The CUDA twin of quant.h's dequantiser (quant_cuda.h): one grid-stride kernel per quantised
// tensor — a thread per code byte for NF4 (two elements), per code for int8 — reading its
// block's absmax (or rebuilding it from the double-quantised trio) as the CPU does, with the
// same per-element functions (quant_element.h), so the bits match.
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

__device__ inline float read_absmax(const AbsmaxArgs& a, uint64_t block) {
  if (a.plain != nullptr) return a.plain[block];
  return detail::double_quant_absmax(a.code_values[a.codes[block]], a.absmax2[block / kAbsmaxBlockElements], *a.mean);
}

__global__ void dequantize_nf4_kernel(AbsmaxArgs absmax, const uint8_t* __restrict__ codes, uint64_t element_count,
                                      float* __restrict__ out) {
  constexpr detail::Nf4Table table = detail::nf4_table();
  const uint64_t bytes = (element_count + 1) / 2;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t byte = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; byte < bytes; byte += stride) {
    const uint64_t element = 2 * byte;
    const float scale = read_absmax(absmax, element / kBlockElements);  // both elements share the block
    const uint8_t code = codes[byte];
    out[element] = detail::mul_rn(table.levels[code >> 4], scale);
    if (element + 1 < element_count) out[element + 1] = detail::mul_rn(table.levels[code & 0xF], scale);
  }
}

__global__ void dequantize_int8_kernel(AbsmaxArgs absmax, const int8_t* __restrict__ codes, uint64_t element_count,
                                       float* __restrict__ out) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < element_count; i += stride) {
    const float scale = detail::int8_scale(read_absmax(absmax, i / kBlockElements));
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
