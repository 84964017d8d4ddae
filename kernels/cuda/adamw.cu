/* adamw: one AdamW step over a flat range of parameters (kern_adamw_elem),
 * with the bias corrections formed on the host in double exactly as
 * kernels/cpu/adamw.c forms them: the CPU kernel's bits. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

/* (on g[i] * gscale: kern_cuda_adamw's 1, adamw_segs_scaled's clipping) */
__global__ static void adamw_kernel(float *p, const float *g, float gscale, float *m, float *v,
                                    size_t n, float lr, float beta1, float beta2, float eps,
                                    float wd, float bc1, float bc2_sqrt) {
  KERN_CUDA_FOR(i, n)
  kern_adamw_elem(p + i, g[i] * gscale, m + i, v + i, lr, beta1, beta2, eps, wd, bc1, bc2_sqrt);
}

static void adamw_launch(float *p, const float *g, float gscale, float *m, float *v, size_t n,
                         float lr, float beta1, float beta2, float eps, float wd, int t) {
  if (!n) return;
  const float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
  const float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t));
  adamw_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                 kern_cuda_st.stream>>>(p, g, gscale, m, v, n, lr, beta1, beta2, eps, wd, bc1,
                                        bc2_sqrt);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                                float beta1, float beta2, float eps, float wd, int t) {
  adamw_launch(p, g, 1.0f, m, v, n, lr, beta1, beta2, eps, wd, t);
}

/* adamw_segs (kern.h): the step over many tensors of a shard in one launch
 * instead of one each (gpt2-124m's 149 a step: their launches, and the
 * idle gaps between small ones, where each took a few microseconds for a
 * layernorm's 768 elements). Up to ADAMW_SEGS segments a launch, passed by
 * value in the launch's parameters (2 KiB: no copy to the device, nothing
 * allocated): their bounds from the first one's offset, in 32 bits (an
 * unused start UINT32_MAX), and their decay as bits. Each element finds its segment by a binary search
 * over the bounds (the threads of a warp take neighbouring elements, so
 * mostly the same reads) and takes kern_adamw_elem with its decay: the
 * bits of adamw on each segment alone; an element between segments (the
 * units' padding) is left alone. With p16, its new value rounded to bf16 is
 * stored there too: 2 bytes an element more than the 28 the step moves,
 * where the runtime's gathers would each read 4 and write 2 to round it.
 * adamw_segs_scaled's gscale multiplies each gradient as it is read: a
 * clipped step without vec_scale's pass over g (8 bytes an element). */
#define ADAMW_SEGS 256
static_assert((ADAMW_SEGS & (ADAMW_SEGS - 1)) == 0, "the search's steps halve ADAMW_SEGS");
typedef struct {
  int n;
  uint32_t start[ADAMW_SEGS], end[ADAMW_SEGS];
  uint32_t decay[ADAMW_SEGS / 32];
} adamw_segs_t;

/* A thread takes ADAMW_ILP elements a turn, grid-stride apart (a warp's
 * loads stay coalesced), every load of the turn issued before any store:
 * with one element a turn, each turn's loads waited behind the last turn's
 * stores (they may alias), and p16's value was read back from p after the
 * stores to m and v. */
#define ADAMW_ILP 4
/* 4 blocks an SM (56 registers; 70 left to itself, 3 blocks) */
__global__ static void __launch_bounds__(KERN_CUDA_THREADS, 4)
    adamw_segs_kernel(float *p, uint16_t *p16, const float *g, float gscale, float *m, float *v,
                      size_t span, adamw_segs_t s, float lr, float beta1, float beta2, float eps,
                      float wd, float bc1, float bc2_sqrt) {
  const size_t S = (size_t)gridDim.x * blockDim.x;
  for (size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < span; i0 += ADAMW_ILP * S) {
    float pv[ADAMW_ILP], gv[ADAMW_ILP], mv[ADAMW_ILP], vv[ADAMW_ILP], w[ADAMW_ILP];
    bool in[ADAMW_ILP];
#pragma unroll
    for (int k = 0; k < ADAMW_ILP; k++) {
      const size_t i = i0 + k * S;
      in[k] = false;
      if (i >= span) continue;
      /* the last segment that starts at or before i (start[0] is 0; the
       * unused starts are past every i), in log2 ADAMW_SEGS steps whatever
       * s.n, unrolled, so the turn's searches interleave (a loop of its
       * own each went one after another, each step waiting on its read) */
      int lo = 0;
#pragma unroll
      for (int step = ADAMW_SEGS / 2; step > 0; step /= 2)
        if (s.start[lo + step] <= i) lo += step;
      if (i < s.start[lo] || i >= s.end[lo]) continue;
      in[k] = true;
      w[k] = s.decay[lo / 32] >> (lo % 32) & 1u ? wd : 0.0f;
      pv[k] = p[i], gv[k] = g[i], mv[k] = m[i], vv[k] = v[i];
    }
#pragma unroll
    for (int k = 0; k < ADAMW_ILP; k++) {
      if (!in[k]) continue;
      const size_t i = i0 + k * S;
      kern_adamw_elem(&pv[k], gv[k] * gscale, &mv[k], &vv[k], lr, beta1, beta2, eps, w[k], bc1,
                      bc2_sqrt);
      p[i] = pv[k], m[i] = mv[k], v[i] = vv[k];
      if (p16) p16[i] = kern_f32_to_bf16(pv[k]);
    }
  }
}

extern "C" void kern_cuda_adamw_segs_scaled(float *p, uint16_t *p16, const float *g, float gscale,
                                            float *m, float *v, const kern_seg_t *seg, int nseg,
                                            float lr, float beta1, float beta2, float eps,
                                            float wd, int t) {
  const float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
  const float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t));
  for (int k = 0; k < nseg;) {
    adamw_segs_t s;
    memset(&s, 0, sizeof s);
    memset(s.start, 0xff, sizeof s.start); /* UINT32_MAX: past every element, for the search */
    const size_t base = seg[k].offset;
    for (; k < nseg && s.n < ADAMW_SEGS; k++) {
      KERN_CUDA_ASSERT(seg[k].offset >= base); /* kern.h: in order */
      const size_t end = seg[k].offset + seg[k].numel - base;
      if (end > UINT32_MAX) break;
      if (!seg[k].numel) continue;
      KERN_CUDA_ASSERT(!s.n || seg[k].offset - base >= s.end[s.n - 1]); /* not overlapping */
      s.start[s.n] = (uint32_t)(seg[k].offset - base), s.end[s.n] = (uint32_t)end;
      if (seg[k].decay) s.decay[s.n / 32] |= 1u << (s.n % 32);
      s.n++;
    }
    if (!s.n && k < nseg && seg[k].offset == base) { /* one segment past 32 bits: alone */
      adamw_launch(p + base, g + base, gscale, m + base, v + base, seg[k].numel, lr, beta1, beta2,
                   eps, seg[k].decay ? wd : 0.0f, t);
      if (p16) kern_cuda_f32_to_bf16(p16 + base, p + base, seg[k].numel);
      k++;
      continue;
    }
    if (!s.n) continue;
    const size_t span = s.end[s.n - 1];
    /* ADAMW_ILP elements a thread from its first turn on */
    adamw_segs_kernel<<<kern_cuda_blocks((span + ADAMW_ILP - 1) / ADAMW_ILP, KERN_CUDA_THREADS),
                        KERN_CUDA_THREADS, 0,
                        kern_cuda_st.stream>>>(p + base, p16 ? p16 + base : NULL, g + base, gscale,
                                               m + base, v + base, span, s, lr, beta1, beta2, eps,
                                               wd, bc1, bc2_sqrt);
    KERN_CUDA_LAUNCHED();
  }
}

/* gscale 1: each g[i] * 1 is g[i] itself */
extern "C" void kern_cuda_adamw_segs(float *p, uint16_t *p16, const float *g, float *m, float *v,
                                     const kern_seg_t *seg, int nseg, float lr, float beta1,
                                     float beta2, float eps, float wd, int t) {
  kern_cuda_adamw_segs_scaled(p, p16, g, 1.0f, m, v, seg, nseg, lr, beta1, beta2, eps, wd, t);
}
