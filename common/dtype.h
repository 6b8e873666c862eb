// strata/common/dtype.h — element types of tensors.
//
// fp32 master state; bf16 / fp16 compute copies. Names match safetensors ("F32", "BF16",
// "F16") and the config ("fp32", "bf16", "fp16").
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace strata {

enum class DType : uint8_t { f32 = 0, bf16 = 1, f16 = 2 };

constexpr uint32_t dtype_size_bytes(DType dtype) { return dtype == DType::f32 ? 4 : 2; }
constexpr const char* dtype_name(DType dtype) {
  return dtype == DType::f32 ? "fp32" : dtype == DType::bf16 ? "bf16" : "fp16";
}
constexpr const char* dtype_safetensors_name(DType dtype) {
  return dtype == DType::f32 ? "F32" : dtype == DType::bf16 ? "BF16" : "F16";
}
// Accepts "fp32"/"f32"/"F32", "bf16"/"BF16", "fp16"/"f16"/"F16".
[[nodiscard]] inline Result<DType> parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "F32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "BF16" || name == "bfloat16") return DType::bf16;
  if (name == "fp16" || name == "f16" || name == "F16" || name == "float16") return DType::f16;
  return make_error(ErrorKind::invalid_argument,
                    std::string("unknown dtype '") + std::string(name) + "'; use fp32, bf16 or fp16");
}

}  // namespace strata
