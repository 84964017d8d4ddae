/* safetensors: GPT-2 weights in Hugging Face's safetensors format, the
 * consolidated form other tools read. Export turns a committed checkpoint into
 * one such file one model unit at a time (memory: one unit, never the model);
 * import reads any range of the model's flat buffer from one, so each rank of
 * a job started from it reads only its own bytes.
 *
 * The file (https://huggingface.co/docs/safetensors): a little-endian u64 N,
 * N bytes of JSON (padded with spaces), then the tensors' bytes. The JSON maps
 * each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]},
 * offsets counted from the end of the header; "__metadata__" maps strings to
 * strings. The tensors tile the data with no hole and no overlap.
 *
 * Names and shapes are those of transformers' GPT2LMHeadModel state dict
 * (what save_pretrained writes): transformer.wte.weight, transformer.wpe.weight,
 * transformer.h.<l>.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}.
 * {weight,bias}, transformer.ln_f.{weight,bias}. GPT-2's projections are
 * Conv1D modules, whose weight is (in, out): the transpose of this model's
 * (out, in) matrices, so those four are transposed on the way out and in.
 * The LM head is tied to wte and not stored. On import the "transformer."
 * prefix may be absent (the Hub's original gpt2 files), the attention-mask
 * buffers such files carry (h.<l>.attn.bias, .masked_bias) are skipped, and
 * F32, BF16 and F16 tensors are read (widened to fp32). Export writes F32 or
 * BF16 (round to nearest even). docs/FORMATS.md has the mapping.
 *
 * Pure (daemon/job): the coordinator exports with it, ranks import with it,
 * and every header is checked before a byte of data is trusted: a header that
 * lies about a dtype, a shape, an offset or the file's size is refused naming
 * the file and the tensor. */
#ifndef FSDP_SAFETENSORS_H
#define FSDP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/job/gpt_config.h"

#define SAFETENSORS_HEADER_MAX (100u << 20) /* the format's own limit on N */

/* Tensor dtypes this side reads (F32 and BF16 share ckpt.h's values). */
enum { SAFETENSORS_F32 = 1, SAFETENSORS_BF16 = 2, SAFETENSORS_F16 = 3 };
/* "F32", "BF16", "F16"; NULL for another value. */
const char *safetensors_dtype_name(uint32_t dtype);

/* A file checked against a model: where each of the model's tensors is. */
typedef struct safetensors_place {
  uint32_t dtype;
  int transposed;  /* stored as (cols, rows) of the model's tensor */
  uint64_t at;     /* its first byte, from the file's start */
} safetensors_place_t;

typedef struct safetensors {
  gpt_config_t model;
  int num_tensors;
  gpt_tensor_t *tensor;        /* the model's table (gpt_config_tensors) */
  safetensors_place_t *place;  /* per tensor of the table */
} safetensors_t;

/* Checks a file's header: p holds its first n bytes (at least 8 + N), the
 * file is file_bytes long; every tensor of model must be there with its
 * shape, nothing unknown may be. path names the file in errors. Free with
 * safetensors_free. */
int safetensors_parse(const uint8_t *p, size_t n, uint64_t file_bytes, const char *path,
                      const gpt_config_t *model, safetensors_t *out);
/* Opens path (a regular file, no link followed) and checks its header. */
int safetensors_open(const char *path, const gpt_config_t *model, int *fd, safetensors_t *out);
/* Elements [g, g + n) of the model's flat buffer, read from fd as fp32 into
 * dst: only the bytes those elements occupy (a transposed tensor's in one
 * read per stored row). */
int safetensors_read(const safetensors_t *s, int fd, const char *path, uint64_t g, size_t n,
                     float *dst);
void safetensors_free(safetensors_t *s);
/* 1 when the first bytes of a file (n of them) look like safetensors: a
 * length that fits and a '{' after it. */
int safetensors_sniff(const uint8_t *p, size_t n);

/* ---- export ------------------------------------------------------------------ */

typedef struct safetensors_export safetensors_export_t;
struct ckpt_manifest;
/* Opens the committed checkpoint in dir for export as dtype (SAFETENSORS_F32
 * or _BF16). The caller keeps dir valid until close. */
int safetensors_export_open(safetensors_export_t **out, const char *dir, uint32_t dtype);
/* The file's size, and the checkpoint's manifest (ckpt.h: its step, its
 * shards' sizes and checksums, which every shard read is checked against). */
uint64_t safetensors_export_bytes(const safetensors_export_t *x);
const struct ckpt_manifest *safetensors_export_manifest(const safetensors_export_t *x);
/* The next piece of the file: the header first, then one model unit's
 * tensors at a time. *p stays valid until the next call; *n is 0 at the end.
 * A damaged checkpoint fails here, naming the shard and the section. */
int safetensors_export_next(safetensors_export_t *x, const uint8_t **p, size_t *n);
void safetensors_export_close(safetensors_export_t *x);
/* The whole export into path (a temporary name, fsync, rename). */
int safetensors_export_file(const char *dir, uint32_t dtype, const char *path);

#endif
