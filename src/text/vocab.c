/* A WordPiece vocabulary: vocab.txt read as Hugging Face's load_vocab (token = the line without its line end,
 * id = the line number, a later duplicate wins), held in two open-addressing hash tables: word-initial pieces
 * and continuation pieces ("##x" kept as "x"), so a lookup never builds a "##" string. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "core/text.h"
#include "text/text-impl.h"

#define MAX_VOCAB_BYTES ((long)1 << 30)

const char *const dt_wp_special_names[DT_WP_SPECIALS] = {"[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"};

uint32_t dt_vocab_hash(const char *s, size_t len) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

int32_t dt_vocab_find(const dt_vocab_table *t, const char *s, size_t len) {
  const uint32_t h = dt_vocab_hash(s, len);
  for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
    const dt_vocab_entry *e = &t->e[i];
    if (!e->s) return -1;
    if (e->hash == h && e->len == len && memcmp(e->s, s, len) == 0) return e->id;
  }
}

/* Inserts s, or gives it the new id: a later duplicate wins, as in a Python dict built line by line. */
static void put(dt_vocab_table *t, const char *s, uint32_t len, int32_t id) {
  const uint32_t h = dt_vocab_hash(s, len);
  for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
    dt_vocab_entry *e = &t->e[i];
    if (!e->s) {
      *e = (dt_vocab_entry){.s = s, .len = len, .hash = h, .id = id};
      t->n++;
      return;
    }
    if (e->hash == h && e->len == len && memcmp(e->s, s, len) == 0) {
      e->id = id;
      return;
    }
  }
}

static dt_status table_new(dt_vocab_table *t, size_t n) {
  size_t cap = 16;
  while (cap < 2 * n + 1) cap *= 2;
  t->mask = (uint32_t)cap - 1;
  return dt_alloc_array(cap, sizeof *t->e, "vocabulary", (void **)&t->e);
}

/* The whole file, NUL-terminated, into *out (*len bytes before the NUL). */
static dt_status slurp(const char *path, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return dt_error(errno == ENOENT ? DT_NOT_FOUND : DT_IO, "%s: %s", path, strerror(errno));
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size < 0 || size > MAX_VOCAB_BYTES || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return dt_error(DT_CORRUPT, "%s: not a readable vocabulary file of at most 1 GiB", path);
  }
  dt_status st = dt_alloc_array((size_t)size + 1, 1, "vocabulary file", (void **)out);
  if (st == DT_OK && fread(*out, 1, (size_t)size, f) != (size_t)size)
    st = dt_error(DT_IO, "%s: read failed", path);
  fclose(f);
  *len = (size_t)size;
  return st;
}

/* Every line is a token: NUL-terminated in place, UTF-8 checked, put in its table. */
static dt_status index_lines(const char *path, dt_wordpiece *t, size_t len) {
  size_t lines = 0;
  for (size_t i = 0; i < len; i++) lines += t->blob[i] == '\n';
  lines += len && t->blob[len - 1] != '\n';
  if (lines == 0 || lines > INT32_MAX) return dt_error(DT_CORRUPT, "%s: %zu tokens, expected 1 to 2^31-1", path, lines);
  DT_CHECK(table_new(&t->first, lines));
  DT_CHECK(table_new(&t->cont, lines));
  for (size_t at = 0, line = 0; at < len; line++) {
    char *nl = memchr(t->blob + at, '\n', len - at), *s = t->blob + at;
    size_t n = (nl ? (size_t)(nl - t->blob) : len) - at, next = at + n + 1;
    if (n && s[n - 1] == '\r') n--; /* Python's universal newlines read "\r\n" as "\n" */
    s[n] = '\0';
    if (!dt_utf8_valid(s, n)) return dt_error(DT_CORRUPT, "%s:%zu: the token is not valid UTF-8", path, line + 1);
    if (n > 2 && s[0] == '#' && s[1] == '#') put(&t->cont, s + 2, (uint32_t)n - 2, (int32_t)line);
    put(&t->first, s, (uint32_t)n, (int32_t)line); /* "##x" is also a word-initial token "##x" */
    at = next;
  }
  t->size = (int64_t)lines;
  return DT_OK;
}

dt_status dt_wordpiece_load(const char *path, int lower_case, dt_wordpiece **out) {
  if (!path || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_wordpiece_load: NULL argument");
  dt_wordpiece *t = NULL;
  size_t len = 0;
  DT_CHECK(dt_alloc(sizeof *t, (void **)&t));
  t->lower = lower_case != 0;
  dt_status st = slurp(path, &t->blob, &len);
  if (st == DT_OK) st = index_lines(path, t, len);
  for (int k = 0; st == DT_OK && k < DT_WP_SPECIALS; k++)
    t->special_id[k] = dt_vocab_find(&t->first, dt_wp_special_names[k], strlen(dt_wp_special_names[k]));
  t->sp = (dt_wordpiece_special){.unk = t->special_id[0], .sep = t->special_id[1], .pad = t->special_id[2],
                                 .cls = t->special_id[3]};
  for (int k = 0; st == DT_OK && k < 4; k++)
    if (t->special_id[k] < 0)
      st = dt_error(DT_CORRUPT, "%s: the vocabulary has no %s token (a BERT vocab.txt has [PAD] [UNK] [CLS] [SEP])",
                    path, dt_wp_special_names[k]);
  if (st != DT_OK) {
    dt_wordpiece_free(t);
    return st;
  }
  *out = t;
  return DT_OK;
}

void dt_wordpiece_free(dt_wordpiece *t) {
  if (!t) return;
  dt_free(t->first.e);
  dt_free(t->cont.e);
  dt_free(t->blob);
  dt_free(t);
}

int64_t dt_wordpiece_vocab_size(const dt_wordpiece *t) { return t ? t->size : 0; }

int32_t dt_wordpiece_token_id(const dt_wordpiece *t, const char *token) {
  return t && token ? dt_vocab_find(&t->first, token, strlen(token)) : -1;
}

dt_wordpiece_special dt_wordpiece_specials(const dt_wordpiece *t) { return t->sp; }
