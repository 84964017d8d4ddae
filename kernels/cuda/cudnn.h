/* cudnn: the causal attention of the bf16 attention ops by cuDNN's fused
 * flash attention (cudnn.cu; libcudnn.so.9 loaded when opened). Plain C
 * declarations: tests/cuda/test_cudnn_graphs.c includes them too. */
#ifndef FSDP_KERN_CUDA_CUDNN_H
#define FSDP_KERN_CUDA_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opens cuDNN on the current device for work queued on stream (a
 * cudaStream_t). 1, or 0 with msg saying why (no libcudnn.so.9, older than
 * 9.10.2, no handle). Once; again is a no-op. */
int kern_cudnn_open(void *stream, char *msg, size_t n);
/* Opens cuDNN with no device, for a GPU described by json (cuDNN's device
 * properties, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION): plans are chosen,
 * never built or run. For tests. */
int kern_cudnn_open_deviceless(const char *json, char *msg, size_t n);
void kern_cudnn_close(void);
/* The open device's properties as cuDNN serializes them (the JSON
 * kern_cudnn_open_deviceless takes), into buf; 1, or 0 (none, or longer
 * than n - 1). */
int kern_cudnn_device_json(char *buf, size_t n);

/* The plan of the forward (KERN_CUDNN_FWD) or backward attention for these
 * shapes, made on first use: 1 with its workspace (at most
 * KERN_CUDA_SIZE_CUDNN_WS bytes), cuDNN's engine and whether backward writes
 * its gradients in bf16 (*out16), or 0 with why. KERN_CUDNN_BWD: the
 * gradients in fp32 where cuDNN plans that, else in bf16; _BWD16: in bf16. */
#define KERN_CUDNN_FWD 0
#define KERN_CUDNN_BWD 1
#define KERN_CUDNN_BWD16 2
int kern_cudnn_sdpa_plan(int bwd, int B, int T, int C, int NH, size_t *workspace, long *engine,
                         int *out16, char *why, size_t n);
/* Backward plans with the gradients in bf16 from now on (on 1), for tests. */
void kern_cudnn_bwd16(int on);

/* The ops (kern.h's attention_*_bf16 on qkv16 (B, T, 3C) bf16): 1 when
 * queued, 0 when cuDNN has no plan for the shapes (said once on stderr) and
 * the caller's kernels must run it. ws: KERN_CUDA_SIZE_CUDNN_WS bytes,
 * 256-byte aligned. Forward: out16 (B, T, C) bf16, lse (B, NH, T).
 * Backward (acc 0): dqkv (B, T, 3C) fp32 written whole (1), or the same in
 * bf16 into dqkv16 (2: the caller widens it); dqkv NULL: into dqkv16 by a
 * bf16 plan (2), or 0 where cuDNN has none; D (B, NH, T) and dq_acc (B T
 * C floats) scratch. */
int kern_cudnn_sdpa_fwd(uint16_t *out16, float *lse, const uint16_t *qkv16, void *ws, int B, int T,
                        int C, int NH);
int kern_cudnn_sdpa_bwd(float *dqkv, uint16_t *dqkv16, float *D, float *dq_acc, void *ws,
                        const uint16_t *dout16, const uint16_t *qkv16, const uint16_t *out16,
                        const float *lse, int B, int T, int C, int NH);

#ifdef __cplusplus
}
#endif

#endif
