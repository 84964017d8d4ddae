/* Tests of safetensors export and import (daemon/job/safetensors.h).
 *
 * The export is checked by an outsider: tests/reference/hf_gpt2.py reads the
 * file with json and numpy into a GPT-2 module laid out as Hugging Face's
 * (load_state_dict strict) and computes the loss on a batch, which must equal
 * ours from the same checkpoint's weights. Import is checked against the
 * exported values under several meshes and dtypes, and from a file written
 * the way the Hub's gpt2 files are (no prefix, mask buffers, F16). Damaged
 * headers are refused naming the file and the tensor. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/job/ckpt.h"
#include "daemon/job/safetensors.h"
#include "daemon/train/gpt.h"
#include "kernels/kern.h"
#include "kernels/kern_math.h"
#include "tests/unit/testutil.h"

#pragma GCC diagnostic ignored "-Wformat-truncation"


static char *g_data;
static const char *data_file(void) {
  if (!g_data) g_data = tu_token_file("st_tokens.bin", 100000, 7, 256);
  return g_data;
}

/* fsdp-launch -n N fsdp-train (tiny, this test's data) ARGS. */
static void launch(int n, const char *args, int want, char *out, size_t len) {
  tu_launch_tiny(n, data_file(), args, want, out, len);
}

/* A 2-rank run of 6 steps that checkpoints at step 6 (its directory in dir)
 * and saves the same weights to *weights. */
static void trained(char *dir, size_t len, char **weights) {
  static char out[1 << 16];
  char *root = tu_path("ckpt"), args[4096];
  mkdir(root, 0755);
  *weights = tu_path("trained.bin");
  snprintf(args, sizeof args, "--steps 6 --batch 2 --checkpoint_dir %s --checkpoint_every 6 "
           "--save %s", root, *weights);
  launch(2, args, 0, out, sizeof out);
  snprintf(dir, len, "%s/step-00000006", root);
  free(root);
}

static float *weights_of(const char *path, size_t *n) {
  gpt_t *g;
  cr_assert_eq(gpt_load(&g, path, kern_cpu()), 0, "%s", err_msg());
  *n = gpt_num_params(g);
  float *w = malloc(*n * sizeof *w);
  memcpy(w, gpt_params(g), *n * sizeof *w);
  gpt_destroy(g);
  return w;
}

/* Runs tests/reference/hf_gpt2.py ARGS; its stdout in out. */
static void hf_run(const char *args, char *out, size_t len) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/reference/hf_gpt2.py %s 2>&1", tu_root(), args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(out, 1, len - 1, p);
  out[n] = 0;
  int st = pclose(p);
  cr_assert_eq(st, 0, "%s failed (install python3-torch python3-numpy):\n%s", cmd, out);
}

/* The exported checkpoint, read by PyTorch into a Hugging Face-shaped GPT-2,
 * gives our model's loss on a batch within 1e-5 (fp32); bf16 exports load
 * too, within bf16's rounding. */
Test(safetensors, export_loads_in_pytorch_with_our_loss, .timeout = 180) {
  char dir[4096], args[8192], out[4096];
  char *w;
  trained(dir, sizeof dir, &w);
  char *f32 = tu_path("model.safetensors"), *bf16 = tu_path("model-bf16.safetensors");
  cr_assert_eq(safetensors_export_file(dir, SAFETENSORS_F32, f32), 0, "%s", err_msg());
  cr_assert_eq(safetensors_export_file(dir, SAFETENSORS_BF16, bf16), 0, "%s", err_msg());
  /* a batch, and our loss on it from the same weights */
  enum { B = 3, T = 32 };
  int32_t batch[2 + 2 * B * T] = {B, T};
  uint64_t s = 42;
  for (int i = 0; i < 2 * B * T; i++) batch[2 + i] = (int32_t)(tu_rand_u64(&s) % 256);
  char *bp = tu_path("batch.bin");
  tu_write_file(bp, batch, sizeof batch);
  gpt_t *g;
  cr_assert_eq(gpt_load(&g, w, kern_cpu()), 0, "%s", err_msg());
  float ours;
  cr_assert_eq(gpt_forward(g, batch + 2, batch + 2 + B * T, B, T, &ours), 0, "%s", err_msg());
  gpt_destroy(g);
  const char *files[] = {f32, bf16};
  const double tol[] = {1e-5, 2e-2};
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof args, "loss %s %s 4", files[i], bp);
    hf_run(args, out, sizeof out);
    double theirs;
    cr_assert_eq(sscanf(out, "loss %lf", &theirs), 1, "%s", out);
    const double rel = fabs(theirs - ours) / fabs(ours);
    cr_assert_leq(rel, tol[i], "%s: PyTorch's loss %.9g, ours %.9g: relative %.3e", files[i],
                  theirs, ours, rel);
  }
  free(f32), free(bf16), free(bp), free(w);
}

/* The exported values come back exactly under any mesh: fp32 under 1x3,
 * bf16 (rounded to nearest even) under 2x2 HYBRID, the Hub's layout (no
 * prefix, mask buffers, sorted) in F32 on one rank and in F16 on two, and
 * through a symbolic link (before, refused: helper-53). lr 0:
 * the steps change nothing, so the saved weights are the loaded ones. */
Test(safetensors, import_reads_the_exported_values_under_any_mesh, .timeout = 240) {
  static char out[1 << 16];
  char dir[4096], args[8192];
  char *w;
  trained(dir, sizeof dir, &w);
  size_t n, m;
  float *want = weights_of(w, &n);
  char *f32 = tu_path("in.safetensors"), *bf16 = tu_path("in-bf16.safetensors");
  char *hub = tu_path("hub.safetensors"), *hub16 = tu_path("hub16.safetensors");
  cr_assert_eq(safetensors_export_file(dir, SAFETENSORS_F32, f32), 0, "%s", err_msg());
  cr_assert_eq(safetensors_export_file(dir, SAFETENSORS_BF16, bf16), 0, "%s", err_msg());
  snprintf(args, sizeof args, "hub %s %s F32", f32, hub);
  hf_run(args, out, sizeof out);
  snprintf(args, sizeof args, "hub %s %s F16", f32, hub16);
  hf_run(args, out, sizeof out);
  /* a link to the file, as Hugging Face's cache keeps model.safetensors */
  char *link = tu_path("link.safetensors");
  cr_assert_eq(symlink(f32, link), 0);
  struct {
    const char *file;
    int ranks;
    const char *mesh;
    int round; /* 0 exact, 1 bf16, 2 f16 */
  } runs[] = {
      {f32, 3, "--batch 2 --mesh 1x3", 0},
      {bf16, 4, "--batch 1 --strategy HYBRID_SHARD --mesh 2x2", 1},
      {hub, 1, "--batch 2", 0},
      {hub16, 2, "--batch 2", 2},
      {link, 1, "--batch 2", 0},
  };
  for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
    char *got_path = tu_path("imported.bin");
    snprintf(args, sizeof args, "--steps 2 --warmup_steps 1 --lr 0 --weight_decay 0 %s --init_from %s --save %s",
             runs[r].mesh, runs[r].file, got_path);
    launch(runs[r].ranks, args, 0, out, sizeof out);
    float *got = weights_of(got_path, &m);
    cr_assert_eq(m, n);
    for (size_t i = 0; i < n; i++) {
      float e = want[i];
      if (runs[r].round == 1) e = kern_bf16_to_f32(kern_f32_to_bf16(e));
      if (runs[r].round == 2) e = (float)(_Float16)e;
      /* bit for bit, but a zero's sign: lr 0's AdamW step subtracts a signed
       * zero (-0 - -0 is +0), and a weight F16 rounds to -0 can meet one */
      cr_assert(e == 0 ? got[i] == 0 : !memcmp(&got[i], &e, sizeof e),
                "%s under %s: parameter %zu is %.9g, want %.9g", runs[r].file, runs[r].mesh, i,
                got[i], e);
    }
    free(got), free(got_path);
  }
  free(want), free(f32), free(bf16), free(hub), free(hub16), free(link), free(w);
}

/* ---- damaged headers ------------------------------------------------------------ */

typedef struct {
  json_t *header;
  uint8_t *data;
  size_t data_len;
} st_file_t;

static st_file_t st_read(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  uint8_t len8[8];
  cr_assert_eq(fread(len8, 1, 8, f), 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--) len = len << 8 | len8[i];
  char *text = malloc(len);
  cr_assert_eq(fread(text, 1, len, f), len);
  st_file_t s = {json_loadb(text, len, 0, NULL), NULL, 0};
  cr_assert_not_null(s.header);
  free(text);
  long at = ftell(f);
  fseek(f, 0, SEEK_END);
  s.data_len = (size_t)(ftell(f) - at);
  fseek(f, at, SEEK_SET);
  s.data = malloc(s.data_len);
  cr_assert_eq(fread(s.data, 1, s.data_len, f), s.data_len);
  fclose(f);
  return s;
}

/* Writes text as the header (length first) and data_len bytes of data. */
static void st_write(const char *path, const char *text, const uint8_t *data, size_t data_len) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  uint64_t len = strlen(text);
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(len >> (8 * i));
  fwrite(len8, 1, 8, f);
  fwrite(text, 1, len, f);
  fwrite(data, 1, data_len, f);
  fclose(f);
}

static void refused_with(const char *path, const char *const *want) {
  gpt_config_t tiny;
  gpt_config_preset(&tiny, "tiny");
  safetensors_t st;
  int fd;
  int rc = safetensors_open(path, &tiny, &fd, &st);
  cr_assert_neq(rc, 0, "a damaged header loaded (%s)", want[0]);
  cr_assert_not_null(strstr(err_msg(), path), "%s", err_msg());
  for (; *want; want++) cr_assert_not_null(strstr(err_msg(), *want), "no \"%s\" in: %s", *want, err_msg());
}

#define QKV "transformer.h.1.attn.c_attn.weight"

/* Each lie a header can tell is refused, naming the file, the tensor and
 * what is wrong; the good file loads. */
Test(safetensors, damaged_headers_are_refused_naming_the_tensor, .timeout = 120) {
  char dir[4096];
  char *w;
  trained(dir, sizeof dir, &w);
  char *good = tu_path("good.safetensors"), *bad = tu_path("bad.safetensors");
  cr_assert_eq(safetensors_export_file(dir, SAFETENSORS_F32, good), 0, "%s", err_msg());
  gpt_config_t tiny;
  gpt_config_preset(&tiny, "tiny");
  safetensors_t st;
  int fd;
  cr_assert_eq(safetensors_open(good, &tiny, &fd, &st), 0, "%s", err_msg());
  safetensors_free(&st);
  /* a FIFO at the export's path is refused, not renamed over */
  char *fifo = tu_path("export.fifo");
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(safetensors_export_file(dir, SAFETENSORS_F32, fifo), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "export: ") && strstr(err_msg(), "is a FIFO"), "%s", err_msg());
  struct stat fst;
  cr_assert(!stat(fifo, &fst) && S_ISFIFO(fst.st_mode), "the FIFO was replaced");
  free(fifo);
  close(fd);
  st_file_t s = st_read(good);
  json_t *qkv = json_object_get(s.header, QKV);
  cr_assert_not_null(qkv);
  const json_int_t b = json_integer_value(json_array_get(json_object_get(qkv, "data_offsets"), 0));
  const json_int_t e = json_integer_value(json_array_get(json_object_get(qkv, "data_offsets"), 1));
  struct {
    const char *key, *value; /* QKV's field set to value (JSON); key NULL: see extra */
    const char *extra;       /* a whole entry added, or "-name" to remove one */
    long cut;                /* bytes taken off (negative: added to) the data */
    const char *want[4];
  } cases[] = {
      {"dtype", "\"I32\"", NULL, 0, {QKV, "dtype I32", NULL}},
      {"dtype", "\"Q4\"", NULL, 0, {QKV, "unknown dtype", NULL}},
      {"dtype", "7", NULL, 0, {QKV, "dtype must be a string", NULL}},
      {"shape", "[192, 64]", NULL, 0, {QKV, "shape [192, 64]", "needs [64, 192]"}},
      {"shape", "[64, 191]", NULL, 0, {QKV, "lies about the tensor's size", NULL}},
      {"shape", "[4294967296, 4294967296]", NULL, 0, {QKV, "lies about the tensor's size", NULL}},
      {"data_offsets", "[B4, E4]", NULL, 0, {"tensors overlap", NULL, NULL}},
      {"data_offsets", "[B, 99999999999]", NULL, 0, {QKV, "data_offsets must be", NULL}},
      {"data_offsets", "[-1, E]", NULL, 0, {QKV, "data_offsets must be", NULL}},
      {NULL, NULL, "-transformer.ln_f.bias", 0, {"transformer.ln_f.bias", "is missing", NULL}},
      {NULL, NULL, "transformer.h.2.mlp.c_fc.bias", 0, {"h.2.mlp.c_fc.bias", "not a parameter", NULL}},
      {NULL, NULL, "lm_head.weight", 0, {"lm_head.weight", "both wte and lm_head", "ties its LM head"}},
      {NULL, NULL, "h.0.ln_1.weight", 0, {"ln_1.weight", "twice", NULL}},
      {NULL, NULL, NULL, 4, {"data_offsets must be", NULL, NULL}},
      {NULL, NULL, NULL, -4, {"a hole", "appended", NULL}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    json_t *h = json_deep_copy(s.header);
    if (cases[i].key) {
      char v[128];
      snprintf(v, sizeof v, "%s", cases[i].value);
      char *p;
      /* B, E: QKV's own offsets; B4, E4: both moved 4 bytes back, over its neighbour */
      char text[128];
      if ((p = strstr(v, "B4"))) snprintf(text, sizeof text, "[%lld, %lld]", (long long)b - 4, (long long)e - 4);
      else if (!strcmp(v, "[B, 99999999999]")) snprintf(text, sizeof text, "[%lld, 99999999999]", (long long)b);
      else if (!strcmp(v, "[-1, E]")) snprintf(text, sizeof text, "[-1, %lld]", (long long)e);
      else snprintf(text, sizeof text, "%s", v);
      json_object_set_new(json_object_get(h, QKV), cases[i].key, json_loads(text, JSON_DECODE_ANY, NULL));
    } else if (cases[i].extra && cases[i].extra[0] == '-') {
      json_object_del(h, cases[i].extra + 1);
    } else if (cases[i].extra) {
      json_t *copy = json_deep_copy(json_object_get(h, "transformer.ln_f.bias"));
      if (!strcmp(cases[i].extra, "h.0.ln_1.weight"))
        json_decref(copy), copy = json_deep_copy(json_object_get(h, "transformer.h.0.ln_1.weight"));
      if (!strcmp(cases[i].extra, "lm_head.weight")) /* a head beside wte: untied */
        json_decref(copy), copy = json_deep_copy(json_object_get(h, "transformer.wte.weight"));
      json_object_set_new(h, cases[i].extra, copy);
    }
    char *text = json_dumps(h, JSON_COMPACT);
    const size_t dl = cases[i].cut >= 0 ? s.data_len - (size_t)cases[i].cut : s.data_len + 4;
    uint8_t *data = calloc(dl, 1);
    memcpy(data, s.data, dl < s.data_len ? dl : s.data_len);
    st_write(bad, text, data, dl);
    refused_with(bad, cases[i].want);
    free(text), free(data);
    json_decref(h);
  }
  /* not JSON; a length beyond the file */
  uint8_t junk[64] = {40, 0, 0, 0, 0, 0, 0, 0, '{', 'x'};
  tu_write_file(bad, junk, sizeof junk);
  refused_with(bad, (const char *[]){"not a JSON object", NULL});
  junk[0] = 0, junk[1] = 1; /* 256 bytes of header in a 64-byte file */
  tu_write_file(bad, junk, sizeof junk);
  refused_with(bad, (const char *[]){"header length 256 exceeds the file", NULL});
  /* and a job started from a damaged file stops before training, saying why */
  static char out[1 << 16];
  char args[8192];
  snprintf(args, sizeof args, "--steps 2 --batch 2 --init_from %s", bad);
  launch(2, args, 1, out, sizeof out);
  cr_assert_not_null(strstr(out, "init_from"), "%s", out);
  cr_assert_not_null(strstr(out, "header length 256"), "%s", out);
  json_decref(s.header);
  free(s.data), free(good), free(bad), free(w);
}

/* An export builds its header from the manifest before it reads a shard; a
 * manifest whose model's byte counts overflow (the user writes the checkpoint
 * directory, the coordinator exports on its pool) is an error naming
 * manifest.json and the field, never an abort, and no file is left. */
Test(safetensors, an_export_of_an_impossible_model_is_refused) {
  char *dir = tu_path("huge"), man[4096], shard[4096];
  char *out = tu_path("huge.safetensors"), tmp[4096];
  mkdir(dir, 0755);
  static const char text[] =
      "{\"format\": \"fsdpd-checkpoint\", \"version\": 1, \"step\": 1, \"shards\": 1, "
      "\"replicas\": 1, \"strategy\": \"FULL_SHARD\", \"precision\": \"fp32\", "
      "\"min_params\": 0, \"shard_total\": 1099511627776, \"model\": {\"layers\": 1, "
      "\"channels\": 536870911, \"heads\": 1, \"vocab\": 2147483647, \"context\": "
      "2147483647}, \"units\": [], \"files\": [{\"shard\": 0, \"name\": "
      "\"shard-00000-of-00001.fsdp\", \"bytes\": 4096, \"xxh64\": \"0123456789abcdef\"}]}\n";
  snprintf(man, sizeof man, "%s/%s", dir, CKPT_MANIFEST);
  tu_write_file(man, text, sizeof text - 1);
  snprintf(shard, sizeof shard, "%s/shard-00000-of-00001.fsdp", dir);
  tu_write_file(shard, "x", 1);
  for (uint32_t dt = SAFETENSORS_F32; dt <= SAFETENSORS_BF16; dt++) {
    cr_assert_eq(safetensors_export_file(dir, dt, out), FSDP_EFORMAT, "%s", err_msg());
    cr_assert_not_null(strstr(err_msg(), man), "%s", err_msg());
    cr_assert_not_null(strstr(err_msg(), "channels"), "%s", err_msg());
  }
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  cr_assert(access(out, F_OK) && access(tmp, F_OK), "an export file was left");
  free(dir), free(out);
}

/* ---- shapes of degenerate models -------------------------------------------- */

/* A header laid out as GPT2LMHeadModel's state dict for model m (matrices
 * 2-D whatever their rows), with wpe 1-D instead when wpe_1d, and wte kept
 * under its tied name lm_head.weight when head; the verdict of
 * safetensors_parse. */
static int hf_layout_parses(gpt_config_t m, int wpe_1d, int head) {
  json_t *h = json_object();
  uint64_t off = 0;
  const int C = m.channels;
  const struct {
    const char *name;
    int rows, cols; /* rows 0: a vector of cols */
  } blk[] = {{"ln_1.weight", 0, C},        {"ln_1.bias", 0, C},          {"attn.c_attn.weight", C, 3 * C},
             {"attn.c_attn.bias", 0, 3 * C}, {"attn.c_proj.weight", C, C}, {"attn.c_proj.bias", 0, C},
             {"ln_2.weight", 0, C},        {"ln_2.bias", 0, C},          {"mlp.c_fc.weight", C, 4 * C},
             {"mlp.c_fc.bias", 0, 4 * C},  {"mlp.c_proj.weight", 4 * C, C}, {"mlp.c_proj.bias", 0, C}};
#define HF_T(key, rows, cols)                                                                     \
  do {                                                                                            \
    const uint64_t n_ = (rows) ? (uint64_t)(rows) * (uint64_t)(cols) : (uint64_t)(cols);          \
    json_t *shape_ = (rows) ? json_pack("[II]", (json_int_t)(rows), (json_int_t)(cols))           \
                            : json_pack("[I]", (json_int_t)(cols));                               \
    json_object_set_new(h, (key), json_pack("{s:s,s:o,s:[II]}", "dtype", "F32", "shape", shape_,  \
                                            "data_offsets", (json_int_t)off,                      \
                                            (json_int_t)(off + 4 * n_)));                         \
    off += 4 * n_;                                                                                \
  } while (0)
  HF_T(head ? "lm_head.weight" : "transformer.wte.weight", m.vocab, C);
  HF_T("transformer.wpe.weight", wpe_1d ? 0 : m.context, C);
  HF_T("transformer.ln_f.weight", 0, C);
  HF_T("transformer.ln_f.bias", 0, C);
  for (int l = 0; l < m.layers; l++)
    for (size_t i = 0; i < sizeof blk / sizeof *blk; i++) {
      char key[96];
      snprintf(key, sizeof key, "transformer.h.%d.%s", l, blk[i].name);
      HF_T(key, blk[i].rows, blk[i].cols);
    }
#undef HF_T
  char *text = json_dumps(h, JSON_COMPACT);
  json_decref(h);
  const size_t len = strlen(text), n = 8 + len;
  uint8_t *p = calloc(1, n);
  cr_assert_not_null(p);
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)len >> (8 * i));
  memcpy(p + 8, text, len);
  safetensors_t st;
  int rc = safetensors_parse(p, n, n + off, "hf.safetensors", &m, &st);
  if (!rc) safetensors_free(&st);
  free(p), free(text);
  return rc;
}

/* A model of context 1 or of channels 1 keeps its matrices 2-D, as Hugging
 * Face's layout does (before, a matrix of one row was taken for a vector:
 * wpe [C], a projection [1]; helper-53), and a vector where a matrix belongs
 * is still refused. */
Test(safetensors, matrices_of_one_row_stay_matrices) {
  cr_assert_eq(hf_layout_parses((gpt_config_t){1, 8, 2, 16, 4}, 0, 0), 0, "%s", err_msg());
  cr_assert_eq(hf_layout_parses((gpt_config_t){1, 8, 2, 16, 1}, 0, 0), 0, "context 1: %s", err_msg());
  cr_assert_eq(hf_layout_parses((gpt_config_t){1, 1, 1, 16, 4}, 0, 0), 0, "channels 1: %s", err_msg());
  cr_assert_neq(hf_layout_parses((gpt_config_t){1, 8, 2, 16, 1}, 1, 0), 0);
  cr_assert(strstr(err_msg(), "wpe"), "%s", err_msg());
}

/* The tied weight saved under its head's name alone (what
 * safetensors.torch.save_model may keep of GPT2LMHeadModel's shared wte and
 * lm_head.weight) is wte; before, such a file was refused as one "with a
 * separate head" (helper-53). Both names, a head beside wte, stay refused
 * (damaged_headers_are_refused_naming_the_tensor). */
Test(safetensors, a_tied_head_saved_under_its_name_is_wte, .timeout = 120) {
  cr_assert_eq(hf_layout_parses((gpt_config_t){2, 8, 2, 16, 4}, 0, 1), 0, "%s", err_msg());
  /* and its values load: an export with wte renamed, trained on at lr 0 */
  static char out[1 << 16];
  char dir[4096], args[8192];
  char *w, *f32 = tu_path("in.safetensors"), *head = tu_path("head.safetensors");
  char *got_path = tu_path("imported.bin");
  trained(dir, sizeof dir, &w);
  cr_assert_eq(safetensors_export_file(dir, SAFETENSORS_F32, f32), 0, "%s", err_msg());
  st_file_t s = st_read(f32);
  json_t *wte = json_object_get(s.header, "transformer.wte.weight");
  cr_assert_not_null(wte);
  json_object_set(s.header, "lm_head.weight", wte);
  json_object_del(s.header, "transformer.wte.weight");
  char *text = json_dumps(s.header, JSON_COMPACT);
  st_write(head, text, s.data, s.data_len);
  snprintf(args, sizeof args, "--steps 2 --warmup_steps 1 --lr 0 --weight_decay 0 --batch 2 "
           "--init_from %s --save %s", head, got_path);
  launch(1, args, 0, out, sizeof out);
  size_t n, m;
  float *want = weights_of(w, &n), *got = weights_of(got_path, &m);
  cr_assert_eq(m, n);
  for (size_t i = 0; i < n; i++) /* zeros by value: import_reads_the_exported_values_... */
    cr_assert(want[i] == 0 ? got[i] == 0 : !memcmp(&got[i], &want[i], sizeof *got),
              "parameter %zu is %.9g, want %.9g", i, got[i], want[i]);
  free(text), free(want), free(got), free(f32), free(head), free(got_path), free(w);
  json_decref(s.header), free(s.data);
}
