/* safetensors: GPT-2 weights in Hugging Face's layout (see safetensors.h). */
#include "daemon/job/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/log.h"
#include "daemon/job/ckpt.h"
#include "daemon/job/shard.h"
#include "kernels/kern_math.h"

#define ST_PREFIX "transformer."
#define ST_STAGE 65536u /* elements converted at a time on import */

/* This model's tensor names (the suffix after "h.<l>." for a block's) and
 * the state dict's, and whether the stored matrix is the transpose. */
static const struct {
  const char *ours, *hf;
  int transposed;
} st_names[] = {
    {"wte", "wte.weight", 0},          {"wpe", "wpe.weight", 0},
    {"lnf.w", "ln_f.weight", 0},       {"lnf.b", "ln_f.bias", 0},
    {"ln1.w", "ln_1.weight", 0},       {"ln1.b", "ln_1.bias", 0},
    {"attn.qkv.w", "attn.c_attn.weight", 1}, {"attn.qkv.b", "attn.c_attn.bias", 0},
    {"attn.proj.w", "attn.c_proj.weight", 1}, {"attn.proj.b", "attn.c_proj.bias", 0},
    {"ln2.w", "ln_2.weight", 0},       {"ln2.b", "ln_2.bias", 0},
    {"mlp.fc.w", "mlp.c_fc.weight", 1}, {"mlp.fc.b", "mlp.c_fc.bias", 0},
    {"mlp.proj.w", "mlp.c_proj.weight", 1}, {"mlp.proj.b", "mlp.c_proj.bias", 0},
};
#define ST_NAMES (int)(sizeof st_names / sizeof *st_names)

/* Every dtype the format defines, so a skipped tensor's bytes are counted. */
static const struct {
  const char *name;
  uint32_t bytes, ours; /* ours: SAFETENSORS_* when this side reads it */
} st_dtypes[] = {
    {"F32", 4, SAFETENSORS_F32}, {"BF16", 2, SAFETENSORS_BF16}, {"F16", 2, SAFETENSORS_F16},
    {"F64", 8, 0}, {"I64", 8, 0}, {"U64", 8, 0}, {"I32", 4, 0}, {"U32", 4, 0}, {"I16", 2, 0},
    {"U16", 2, 0}, {"I8", 1, 0}, {"U8", 1, 0}, {"BOOL", 1, 0}, {"F8_E5M2", 1, 0},
    {"F8_E4M3", 1, 0},
};
#define ST_DTYPES (int)(sizeof st_dtypes / sizeof *st_dtypes)

const char *safetensors_dtype_name(uint32_t dtype) {
  for (int i = 0; i < ST_DTYPES; i++)
    if (st_dtypes[i].ours && st_dtypes[i].ours == dtype) return st_dtypes[i].name;
  return NULL;
}

static uint32_t st_dtype_bytes(uint32_t dtype) { return dtype == SAFETENSORS_F32 ? 4 : 2; }

/* The state dict's name of the model's tensor t (without the prefix), and
 * whether it is stored transposed. */
static void st_hf_name(const char *ours, char *buf, size_t len, int *transposed) {
  int l = -1, skip = 0;
  if (sscanf(ours, "h.%d.%n", &l, &skip) == 1 && skip > 0) ours += skip;
  for (int i = 0; i < ST_NAMES; i++)
    if (!strcmp(ours, st_names[i].ours)) {
      if (l >= 0) snprintf(buf, len, "h.%d.%s", l, st_names[i].hf);
      else snprintf(buf, len, "%s", st_names[i].hf);
      *transposed = st_names[i].transposed;
      return;
    }
  FSDP_ASSERT(0 && "a tensor of the model has no safetensors name");
}

/* The stored shape of tensor t: 1-D for vectors, (cols, rows) when
 * transposed. A matrix is what takes weight decay (gpt_config_tensors: the
 * embeddings and the four projections), whatever its rows: a model of
 * context 1 has a (1, C) wpe, one of channels 1 a (1, 1) projection, and
 * Hugging Face's layout keeps them 2-D. */
static int st_shape(const gpt_tensor_t *t, int transposed, uint64_t shape[2]) {
  if (!t->decay) {
    shape[0] = (uint64_t)t->numel;
    return 1;
  }
  shape[0] = (uint64_t)(transposed ? t->cols : t->rows);
  shape[1] = (uint64_t)(transposed ? t->rows : t->cols);
  return 2;
}

static int st_table(safetensors_t *s, const gpt_config_t *model) {
  memset(s, 0, sizeof *s);
  s->model = *model;
  s->num_tensors = gpt_config_tensors(model, NULL, 0);
  s->tensor = calloc((size_t)s->num_tensors, sizeof *s->tensor);
  s->place = calloc((size_t)s->num_tensors, sizeof *s->place);
  if (!s->tensor || !s->place) {
    safetensors_free(s);
    return err_set(FSDP_ENOMEM, "safetensors: out of memory");
  }
  gpt_config_tensors(model, s->tensor, s->num_tensors);
  return FSDP_OK;
}

void safetensors_free(safetensors_t *s) {
  free(s->tensor), free(s->place);
  memset(s, 0, sizeof *s);
}

/* ---- the header ------------------------------------------------------------------ */

int safetensors_sniff(const uint8_t *p, size_t n) {
  if (n < 9) return 0;
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--) len = len << 8 | p[i];
  return len >= 2 && len <= SAFETENSORS_HEADER_MAX && p[8] == '{';
}

/* One entry's byte range, for the tiling check. */
typedef struct {
  uint64_t begin, end;
  const char *name;
} st_span_t;

static int st_span_cmp(const void *a, const void *b) {
  const st_span_t *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* An entry whose name is not the model's: a buffer the Hub's GPT-2 files
 * carry (skipped), or an error naming it. */
static int st_skippable(const char *name) {
  int l, n = 0;
  return sscanf(name, "h.%d.attn.%n", &l, &n) == 1 && n > 0 &&
         (!strcmp(name + n, "bias") || !strcmp(name + n, "masked_bias"));
}

/* A JSON integer that is a non-negative u64 (jansson's are int64). */
static int st_uint(json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
  *out = (uint64_t)json_integer_value(v);
  return 1;
}

/* Checks one entry (name, value) and, when it is one of the model's tensors,
 * records its place in s. */
static int st_entry(safetensors_t *s, const char *path, const char *key, json_t *v,
                    uint64_t data_at, uint64_t data_bytes, st_span_t *span, int *found) {
  if (!json_is_object(v) || json_object_size(v) != 3)
    return err_set(FSDP_EFORMAT, "%s: tensor \"%s\": not an object of exactly dtype, shape and "
                   "data_offsets; the file is not safetensors or is damaged", path, key);
  json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
         *off = json_object_get(v, "data_offsets");
  if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) || json_array_size(off) != 2)
    return err_set(FSDP_EFORMAT, "%s: tensor \"%s\": dtype must be a string, shape an array and "
                   "data_offsets an array of two; the header is damaged", path, key);
  int d = 0;
  while (d < ST_DTYPES && strcmp(st_dtypes[d].name, json_string_value(dt))) d++;
  if (d == ST_DTYPES)
    return err_set(FSDP_EFORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"; the header is damaged",
                   path, key, json_string_value(dt));
  uint64_t begin, end, numel = 1, dims[8];
  size_t ndim = json_array_size(sh);
  if (!st_uint(json_array_get(off, 0), &begin) || !st_uint(json_array_get(off, 1), &end) ||
      begin > end || end > data_bytes)
    return err_set(FSDP_EFORMAT, "%s: tensor \"%s\": data_offsets must be two integers 0 <= "
                   "begin <= end <= %" PRIu64 " (the data's size); the header lies about the "
                   "tensor's place", path, key, data_bytes);
  if (ndim > 8)
    return err_set(FSDP_EFORMAT, "%s: tensor \"%s\": shape of %zu dimensions; the header is "
                   "damaged", path, key, ndim);
  for (size_t i = 0; i < ndim; i++) {
    if (!st_uint(json_array_get(sh, i), &dims[i]))
      return err_set(FSDP_EFORMAT, "%s: tensor \"%s\": shape[%zu] is not a non-negative "
                     "integer", path, key, i);
    numel = dims[i] && numel > data_bytes / dims[i] ? data_bytes + 1 : numel * dims[i];
  }
  if (numel > data_bytes || numel * st_dtypes[d].bytes != end - begin)
    return err_set(FSDP_EFORMAT, "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] "
                   "hold %" PRIu64 " bytes, but its shape and dtype %s need %s%" PRIu64 "; the "
                   "header lies about the tensor's size", path, key, begin, end, end - begin,
                   st_dtypes[d].name, numel > data_bytes ? "more than " : "",
                   numel > data_bytes ? data_bytes : numel * st_dtypes[d].bytes);
  *span = (st_span_t){begin, end, key};
  const char *name = strncmp(key, ST_PREFIX, strlen(ST_PREFIX)) ? key : key + strlen(ST_PREFIX);
  /* the tied head is wte under its other name: a saver that keeps one name
   * of shared tensors (safetensors.torch.save_model) may keep this one */
  const int head = !strcmp(name, "lm_head.weight");
  if (head) name = "wte.weight";
  for (int k = 0; k < s->num_tensors; k++) {
    char hf[64];
    int tr;
    st_hf_name(s->tensor[k].name, hf, sizeof hf, &tr);
    if (strcmp(hf, name)) continue;
    if (found[k] && (head || found[k] == 2))
      return err_set(FSDP_EINVAL, "%s: tensor \"%s\": the file holds both wte and lm_head.weight; "
                     "this GPT-2 ties its LM head to wte, so a separate head cannot be loaded (save "
                     "it with tied embeddings)", path, key);
    if (found[k])
      return err_set(FSDP_EFORMAT, "%s: tensor \"%s\" is in the file twice (with and without "
                     "the \"" ST_PREFIX "\" prefix)", path, name);
    uint64_t want[2];
    const int wd = st_shape(&s->tensor[k], tr, want);
    if (!st_dtypes[d].ours)
      return err_set(FSDP_EINVAL, "%s: tensor \"%s\": dtype %s; weights are read from F32, "
                     "BF16 or F16: convert the file", path, key, st_dtypes[d].name);
    if ((int)ndim != wd || dims[0] != want[0] || (wd == 2 && dims[1] != want[1])) {
      char got[128] = "", exp[64];
      for (size_t i = 0, m = 0; i < ndim && m < sizeof got; i++)
        m += (size_t)snprintf(got + m, sizeof got - m, "%s%" PRIu64, i ? ", " : "", dims[i]);
      if (wd == 1) snprintf(exp, sizeof exp, "%" PRIu64, want[0]);
      else snprintf(exp, sizeof exp, "%" PRIu64 ", %" PRIu64, want[0], want[1]);
      return err_set(FSDP_EINVAL, "%s: tensor \"%s\" has shape [%s]; this job's model (layers "
                     "%d, channels %d, vocab %d, context %d) needs [%s]: start from a file of "
                     "the same model", path, key, got, s->model.layers, s->model.channels,
                     s->model.vocab, s->model.context, exp);
    }
    found[k] = head ? 2 : 1;
    s->place[k] = (safetensors_place_t){st_dtypes[d].ours, tr, data_at + begin};
    return FSDP_OK;
  }
  if (st_skippable(name)) return FSDP_OK;
  return err_set(FSDP_EINVAL, "%s: tensor \"%s\" is not a parameter of this GPT-2 (layers %d); "
                 "the file is of another model or layout", path, key, s->model.layers);
}

int safetensors_parse(const uint8_t *p, size_t n, uint64_t file_bytes, const char *path,
                      const gpt_config_t *model, safetensors_t *out) {
  memset(out, 0, sizeof *out);
  if (n < 8 || file_bytes < 8)
    return err_set(FSDP_EFORMAT, "%s: %" PRIu64 " bytes, shorter than a safetensors header's "
                   "8-byte length", path, file_bytes);
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--) len = len << 8 | p[i];
  if (len > SAFETENSORS_HEADER_MAX || len > file_bytes - 8 || len > n - 8)
    return err_set(FSDP_EFORMAT, "%s: header length %" PRIu64 " exceeds the file (%" PRIu64
                   " bytes) or the format's %u-byte limit; the file is not safetensors or is "
                   "truncated", path, len, file_bytes, SAFETENSORS_HEADER_MAX);
  json_error_t je;
  json_t *root = json_loadb((const char *)p + 8, (size_t)len, JSON_REJECT_DUPLICATES, &je);
  if (!root || !json_is_object(root)) {
    json_decref(root);
    return err_set(FSDP_EFORMAT, "%s: header is not a JSON object (%s, at byte %d); the file is "
                   "not safetensors or is damaged", path, root ? "another JSON value" : je.text,
                   root ? 8 : 8 + je.position);
  }
  int rc = st_table(out, model);
  if (rc) {
    json_decref(root);
    return rc;
  }
  const uint64_t data_at = 8 + len, data_bytes = file_bytes - data_at;
  const size_t entries = json_object_size(root);
  st_span_t *span = calloc(entries + 1, sizeof *span);
  int *found = calloc((size_t)out->num_tensors, sizeof *found), ns = 0;
  if (!span || !found) rc = err_set(FSDP_ENOMEM, "safetensors: out of memory");
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (rc) break;
    if (!strcmp(key, "__metadata__")) {
      const char *mk;
      json_t *mv;
      if (!json_is_object(v)) rc = err_set(FSDP_EFORMAT, "%s: __metadata__ is not an object "
                                           "of strings; the header is damaged", path);
      json_object_foreach(v, mk, mv) if (!rc && !json_is_string(mv))
        rc = err_set(FSDP_EFORMAT, "%s: __metadata__ \"%s\" is not a string; the header is "
                     "damaged", path, mk);
      continue;
    }
    rc = st_entry(out, path, key, v, data_at, data_bytes, &span[ns], found);
    ns++;
  }
  for (int k = 0; !rc && k < out->num_tensors; k++)
    if (!found[k]) {
      char hf[64];
      int tr;
      st_hf_name(out->tensor[k].name, hf, sizeof hf, &tr);
      rc = err_set(FSDP_EINVAL, "%s: tensor \"" ST_PREFIX "%s\" is missing; the file holds "
                   "another model (this job's: layers %d, channels %d)", path, hf, model->layers,
                   model->channels);
    }
  /* the tensors tile the data: no hole, no overlap, nothing after */
  if (!rc) qsort(span, (size_t)ns, sizeof *span, st_span_cmp);
  for (int i = 0; !rc && i <= ns; i++) {
    const uint64_t next = i < ns ? span[i].begin : data_bytes;
    const uint64_t prev = i ? span[i - 1].end : 0;
    if (next != prev)
      rc = err_set(FSDP_EFORMAT, "%s: %s at byte %" PRIu64 " of the data%s%s%s; the tensors "
                   "must tile the data exactly: the header lies about offsets or the file was "
                   "truncated or appended to", path, next < prev ? "tensors overlap" : "a hole",
                   next < prev ? next : prev, i ? " (after \"" : "", i ? span[i - 1].name : "",
                   i ? "\")" : "");
  }
  free(span), free(found);
  json_decref(root);
  if (rc) safetensors_free(out);
  return rc;
}

int safetensors_open(const char *path, const gpt_config_t *model, int *fd, safetensors_t *out) {
  memset(out, 0, sizeof *out);
  /* the file a link names: Hugging Face's cache keeps model.safetensors as
   * a link into its blobs (ckpt_open_file follows none, as a checkpoint's
   * files are never links; the service resolves init_from at submit) */
  char real[PATH_MAX];
  int rc = ckpt_open_file(realpath(path, real) ? real : path, fd);
  if (rc) return rc;
  struct stat st;
  uint8_t first[8];
  uint8_t *buf = NULL;
  if (fstat(*fd, &st)) {
    rc = err_set_errno(FSDP_EIO, errno, "%s: stat", path);
  } else if (!(rc = shard_file_io(*fd, first, st.st_size < 8 ? (size_t)st.st_size : 8, 0, 0, 0,
                                  path))) {
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--) len = len << 8 | first[i];
    if (st.st_size < 8 || len > SAFETENSORS_HEADER_MAX || len > (uint64_t)st.st_size - 8) {
      rc = safetensors_parse(first, st.st_size < 8 ? (size_t)st.st_size : 8,
                             (uint64_t)st.st_size, path, model, out); /* names the fault */
    } else if (!(buf = malloc(8 + len))) {
      rc = err_set(FSDP_ENOMEM, "%s: out of memory for a %" PRIu64 "-byte header", path, len);
    } else if (!(rc = shard_file_io(*fd, buf, 8 + len, 0, 0, 0, path))) {
      rc = safetensors_parse(buf, 8 + len, (uint64_t)st.st_size, path, model, out);
    }
  }
  free(buf);
  if (rc) close(*fd), *fd = -1;
  return rc;
}

/* IEEE half to float, exactly (every half is a float). */
static float st_f16(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24)
          : e == 31 ? (m ? NAN : INFINITY)
                    : ldexpf((float)(m | 0x400), e - 25);
  return h & 0x8000u ? -v : v;
}

/* n stored elements of dtype at p, widened to fp32. */
static void st_widen(float *dst, const uint8_t *p, uint32_t dtype, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (dtype == SAFETENSORS_F32) {
      memcpy(&dst[i], p + 4 * i, 4);
    } else {
      const uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
      dst[i] = dtype == SAFETENSORS_BF16 ? kern_bf16_to_f32(h) : st_f16(h);
    }
  }
}

int safetensors_read(const safetensors_t *s, int fd, const char *path, uint64_t g, size_t n,
                     float *dst) {
  int rc = FSDP_OK;
  uint8_t *stage = NULL;
  float *row = NULL;
  for (int k = 0; !rc && k < s->num_tensors && n; k++) {
    const gpt_tensor_t *t = &s->tensor[k];
    if (t->offset + t->numel <= g || t->offset >= g + n) continue;
    const safetensors_place_t *pl = &s->place[k];
    const size_t es = st_dtype_bytes(pl->dtype);
    const uint64_t a = g > t->offset ? g - t->offset : 0; /* [a, b) of the tensor */
    const uint64_t b = g + n < t->offset + t->numel ? g + n - t->offset : t->numel;
    float *out = dst + (t->offset + a - g);
    if (!stage && !(stage = malloc(ST_STAGE * 4))) rc = err_set(FSDP_ENOMEM, "%s: out of memory", path);
    if (!pl->transposed) {
      for (uint64_t i = a, c; !rc && i < b; i += c) {
        c = b - i < ST_STAGE ? b - i : ST_STAGE;
        if (!(rc = shard_file_io(fd, stage, c * es, (off_t)(pl->at + i * es), 0, 0, path)))
          st_widen(out + (i - a), stage, pl->dtype, c);
      }
      continue;
    }
    /* stored (K, R) for the model's (R, K): element (o, c) of ours is stored
     * row c, column o; rows o0..o1 of ours take columns o0..o1 of every stored row */
    const uint64_t K = (uint64_t)t->cols, R = (uint64_t)t->rows, o0 = a / K, o1 = (b - 1) / K;
    const uint64_t w = o1 - o0 + 1;
    free(row);
    if (!rc && !(row = malloc(w * 4))) rc = err_set(FSDP_ENOMEM, "%s: out of memory", path);
    uint8_t *raw = rc || w <= ST_STAGE ? stage : malloc(w * es);
    if (!rc && !raw) rc = err_set(FSDP_ENOMEM, "%s: out of memory", path);
    for (uint64_t c = 0; !rc && c < K; c++) {
      if ((rc = shard_file_io(fd, raw, w * es, (off_t)(pl->at + (c * R + o0) * es), 0, 0, path)))
        break;
      st_widen(row, raw, pl->dtype, w);
      for (uint64_t o = o0; o <= o1; o++) {
        const uint64_t i = o * K + c;
        if (i >= a && i < b) out[i - a] = row[o - o0];
      }
    }
    if (raw != stage) free(raw);
  }
  free(stage), free(row);
  return rc;
}

/* ---- export ------------------------------------------------------------------ */

struct safetensors_export {
  ckpt_reader_t rd;
  safetensors_t st;      /* the places the header gives */
  uint32_t dtype;
  uint8_t *header;       /* 8 + N bytes */
  uint64_t header_bytes, file_bytes;
  int next_unit;         /* -1: the header is next */
  float *unit;           /* one model unit, fp32 */
  uint8_t *out;          /* the same, as stored */
};

/* The header of an export: every tensor in the flat order, contiguous,
 * padded with spaces to a multiple of 8. */
static int st_export_header(safetensors_export_t *x) {
  json_t *root = json_object(), *meta = json_object();
  char step[32];
  snprintf(step, sizeof step, "%" PRId64, x->rd.m.step);
  json_object_set_new(meta, "format", json_string("pt"));
  json_object_set_new(meta, "producer", json_string("fsdpd"));
  json_object_set_new(meta, "step", json_string(step));
  json_object_set_new(root, "__metadata__", meta);
  uint64_t at = 0;
  for (int k = 0; k < x->st.num_tensors; k++) {
    const gpt_tensor_t *t = &x->st.tensor[k];
    char hf[64], name[80];
    int tr;
    st_hf_name(t->name, hf, sizeof hf, &tr);
    snprintf(name, sizeof name, ST_PREFIX "%s", hf);
    uint64_t shape[2];
    const int nd = st_shape(t, tr, shape);
    json_t *js = json_array();
    for (int i = 0; i < nd; i++) json_array_append_new(js, json_integer((json_int_t)shape[i]));
    const uint64_t bytes = t->numel * st_dtype_bytes(x->dtype);
    json_object_set_new(root, name, json_pack("{s:s, s:o, s:[I, I]}", "dtype",
                                              safetensors_dtype_name(x->dtype), "shape", js,
                                              "data_offsets", (json_int_t)at,
                                              (json_int_t)(at + bytes)));
    at += bytes;
  }
  char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(root);
  if (!text) return err_set(FSDP_ENOMEM, "export: out of memory");
  const size_t tl = strlen(text), len = (tl + 7) / 8 * 8;
  x->header_bytes = 8 + len;
  x->file_bytes = x->header_bytes + at;
  if (!(x->header = malloc(x->header_bytes))) {
    free(text);
    return err_set(FSDP_ENOMEM, "export: out of memory");
  }
  for (int i = 0; i < 8; i++) x->header[i] = (uint8_t)((uint64_t)len >> (8 * i));
  memcpy(x->header + 8, text, tl);
  memset(x->header + 8 + tl, ' ', len - tl);
  free(text);
  /* the header this side writes is one it reads back; the model comes from a
   * manifest in a directory the job's user writes, so a failure here is an
   * error for this export, never an abort of the process running it */
  safetensors_t check;
  int rc = safetensors_parse(x->header, x->header_bytes, x->file_bytes, "export", &x->st.model,
                             &check);
  if (rc)
    return err_wrap(FSDP_EFORMAT, "export of %s: the header made from its manifest's model "
                    "does not read back; the checkpoint cannot be exported", x->rd.dir);
  safetensors_free(&check);
  return FSDP_OK;
}

int safetensors_export_open(safetensors_export_t **out, const char *dir, uint32_t dtype) {
  *out = NULL;
  if (dtype != SAFETENSORS_F32 && dtype != SAFETENSORS_BF16)
    return err_set(FSDP_EINVAL, "dtype: export writes fp32 or bf16");
  safetensors_export_t *x = calloc(1, sizeof *x);
  if (!x) return err_set(FSDP_ENOMEM, "export: out of memory");
  x->dtype = dtype, x->next_unit = -1;
  int rc = ckpt_reader_open(&x->rd, dir);
  if (!rc) rc = st_table(&x->st, &x->rd.m.model);
  if (!rc) rc = st_export_header(x);
  size_t most = 0; /* the largest model unit */
  for (int u = 0; !rc && u <= x->rd.m.model.layers; u++) {
    const size_t n = gpt_config_unit(&x->rd.m.model, u).numel;
    most = n > most ? n : most;
  }
  if (!rc && (!(x->unit = malloc(most * 4)) || !(x->out = malloc(most * st_dtype_bytes(dtype)))))
    rc = err_set(FSDP_ENOMEM, "export: out of memory for a unit of %zu parameters", most);
  if (rc) {
    safetensors_export_close(x);
    return rc;
  }
  *out = x;
  return FSDP_OK;
}

uint64_t safetensors_export_bytes(const safetensors_export_t *x) { return x->file_bytes; }
const ckpt_manifest_t *safetensors_export_manifest(const safetensors_export_t *x) {
  return &x->rd.m;
}

void safetensors_export_close(safetensors_export_t *x) {
  if (!x) return;
  ckpt_reader_close(&x->rd);
  safetensors_free(&x->st);
  free(x->header), free(x->unit), free(x->out), free(x);
}

/* Element v as stored at p. */
static void st_store(uint8_t *p, float v, uint32_t dtype) {
  if (dtype == SAFETENSORS_F32) {
    memcpy(p, &v, 4);
  } else {
    const uint16_t h = kern_f32_to_bf16(v);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
  }
}

int safetensors_export_next(safetensors_export_t *x, const uint8_t **p, size_t *n) {
  const gpt_config_t *m = &x->rd.m.model;
  if (x->next_unit < 0) {
    x->next_unit = 0;
    *p = x->header, *n = x->header_bytes;
    return FSDP_OK;
  }
  *p = x->out, *n = 0;
  if (x->next_unit > m->layers) return FSDP_OK;
  const gpt_unit_t u = gpt_config_unit(m, x->next_unit++);
  int rc = ckpt_reader_read(&x->rd, CKPT_SEC_PARAMS, u.offset, u.numel, x->unit, CKPT_DTYPE_F32);
  if (rc) return err_wrap(rc, "export of step %" PRId64, x->rd.m.step);
  const size_t es = st_dtype_bytes(x->dtype);
  for (int k = 0; k < x->st.num_tensors; k++) {
    const gpt_tensor_t *t = &x->st.tensor[k];
    if (t->offset < u.offset || t->offset >= u.offset + u.numel) continue;
    const float *src = x->unit + (t->offset - u.offset);
    uint8_t *dst = x->out + (t->offset - u.offset) * es;
    char hf[64];
    int tr;
    st_hf_name(t->name, hf, sizeof hf, &tr);
    const size_t R = (size_t)t->rows, K = (size_t)t->cols;
    if (!tr) {
      for (size_t i = 0; i < t->numel; i++) st_store(dst + i * es, src[i], x->dtype);
      continue;
    }
    /* ours (R, K) -> stored (K, R), in tiles so both sides stay in cache */
    for (size_t o0 = 0; o0 < R; o0 += 32)
      for (size_t c0 = 0; c0 < K; c0 += 32)
        for (size_t o = o0; o < R && o < o0 + 32; o++)
          for (size_t c = c0; c < K && c < c0 + 32; c++)
            st_store(dst + (c * R + o) * es, src[o * K + c], x->dtype);
  }
  *n = u.numel * es;
  return FSDP_OK;
}

int safetensors_export_file(const char *dir, uint32_t dtype, const char *path) {
  safetensors_export_t *x;
  int rc = safetensors_export_open(&x, dir, dtype);
  if (rc) return rc;
  char tmp[4096];
  int fd = -1; /* FORMATS.md: a temporary of its own, as every writer */
  if (!(rc = file_output_check("export", path, "model.safetensors")) &&
      (rc = file_temp_create(path, tmp, sizeof tmp, &fd)))
    rc = err_wrap(rc, "export");
  uint64_t at = 0;
  for (const uint8_t *p; !rc;) {
    size_t n;
    if ((rc = safetensors_export_next(x, &p, &n)) || !n) break;
    rc = shard_file_io(fd, (void *)p, n, (off_t)at, 1, 0, tmp);
    at += n;
  }
  if (!rc && at != x->file_bytes)
    rc = err_set(FSDP_EINTERNAL, "export: wrote %" PRIu64 " bytes of %" PRIu64, at, x->file_bytes);
  if (!rc && fsync(fd)) rc = err_set_errno(FSDP_EIO, errno, "export: fsync %s", tmp);
  if (fd >= 0 && close(fd) && !rc) rc = err_set_errno(FSDP_EIO, errno, "export: close %s", tmp);
  if (!rc) rc = file_temp_place("export", tmp, path);
  if (!rc) {
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", path);
    rc = ckpt_fsync_dir(dirname(parent));
  }
  if (rc && fd >= 0) unlink(tmp);
  safetensors_export_close(x);
  return rc;
}
