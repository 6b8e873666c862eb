// A tiny C ABI over kernels/quant for quant_reference.py, which loads it with ctypes and checks
// the layout, the quantised bytes and the dequantised values against its own numpy/torch
// implementation, in process. Test-only. kind: 0 nf4, 1 int8. A unit is `tensor_count` tensors
// of counts[i] elements, quantised where quantize[i] != 0.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/quant/quant.h"

namespace {
namespace q = strata::kernels::quant;

q::UnitLayout layout_of(int kind, int double_quant, const uint64_t* counts, const uint8_t* quantize,
                        size_t tensor_count) {
  std::vector<q::TensorPlan> plans;
  for (size_t i = 0; i < tensor_count; ++i) plans.push_back(q::TensorPlan{counts[i], quantize[i] != 0});
  return q::make_unit_layout(kind == 0 ? q::Kind::nf4 : q::Kind::int8, plans, double_quant != 0);
}
}  // namespace

extern "C" {

// The buffer's size; per tensor 5 offsets into `offsets` (raw, codes, absmax, absmax2, mean;
// -1 where the tensor has no such piece).
uint64_t strata_quant_layout(int kind, int double_quant, const uint64_t* counts, const uint8_t* quantize,
                             size_t tensor_count, int64_t* offsets) {
  const q::UnitLayout layout = layout_of(kind, double_quant, counts, quantize, tensor_count);
  for (size_t i = 0; i < tensor_count; ++i) {
    const q::TensorLayout& t = layout.tensors[i];
    const uint64_t pieces[5] = {t.raw_offset_bytes, t.codes_offset_bytes, t.absmax_offset_bytes,
                                t.absmax2_offset_bytes, t.absmax_mean_offset_bytes};
    for (size_t p = 0; p < 5; ++p) offsets[5 * i + p] = pieces[p] == q::kNoPiece ? -1 : static_cast<int64_t>(pieces[p]);
  }
  return layout.size_bytes;
}

void strata_quant_quantize(int kind, int double_quant, const uint64_t* counts, const uint8_t* quantize,
                           size_t tensor_count, const float* unit, void* out) {
  q::quantize_unit(layout_of(kind, double_quant, counts, quantize, tensor_count), unit, static_cast<std::byte*>(out));
}

// isa: 0 best (AVX2 where the CPU has it), 1 scalar.
void strata_quant_dequantize(int kind, int double_quant, const uint64_t* counts, const uint8_t* quantize,
                             size_t tensor_count, const void* in, float* unit, int isa) {
  q::dequantize_unit(layout_of(kind, double_quant, counts, quantize, tensor_count),
                     static_cast<const std::byte*>(in), unit,
                     isa == 1 ? strata::kernels::CpuIsa::scalar : strata::kernels::CpuIsa::best);
}

}  // extern "C"
