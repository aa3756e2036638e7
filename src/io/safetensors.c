/* safetensors files: a checked reader (whole file in memory, tensors as views, crc32 verified) and an atomic writer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/impl.h"
#include "core/text.h"
#include "dtrain/checkpoint.h"
#include "io/json.h"

/* The reference implementation refuses headers above 100 MB; so do we. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

/* safetensors dtype names in dtrain's dtype order (tensor.h DT_DTYPE_MAP). */
static const char *const st_dtype_names[DT_DTYPE_COUNT] = {"F32", "BF16", "F16", "I32", "I64", "F64"};
/* Valid safetensors dtypes that dtrain does not hold. */
static const char *const st_unsupported[] = {"BOOL", "U8", "I8", "I16", "U16", "U32", "U64", "F8_E5M2",
                                             "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};

typedef struct st_entry {
  const char *name; /* in the JSON string pool */
  dt_tensor tensor; /* view into the image, or into `copy` when the file's offset is misaligned */
  uint64_t begin, end; /* byte range in the data buffer */
  void *copy;
} st_entry;

struct dt_safetensors {
  uint8_t *block;     /* allocation holding the file image */
  dt_json header;     /* parsed header; names and metadata point into its pool */
  st_entry *entries;  /* header order */
  int n;
  dt_kv *meta;
  int n_meta;
};

static int host_is_little_endian(void) {
  const uint16_t one = 1;
  uint8_t b;
  memcpy(&b, &one, 1);
  return b == 1;
}

/* zlib's crc32 takes a 32-bit length; tensors can be larger, so feed 1 GiB at a time. */
static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n) {
  uLong c = crc;
  while (n) {
    size_t k = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    c = crc32(c, p, (uInt)k);
    p += k;
    n -= k;
  }
  return (uint32_t)c;
}

/* "dtrain.crc32" values are exactly 8 hex digits; anything else means the header was damaged or forged. */
static int parse_crc_hex(const char *s, uint32_t *out) {
  uint32_t v = 0;
  for (int i = 0; i < 8; i++) {
    char c = s[i];
    uint32_t d;
    if (c >= '0' && c <= '9') d = (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f') d = (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') d = (uint32_t)(c - 'A' + 10);
    else return 0; /* also stops at the NUL of a short value */
    v = v << 4 | d;
  }
  if (s[8] != '\0') return 0;
  *out = v;
  return 1;
}

void dt_safetensors_free(dt_safetensors *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) dt_free(f->entries[i].copy);
  dt_free(f->entries);
  dt_free(f->meta);
  dt_json_free(&f->header);
  dt_free(f->block);
  dt_free(f);
}

static int find_child(const dt_json *doc, int obj, const char *key) {
  for (int j = obj + 1; j < doc->nodes[obj].end; j = doc->nodes[j].end)
    if (doc->nodes[j].key_len == strlen(key) && memcmp(doc->nodes[j].key, key, doc->nodes[j].key_len) == 0) return j;
  return -1;
}

static int dtype_lookup(const char *s, size_t len, dt_dtype *out) {
  for (int i = 0; i < DT_DTYPE_COUNT; i++)
    if (strlen(st_dtype_names[i]) == len && memcmp(st_dtype_names[i], s, len) == 0) {
      *out = (dt_dtype)i;
      return 1;
    }
  return 0;
}

static int dtype_known_unsupported(const char *s, size_t len) {
  for (size_t i = 0; i < sizeof st_unsupported / sizeof st_unsupported[0]; i++)
    if (strlen(st_unsupported[i]) == len && memcmp(st_unsupported[i], s, len) == 0) return 1;
  return 0;
}

/* Reads one tensor description (node v, key = name) into e; data pointers set later. */
static dt_status parse_entry(const char *what, const dt_json *doc, int v, uint64_t data_len, st_entry *e) {
  const dt_json_node *node = &doc->nodes[v];
  const char *name = node->key;
  if (node->key_len == 0) return dt_error(DT_CORRUPT, "%s: a tensor has an empty name", what);
  if (strlen(name) != node->key_len) return dt_error(DT_CORRUPT, "%s: tensor name \"%s\" holds a NUL character", what, name);
  if (node->type != DT_JSON_OBJECT) return dt_error(DT_CORRUPT, "%s: tensor \"%s\": description is not an object", what, name);
  int jd = find_child(doc, v, "dtype"), js = find_child(doc, v, "shape"), jo = find_child(doc, v, "data_offsets");
  if (jd < 0 || js < 0 || jo < 0)
    return dt_error(DT_CORRUPT, "%s: tensor \"%s\": missing \"%s\"", what, name,
                    jd < 0 ? "dtype" : js < 0 ? "shape" : "data_offsets");
  if (node->count != 3) {
    for (int j = v + 1; j < node->end; j = doc->nodes[j].end)
      if (j != jd && j != js && j != jo)
        return dt_error(DT_CORRUPT, "%s: tensor \"%s\": unexpected field \"%.100s\"", what, name, doc->nodes[j].key);
  }

  const dt_json_node *d = &doc->nodes[jd];
  if (d->type != DT_JSON_STRING) return dt_error(DT_CORRUPT, "%s: tensor \"%s\": dtype is not a string", what, name);
  dt_dtype dtype;
  if (!dtype_lookup(d->str, d->str_len, &dtype)) {
    if (dtype_known_unsupported(d->str, d->str_len))
      return dt_error(DT_UNSUPPORTED, "%s: tensor \"%s\": dtype %s is valid safetensors but dtrain holds only F32, BF16, F16, I32, I64, F64",
                      what, name, d->str);
    return dt_error(DT_CORRUPT, "%s: tensor \"%s\": unknown dtype \"%.40s\"", what, name, d->str);
  }

  const dt_json_node *s = &doc->nodes[js];
  if (s->type != DT_JSON_ARRAY) return dt_error(DT_CORRUPT, "%s: tensor \"%s\": shape is not an array", what, name);
  if (s->count > DT_MAX_DIMS)
    return dt_error(DT_UNSUPPORTED, "%s: tensor \"%s\" has %d dimensions; dtrain holds at most %d", what, name, s->count,
                    DT_MAX_DIMS);
  int64_t shape[DT_MAX_DIMS];
  uint64_t bytes = dt_dtype_size(dtype);
  int k = 0;
  for (int j = js + 1; j < s->end; j = doc->nodes[j].end, k++) {
    const dt_json_node *dim = &doc->nodes[j];
    if (dim->type != DT_JSON_NUMBER || !dim->is_int)
      return dt_error(DT_CORRUPT, "%s: tensor \"%s\": shape[%d] is not an integer", what, name, k);
    if (dim->negative && dim->magnitude != 0)
      return dt_error(DT_CORRUPT, "%s: tensor \"%s\": shape[%d] is negative (-%llu)", what, name, k,
                      (unsigned long long)dim->magnitude);
    if (dim->magnitude > (uint64_t)INT64_MAX || __builtin_mul_overflow(bytes, dim->magnitude, &bytes))
      return dt_error(DT_CORRUPT, "%s: tensor \"%s\": shape product overflows", what, name);
    shape[k] = (int64_t)dim->magnitude;
  }

  const dt_json_node *o = &doc->nodes[jo];
  if (o->type != DT_JSON_ARRAY || o->count != 2)
    return dt_error(DT_CORRUPT, "%s: tensor \"%s\": data_offsets is not [begin, end]", what, name);
  const dt_json_node *b = &doc->nodes[jo + 1], *en = &doc->nodes[doc->nodes[jo + 1].end];
  if (b->type != DT_JSON_NUMBER || !b->is_int || b->negative || en->type != DT_JSON_NUMBER || !en->is_int ||
      en->negative)
    return dt_error(DT_CORRUPT, "%s: tensor \"%s\": data_offsets are not non-negative integers", what, name);
  uint64_t begin = b->magnitude, end = en->magnitude;
  if (end < begin)
    return dt_error(DT_CORRUPT, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before begin", what, name,
                    (unsigned long long)begin, (unsigned long long)end);
  if (end - begin != bytes)
    return dt_error(DT_CORRUPT, "%s: tensor \"%s\": data_offsets [%llu, %llu] span %llu bytes, shape and dtype need %llu",
                    what, name, (unsigned long long)begin, (unsigned long long)end,
                    (unsigned long long)(end - begin), (unsigned long long)bytes);
  if (end > data_len)
    return dt_error(DT_CORRUPT,
                    "%s: tensor \"%s\": data_offsets [%llu, %llu] outside the %llu-byte data buffer (truncated file?)",
                    what, name, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_len);

  memset(e, 0, sizeof *e);
  e->name = name;
  e->begin = begin;
  e->end = end;
  e->tensor.dtype = dtype;
  e->tensor.device = DT_CPU;
  e->tensor.ndim = s->count;
  for (int i = 0; i < s->count; i++) e->tensor.shape[i] = shape[i];
  return DT_OK;
}

static dt_status parse_metadata(const char *what, const dt_json *doc, int v, dt_safetensors *f) {
  const dt_json_node *m = &doc->nodes[v];
  if (m->type != DT_JSON_OBJECT) return dt_error(DT_CORRUPT, "%s: __metadata__ is not an object", what);
  if (m->count == 0) return DT_OK;
  DT_CHECK(dt_alloc_array((size_t)m->count, sizeof *f->meta, "safetensors metadata", (void **)&f->meta));
  for (int j = v + 1; j < m->end; j = doc->nodes[j].end) {
    const dt_json_node *kv = &doc->nodes[j];
    if (kv->type != DT_JSON_STRING)
      return dt_error(DT_CORRUPT, "%s: __metadata__ \"%.100s\" is not a string", what, kv->key);
    if (strlen(kv->key) != kv->key_len || strlen(kv->str) != kv->str_len)
      return dt_error(DT_CORRUPT, "%s: __metadata__ \"%.100s\" holds a NUL character", what, kv->key);
    f->meta[f->n_meta++] = (dt_kv){kv->key, kv->str};
  }
  return DT_OK;
}

static int entry_order(const void *a, const void *b) {
  const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

/* The spec: the data buffer is fully indexed, tensors neither overlap nor leave holes. */
static dt_status check_coverage(const char *what, dt_safetensors *f, uint64_t data_len) {
  const st_entry **order = NULL;
  dt_status st = DT_OK;
  if (f->n == 0) {
    if (data_len) return dt_error(DT_CORRUPT, "%s: %llu data bytes but no tensors", what, (unsigned long long)data_len);
    return DT_OK;
  }
  DT_CHECK(dt_alloc_array((size_t)f->n, sizeof *order, "safetensors check", (void **)&order));
  for (int i = 0; i < f->n; i++) order[i] = &f->entries[i];
  qsort(order, (size_t)f->n, sizeof *order, entry_order);
  uint64_t pos = 0;
  const st_entry *prev = NULL;
  for (int i = 0; i < f->n && st == DT_OK; i++) {
    const st_entry *e = order[i];
    if (e->begin < pos)
      st = dt_error(DT_CORRUPT, "%s: tensors \"%s\" [%llu, %llu) and \"%s\" [%llu, %llu) overlap", what, prev->name,
                    (unsigned long long)prev->begin, (unsigned long long)prev->end, e->name,
                    (unsigned long long)e->begin, (unsigned long long)e->end);
    else if (e->begin > pos)
      st = dt_error(DT_CORRUPT, "%s: data bytes [%llu, %llu) belong to no tensor (a hole before \"%s\")", what,
                    (unsigned long long)pos, (unsigned long long)e->begin, e->name);
    pos = e->end;
    prev = e;
  }
  if (st == DT_OK && pos != data_len)
    st = dt_error(DT_CORRUPT, "%s: data bytes [%llu, %llu) after the last tensor belong to no tensor", what,
                  (unsigned long long)pos, (unsigned long long)data_len);
  dt_free(order);
  return st;
}

/* Files dtrain wrote carry the crc32 of their data section; files from other
 * writers (PyTorch, Hugging Face) have none and are taken as they are. The file
 * is already in memory, so this is one pass over bytes we hold anyway. */
static dt_status verify_crc(const char *what, const dt_safetensors *f, const uint8_t *data, uint64_t data_len) {
  const char *want_hex = dt_safetensors_meta(f, DT_SAFETENSORS_CRC_KEY);
  if (!want_hex) return DT_OK;
  uint32_t want;
  if (!parse_crc_hex(want_hex, &want))
    return dt_error(DT_CORRUPT, "%s: __metadata__ \"%s\" is \"%.40s\", not 8 hex digits", what, DT_SAFETENSORS_CRC_KEY,
                    want_hex);
  uint32_t got = crc_update((uint32_t)crc32(0L, Z_NULL, 0), data, (size_t)data_len);
  if (got != want)
    return dt_error(DT_CORRUPT,
                    "%s: the file is damaged: crc32 of the %llu data bytes expected %08x (header's %s), found %08x; "
                    "restore it from a copy or write it again",
                    what, (unsigned long long)data_len, (unsigned)want, DT_SAFETENSORS_CRC_KEY, (unsigned)got);
  return DT_OK;
}

/* Parses the image at img[0..len) (inside f->block, which f owns). */
static dt_status parse_image(const char *what, dt_safetensors *f, const uint8_t *img, size_t len) {
  uint64_t n;
  memcpy(&n, img, 8);
  const char *text = (const char *)img + 8;
  uint64_t data_len = len - 8 - n;
  const uint8_t *data = img + 8 + n;
  if (n == 0 || text[0] != '{') return dt_error(DT_CORRUPT, "%s: header does not start with '{'", what);
  dt_status st = dt_json_parse(text, (size_t)n, &f->header);
  if (st != DT_OK) return dt_error_prefix(st, "%s: header", what);
  const dt_json *doc = &f->header;
  int count = doc->nodes[0].count;
  if (count) DT_CHECK(dt_alloc_array((size_t)count, sizeof *f->entries, "safetensors entries", (void **)&f->entries));
  for (int j = 1; j < doc->nodes[0].end; j = doc->nodes[j].end) {
    if (strcmp(doc->nodes[j].key, "__metadata__") == 0 && doc->nodes[j].key_len == 12) {
      DT_CHECK(parse_metadata(what, doc, j, f));
      continue;
    }
    DT_CHECK(parse_entry(what, doc, j, data_len, &f->entries[f->n]));
    f->n++;
  }
  DT_CHECK(check_coverage(what, f, data_len));
  DT_CHECK(verify_crc(what, f, data, data_len));
  for (int i = 0; i < f->n; i++) {
    st_entry *e = &f->entries[i];
    const uint8_t *src = data + e->begin;
    size_t bytes = (size_t)(e->end - e->begin), align = dt_dtype_size(e->tensor.dtype);
    if ((uintptr_t)src % align == 0) {
      e->tensor.data = (void *)src;
    } else { /* a writer that did not align offsets: keep an aligned copy so views are safe to read */
      DT_CHECK(dt_alloc(bytes ? bytes : 1, &e->copy));
      memcpy(e->copy, src, bytes);
      e->tensor.data = e->copy;
    }
  }
  return DT_OK;
}

/* Allocates a block for a file of `len` bytes whose header length is n, placed
 * so that its data buffer starts 64-byte aligned; returns the image start. */
static dt_status alloc_image(size_t len, uint64_t n, uint8_t **block, uint8_t **img) {
  size_t pad = (size_t)((DT_ALIGN - (8 + n) % DT_ALIGN) % DT_ALIGN);
  DT_CHECK(dt_alloc_array(1, len + pad, "safetensors file", (void **)block));
  *img = *block + pad;
  return DT_OK;
}

static dt_status check_sizes(const char *what, size_t len, uint64_t n) {
  if (!host_is_little_endian()) return dt_error(DT_UNSUPPORTED, "%s: safetensors needs a little-endian host", what);
  /* A length written big-endian reads as an absurd number; say so rather than only "too long". */
  uint64_t swapped = __builtin_bswap64(n);
  const char *endian_hint = swapped > 0 && swapped <= len - 8 && swapped < n
                                ? " (it fits when read big-endian: the length field must be little-endian)"
                                : "";
  if (n > ST_MAX_HEADER)
    return dt_error(DT_CORRUPT, "%s: header length %llu exceeds the 100 MB limit%s", what, (unsigned long long)n,
                    endian_hint);
  if (n > len - 8)
    return dt_error(DT_CORRUPT, "%s: header length %llu exceeds the %zu bytes after the length field%s", what,
                    (unsigned long long)n, len - 8, endian_hint[0] ? endian_hint : " (truncated file?)");
  return DT_OK;
}

dt_status dt_safetensors_parse(const uint8_t *buf, size_t len, dt_safetensors **out) {
  const char *what = "<memory>";
  if (!buf && len) return dt_error(DT_INVALID_ARGUMENT, "safetensors parse: NULL buffer");
  if (len < 8) return dt_error(DT_CORRUPT, "%s: %zu bytes, shorter than the 8-byte header length", what, len);
  uint64_t n;
  memcpy(&n, buf, 8);
  DT_CHECK(check_sizes(what, len, n));
  dt_safetensors *f = NULL;
  DT_CHECK(dt_alloc(sizeof *f, (void **)&f));
  uint8_t *img;
  dt_status st;
  DT_CHECK_GOTO(alloc_image(len, n, &f->block, &img), st, fail);
  memcpy(img, buf, len);
  DT_CHECK_GOTO(parse_image(what, f, img, len), st, fail);
  *out = f;
  return DT_OK;
fail:
  dt_safetensors_free(f);
  return st;
}

dt_status dt_safetensors_load(const char *path, dt_safetensors **out) {
  dt_status st = DT_OK;
  dt_safetensors *f = NULL;
  if (!path || !out) return dt_error(DT_INVALID_ARGUMENT, "safetensors load: NULL argument");
  FILE *fp;
  size_t len;
  DT_CHECK(dt_file_open_regular(path, &fp, &len));
  uint8_t head[8];
  if (len < 8 || fread(head, 1, 8, fp) != 8) {
    st = dt_error(DT_CORRUPT, "%s: %zu bytes, shorter than the 8-byte header length", path, len);
    goto done;
  }
  uint64_t n;
  memcpy(&n, head, 8);
  DT_CHECK_GOTO(check_sizes(path, len, n), st, done);
  DT_CHECK_GOTO(dt_alloc(sizeof *f, (void **)&f), st, done);
  uint8_t *img;
  DT_CHECK_GOTO(alloc_image(len, n, &f->block, &img), st, done);
  memcpy(img, head, 8);
  DT_CHECK_GOTO(dt_file_read_exact(fp, path, img + 8, len - 8), st, done);
  DT_CHECK_GOTO(parse_image(path, f, img, len), st, done);
done:
  fclose(fp);
  if (st != DT_OK) {
    dt_safetensors_free(f);
    return st;
  }
  *out = f;
  return DT_OK;
}

int dt_safetensors_count(const dt_safetensors *f) { return f ? f->n : 0; }

dt_status dt_safetensors_get(const dt_safetensors *f, int i, dt_named_tensor *out) {
  if (!f || !out || i < 0 || i >= f->n)
    return dt_error(DT_INVALID_ARGUMENT, "safetensors: tensor index %d outside 0..%d", i, f ? f->n - 1 : -1);
  out->name = f->entries[i].name;
  out->tensor = f->entries[i].tensor;
  return DT_OK;
}

dt_status dt_safetensors_find(const dt_safetensors *f, const char *name, dt_named_tensor *out) {
  if (!f || !name || !out) return dt_error(DT_INVALID_ARGUMENT, "safetensors find: NULL argument");
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->entries[i].name, name) == 0) return dt_safetensors_get(f, i, out);
  return dt_error(DT_NOT_FOUND, "safetensors: no tensor named \"%s\"", name);
}

const char *dt_safetensors_meta(const dt_safetensors *f, const char *key) {
  if (!f || !key) return NULL;
  for (int i = 0; i < f->n_meta; i++)
    if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
  return NULL;
}

int dt_safetensors_meta_count(const dt_safetensors *f) { return f ? f->n_meta : 0; }

dt_kv dt_safetensors_meta_at(const dt_safetensors *f, int i) {
  if (!f || i < 0 || i >= f->n_meta) return (dt_kv){NULL, NULL};
  return f->meta[i];
}

/* ---- writing ----------------------------------------------------------------- */

static int str_ptr_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Names non-empty, unique, not "__metadata__"; dtypes and data valid. */
static dt_status check_inputs(const char *path, const dt_named_tensor *t, int n, const dt_kv *meta, int n_meta) {
  if (n < 0 || n_meta < 0 || (n && !t) || (n_meta && !meta))
    return dt_error(DT_INVALID_ARGUMENT, "%s: bad tensor or metadata list", path);
  for (int i = 0; i < n; i++) {
    const dt_tensor *x = &t[i].tensor;
    if (!t[i].name || !t[i].name[0]) return dt_error(DT_INVALID_ARGUMENT, "%s: tensor %d has no name", path, i);
    if (!dt_utf8_valid(t[i].name, strlen(t[i].name)))
      return dt_error(DT_INVALID_ARGUMENT, "%s: tensor %d: name is not valid UTF-8", path, i);
    if (strcmp(t[i].name, "__metadata__") == 0)
      return dt_error(DT_INVALID_ARGUMENT, "%s: \"__metadata__\" is reserved and cannot name a tensor", path);
    if ((unsigned)x->dtype >= DT_DTYPE_COUNT || x->ndim < 0 || x->ndim > DT_MAX_DIMS || x->device != DT_CPU)
      return dt_error(DT_INVALID_ARGUMENT, "%s: tensor \"%s\": bad dtype, rank or device", path, t[i].name);
    for (int d = 0; d < x->ndim; d++)
      if (x->shape[d] < 0) return dt_error(DT_INVALID_ARGUMENT, "%s: tensor \"%s\": negative dimension", path, t[i].name);
    if (!x->data && dt_tensor_bytes(x) > 0)
      return dt_error(DT_INVALID_ARGUMENT, "%s: tensor \"%s\" has no data", path, t[i].name);
  }
  for (int i = 0; i < n_meta; i++)
  {
    if (!meta[i].key || !meta[i].value) return dt_error(DT_INVALID_ARGUMENT, "%s: metadata %d is NULL", path, i);
    if (!dt_utf8_valid(meta[i].key, strlen(meta[i].key)) || !dt_utf8_valid(meta[i].value, strlen(meta[i].value)))
      return dt_error(DT_INVALID_ARGUMENT, "%s: metadata \"%.100s\" is not valid UTF-8", path, meta[i].key);
  }
  int most = n > n_meta ? n : n_meta;
  if (most < 2) return DT_OK;
  const char **names = NULL;
  DT_CHECK(dt_alloc_array((size_t)most, sizeof *names, "name check", (void **)&names));
  dt_status st = DT_OK;
  for (int pass = 0; pass < 2 && st == DT_OK; pass++) {
    int count = pass ? n_meta : n;
    for (int i = 0; i < count; i++) names[i] = pass ? meta[i].key : t[i].name;
    qsort(names, (size_t)count, sizeof *names, str_ptr_cmp);
    for (int i = 1; i < count; i++)
      if (strcmp(names[i - 1], names[i]) == 0) {
        st = dt_error(DT_INVALID_ARGUMENT, "%s: %s \"%s\" appears twice", path, pass ? "metadata key" : "tensor name",
                      names[i]);
        break;
      }
  }
  dt_free(names);
  return st;
}

/* crc32 of the data section as it will be written: the tensors' bytes in file
 * order, taken from memory so the file is never read back. */
static uint32_t tensors_crc(const dt_named_tensor *t, int n) {
  uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
  for (int i = 0; i < n; i++) crc = crc_update(crc, t[i].tensor.data, dt_tensor_bytes(&t[i].tensor));
  return crc;
}

/* The header JSON, space-padded so that 8 + its length is a multiple of 8.
 * Metadata: the caller's entries in order (less any "dtrain.crc32"), then ours. */
static dt_status build_header(const dt_named_tensor *t, int n, const dt_kv *meta, int n_meta, uint32_t crc,
                              dt_buf *h) {
  uint64_t off = 0;
  dt_buf_append(h, "{\"__metadata__\":{", 17);
  for (int i = 0; i < n_meta; i++) {
    if (strcmp(meta[i].key, DT_SAFETENSORS_CRC_KEY) == 0) continue;
    dt_buf_json_string(h, meta[i].key);
    dt_buf_append(h, ":", 1);
    dt_buf_json_string(h, meta[i].value);
    dt_buf_append(h, ",", 1);
  }
  dt_buf_printf(h, "\"%s\":\"%08x\"}", DT_SAFETENSORS_CRC_KEY, (unsigned)crc);
  for (int i = 0; i < n; i++) {
    const dt_tensor *x = &t[i].tensor;
    uint64_t bytes = dt_tensor_bytes(x);
    dt_buf_append(h, ",", 1);
    dt_buf_json_string(h, t[i].name);
    dt_buf_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_names[x->dtype]);
    for (int d = 0; d < x->ndim; d++) dt_buf_printf(h, "%s%lld", d ? "," : "", (long long)x->shape[d]);
    dt_buf_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + bytes));
    off += bytes;
  }
  dt_buf_append(h, "}", 1);
  while (h->status == DT_OK && h->len % 8) dt_buf_append(h, " ", 1);
  return h->status;
}

dt_status dt_safetensors_save(const char *path, const dt_named_tensor *tensors, int n, const dt_kv *meta,
                              int n_meta) {
  if (!path || !path[0]) return dt_error(DT_INVALID_ARGUMENT, "safetensors save: no path");
  if (!host_is_little_endian()) return dt_error(DT_UNSUPPORTED, "%s: safetensors needs a little-endian host", path);
  DT_CHECK(check_inputs(path, tensors, n, meta, n_meta));
  dt_buf header = {0};
  dt_atomic_file a;
  dt_status st = build_header(tensors, n, meta, n_meta, tensors_crc(tensors, n), &header);
  if (st == DT_OK) st = dt_atomic_open(&a, path);
  if (st == DT_OK) {
    uint64_t hl = header.len; /* the length field: little-endian, as the host (checked above) */
    dt_atomic_write(&a, &hl, 8);
    dt_atomic_write(&a, header.data, header.len);
    for (int i = 0; i < n; i++) dt_atomic_write(&a, tensors[i].tensor.data, dt_tensor_bytes(&tensors[i].tensor));
    st = dt_atomic_commit(&a);
  }
  dt_buf_free(&header);
  return st;
}
