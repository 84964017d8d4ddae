/* cast: fp32 <-> bf16 (uint16 storage), round-to-nearest-even, element-wise. */
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kern_math.h"

void kern_cpu_f32_to_bf16(uint16_t *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = kern_f32_to_bf16(inp[i]);
}

void kern_cpu_bf16_to_f32(float *out, const uint16_t *inp, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = kern_bf16_to_f32(inp[i]);
}

void kern_cpu_bf16_to_f32_segs(float *out, const uint16_t *inp, const kern_seg_t *seg, int nseg) {
  for (int k = 0; k < nseg; k++)
    kern_cpu_bf16_to_f32(out + seg[k].offset, inp + seg[k].offset, seg[k].numel);
}
