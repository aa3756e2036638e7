/* MovieLens file readers: ratings.csv/.dat and movies.csv/.dat, one read of the file and a strict hand-written parser. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "core/text.h"
#include "data/movielens.h"

#define MAX_COLS 8 /* columns counted per line; more are reported as "8 or more" */

typedef struct span {
  const char *p;
  size_t n;
} span;

static const char *const ratings_header = "userId,movieId,rating,timestamp";
static const char *const movies_header = "movieId,title,genres";
static const char *const col_csv[4] = {"userId", "movieId", "rating", "timestamp"};
static const char *const col_dat[4] = {"UserID", "MovieID", "Rating", "Timestamp"};

/* The whole file, NUL-terminated (the parsers never read past len; the NUL is for safety). */
static dt_status read_file(const char *path, char **buf, size_t *len) {
  FILE *f = NULL;
  size_t n = 0;
  DT_CHECK(dt_file_open_regular(path, &f, &n));
  char *b = NULL;
  dt_status st = dt_alloc_array(n + 1, 1, path, (void **)&b);
  if (st == DT_OK) st = dt_file_read_exact(f, path, b, n);
  fclose(f);
  if (st != DT_OK) {
    dt_free(b);
    return st;
  }
  *buf = b;
  *len = n;
  return DT_OK;
}

/* Up to 24 bytes of s for a message, non-printable bytes as \xNN, "..." when cut. */
static const char *show(span s, char out[112]) {
  size_t k = 0;
  for (size_t i = 0; i < s.n && i < 24; i++) {
    const unsigned char c = (unsigned char)s.p[i];
    if (c >= 0x20 && c < 0x7f) out[k++] = (char)c;
    else k += (size_t)snprintf(out + k, 5, "\\x%02x", c);
  }
  if (s.n > 24) memcpy(out + k, "...", 3), k += 3;
  out[k] = '\0';
  return out;
}

static dt_status bad_line(const char *path, int64_t line, const char *fmt, ...) DT_PRINTF(3, 4);
static dt_status bad_line(const char *path, int64_t line, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return dt_error(DT_CORRUPT, "%s:%lld: %s", path, (long long)line, what);
}

/* The line at *p: [p, end of line) without its "\n" or "\r\n"; *p moves to the next line. */
static span next_line(const char **p, const char *end) {
  const char *s = *p, *nl = memchr(s, '\n', (size_t)(end - s));
  const char *e = nl ? nl : end;
  *p = nl ? nl + 1 : end;
  if (e > s && e[-1] == '\r') e--;
  return (span){s, (size_t)(e - s)};
}

static int span_is(span s, const char *text) { return s.n == strlen(text) && memcmp(s.p, text, s.n) == 0; }

/* Splits line at ',' (CSV, unquoted) or "::" (DAT) into f[0..MAX_COLS); returns the column count, up to MAX_COLS. */
static int split(span line, dt_ml_format fmt, span *f) {
  int k = 0;
  const char *s = line.p, *e = line.p + line.n, *start = s;
  while (s < e && k < MAX_COLS - 1) {
    if (fmt == DT_ML_CSV ? *s == ',' : (*s == ':' && s + 1 < e && s[1] == ':')) {
      f[k++] = (span){start, (size_t)(s - start)};
      s += fmt == DT_ML_CSV ? 1 : 2;
      start = s;
    } else {
      s++;
    }
  }
  f[k++] = (span){start, (size_t)(e - start)};
  return k;
}

/* A non-negative decimal integer of at most 18 digits (no sign, no spaces). 0 on success. */
static int parse_uint(span s, int64_t *out) {
  if (s.n == 0 || s.n > 18) return -1;
  int64_t v = 0;
  for (size_t i = 0; i < s.n; i++) {
    const unsigned d = (unsigned char)s.p[i] - '0';
    if (d > 9) return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

/* An id: a non-negative integer up to INT32_MAX. */
static dt_status parse_id(span s, const char *path, int64_t line, const char *col, int32_t *out) {
  char buf[112];
  int64_t v;
  int digits = s.n > 0;
  for (size_t i = 0; i < s.n; i++) digits &= s.p[i] >= '0' && s.p[i] <= '9';
  if (!digits) return bad_line(path, line, "%s '%s' is not a non-negative integer", col, show(s, buf));
  if (parse_uint(s, &v) != 0 || v > INT32_MAX)
    return bad_line(path, line, "%s %s is larger than %d", col, show(s, buf), INT32_MAX);
  *out = (int32_t)v;
  return DT_OK;
}

/* A rating: digits[.digits] (at most 9 of each) in [0, DT_ML_MAX_RATING]. */
static dt_status parse_rating(span s, const char *path, int64_t line, const char *col, float *out) {
  char buf[112];
  const char *dot = memchr(s.p, '.', s.n);
  span ip = {s.p, dot ? (size_t)(dot - s.p) : s.n}, fp = {dot ? dot + 1 : s.p, dot ? s.n - ip.n - 1 : 0};
  int64_t iv = 0, fv = 0;
  if (ip.n > 9 || fp.n > 9 || parse_uint(ip, &iv) != 0 || (dot && parse_uint(fp, &fv) != 0))
    return bad_line(path, line, "%s '%s' is not a decimal number like 3.5", col, show(s, buf));
  double v = (double)iv, scale = 1;
  for (size_t i = 0; i < fp.n; i++) scale *= 10;
  v += (double)fv / scale;
  if (v > DT_ML_MAX_RATING) return bad_line(path, line, "%s %s is outside [0, 5]", col, show(s, buf));
  *out = (float)v;
  return DT_OK;
}

/* Upper bound on the lines of buf[0..len): its newlines, plus one for a last line without one. */
static int64_t count_lines(const char *buf, size_t len) {
  int64_t n = 1;
  for (const char *p = buf, *end = buf + len; (p = memchr(p, '\n', (size_t)(end - p))) != NULL; p++) n++;
  return n;
}

void dt_ml_ratings_free(dt_ml_ratings *r) {
  if (!r) return;
  dt_free(r->time);
  dt_free(r->rating);
  dt_free(r->item);
  dt_free(r->user);
  memset(r, 0, sizeof *r);
}

/* The digits at *p as a value of at most max_digits digits (at least one); NULL-free: buf ends in a NUL. */
static int fast_uint(const char **p, int max_digits, int64_t *out) {
  const char *s = *p;
  int64_t v = 0;
  int k = 0;
  for (; (unsigned)(*s - '0') <= 9 && k <= max_digits; s++, k++) v = v * 10 + (*s - '0');
  if (k == 0 || k > max_digits) return 0;
  *p = s;
  *out = v;
  return 1;
}

static int fast_sep(const char **p, dt_ml_format fmt) {
  const char *s = *p;
  if (fmt == DT_ML_CSV ? s[0] != ',' : (s[0] != ':' || s[1] != ':')) return 0;
  *p = s + (fmt == DT_ML_CSV ? 1 : 2);
  return 1;
}

/* Row r->n from the well-formed line at p (the common case, in one pass); returns where the next line starts,
 * or NULL for anything else, which the careful path then accepts or explains. buf[len] is a NUL. */
static const char *fast_row(const char *p, const char *end, dt_ml_format fmt, dt_ml_ratings *r) {
  int64_t u, m, ip, fp = 0, t;
  const char *s = p;
  if (!fast_uint(&s, 10, &u) || u > INT32_MAX || !fast_sep(&s, fmt)) return NULL;
  if (!fast_uint(&s, 10, &m) || m > INT32_MAX || !fast_sep(&s, fmt)) return NULL;
  if (!fast_uint(&s, 9, &ip)) return NULL;
  double rating = (double)ip;
  if (*s == '.') {
    const char *f = ++s;
    if (!fast_uint(&s, 9, &fp)) return NULL;
    double scale = 1;
    for (; f < s; f++) scale *= 10;
    rating += (double)fp / scale;
  }
  if (rating > DT_ML_MAX_RATING || !fast_sep(&s, fmt) || !fast_uint(&s, 18, &t)) return NULL;
  if (s < end && *s == '\r') s++;
  if (s < end && *s++ != '\n') return NULL;
  r->user[r->n] = (int32_t)u;
  r->item[r->n] = (int32_t)m;
  r->rating[r->n] = (float)rating;
  if (r->time) r->time[r->n] = t;
  return s;
}

static dt_status parse_ratings(const char *path, const char *buf, size_t len, dt_ml_format fmt, dt_ml_ratings *r) {
  const char *const *col = fmt == DT_ML_CSV ? col_csv : col_dat;
  const char *p = buf, *end = buf + len;
  int64_t line = 0;
  char shown[112];
  if (fmt == DT_ML_CSV) {
    const span h = next_line(&p, end);
    line = 1;
    if (!span_is(h, ratings_header))
      return bad_line(path, 1, "missing header: expected '%s', found '%s'", ratings_header, show(h, shown));
  }
  while (p < end) {
    line++;
    const char *next = fast_row(p, end, fmt, r);
    if (next) {
      p = next;
      r->n++;
      continue;
    }
    const span l = next_line(&p, end);
    if (l.n == 0) return bad_line(path, line, "empty line");
    span f[MAX_COLS];
    const int k = split(l, fmt, f);
    if (k != 4)
      return bad_line(path, line, "expected 4 columns %s, found %d%s", fmt == DT_ML_CSV ? "(userId,movieId,rating,timestamp)"
                      : "(UserID::MovieID::Rating::Timestamp)", k, k == MAX_COLS ? " or more" : "");
    const int64_t i = r->n;
    DT_CHECK(parse_id(f[0], path, line, col[0], &r->user[i]));
    DT_CHECK(parse_id(f[1], path, line, col[1], &r->item[i]));
    DT_CHECK(parse_rating(f[2], path, line, col[2], &r->rating[i]));
    int64_t t;
    if (parse_uint(f[3], &t) != 0)
      return bad_line(path, line, "%s '%s' is not a non-negative integer", col[3], show(f[3], shown));
    if (r->time) r->time[i] = t;
    r->n++;
  }
  if (r->n == 0) return dt_error(DT_CORRUPT, "%s: holds no ratings%s", path, fmt == DT_ML_CSV ? " (only its header)" : "");
  return DT_OK;
}

dt_status dt_ml_read_ratings(const char *path, dt_ml_format fmt, int want_time, dt_ml_ratings *out) {
  char *buf = NULL;
  size_t len = 0;
  DT_CHECK(read_file(path, &buf, &len));
  dt_status st = DT_OK;
  dt_ml_ratings r = {0};
  if (len == 0) {
    st = dt_error(DT_CORRUPT, "%s: the file is empty", path);
    goto done;
  }
  const size_t rows = (size_t)count_lines(buf, len);
  DT_CHECK_GOTO(dt_alloc_array(rows, sizeof *r.user, "MovieLens user ids", (void **)&r.user), st, done);
  DT_CHECK_GOTO(dt_alloc_array(rows, sizeof *r.item, "MovieLens movie ids", (void **)&r.item), st, done);
  DT_CHECK_GOTO(dt_alloc_array(rows, sizeof *r.rating, "MovieLens ratings", (void **)&r.rating), st, done);
  if (want_time) DT_CHECK_GOTO(dt_alloc_array(rows, sizeof *r.time, "MovieLens timestamps", (void **)&r.time), st, done);
  DT_CHECK_GOTO(parse_ratings(path, buf, len, fmt, &r), st, done);
  *out = r;
  r = (dt_ml_ratings){0};
done:
  dt_ml_ratings_free(&r);
  dt_free(buf);
  return st;
}

/* ---- movies ------------------------------------------------------------------- */

void dt_ml_movies_free(dt_ml_movies *m) {
  if (!m) return;
  dt_free(m->text);
  dt_free(m->genres);
  dt_free(m->title);
  dt_free(m->line);
  dt_free(m->id);
  memset(m, 0, sizeof *m);
}

/* Where a record's fields go: text grows by each field and its NUL. */
typedef struct movie_reader {
  const char *path;
  const char *p, *end;
  int64_t line;   /* of the next byte */
  char *text;
  size_t used;
} movie_reader;

/* One RFC 4180 field at r->p, unescaped into r->text; *last is set when it ends its record. */
static dt_status csv_field(movie_reader *r, int64_t *start, int *last) {
  *start = (int64_t)r->used;
  const char *p = r->p, *end = r->end;
  if (p < end && *p == '"') {
    const int64_t opened = r->line;
    for (p++;; p++) {
      if (p == end) return bad_line(r->path, opened, "a quoted field is not closed before the end of the file");
      if (*p == '"') {
        if (p + 1 < end && p[1] == '"') {
          r->text[r->used++] = '"';
          p++;
          continue;
        }
        p++;
        break;
      }
      if (*p == '\n') r->line++;
      r->text[r->used++] = *p;
    }
    if (p < end && *p == '\r' && p + 1 < end && p[1] == '\n') p++;
    if (p < end && *p != ',' && *p != '\n') {
      char buf[112];
      return bad_line(r->path, r->line, "text after a closing quote: '%s'", show((span){p, (size_t)(end - p)}, buf));
    }
  } else {
    for (; p < end && *p != ',' && *p != '\n'; p++) {
      if (*p == '"') return bad_line(r->path, r->line, "a quote inside an unquoted field (quote the field and double the quote)");
      r->text[r->used++] = *p;
    }
    if ((p == end || *p == '\n') && r->used > (size_t)*start && r->text[r->used - 1] == '\r') r->used--;
  }
  *last = p == end || *p == '\n';
  if (p < end) {
    if (*p == '\n') r->line++;
    p++;
  }
  r->p = p;
  r->text[r->used++] = '\0';
  return DT_OK;
}

/* One '::'-separated ml-1m field at r->p, latin-1 converted to UTF-8 into r->text. */
static void dat_field(movie_reader *r, int64_t *start, int *last) {
  *start = (int64_t)r->used;
  const char *p = r->p, *end = r->end;
  for (; p < end && *p != '\n' && !(*p == ':' && p + 1 < end && p[1] == ':'); p++) {
    const unsigned char c = (unsigned char)*p;
    if (c < 0x80) {
      r->text[r->used++] = (char)c;
    } else {
      r->text[r->used++] = (char)(0xc0 | (c >> 6));
      r->text[r->used++] = (char)(0x80 | (c & 0x3f));
    }
  }
  if ((p == end || *p == '\n') && r->used > (size_t)*start && r->text[r->used - 1] == '\r') r->used--;
  *last = p == end || *p == '\n';
  if (p < end) {
    if (*p == '\n') r->line++;
    p += *p == '\n' ? 1 : 2;
  }
  r->p = p;
  r->text[r->used++] = '\0';
}

static dt_status parse_movies(movie_reader *r, dt_ml_format fmt, dt_ml_movies *m) {
  char shown[112];
  if (fmt == DT_ML_CSV) {
    const span h = next_line(&r->p, r->end);
    r->line = 2;
    if (!span_is(h, movies_header))
      return bad_line(r->path, 1, "missing header: expected '%s', found '%s'", movies_header, show(h, shown));
  }
  while (r->p < r->end) {
    const int64_t line = r->line, i = m->n;
    int64_t at[MAX_COLS];
    int k = 0, last = 0;
    if (*r->p == '\n' || (*r->p == '\r' && r->p + 1 < r->end && r->p[1] == '\n')) return bad_line(r->path, line, "empty line");
    while (!last) {
      int64_t start;
      if (fmt == DT_ML_CSV) DT_CHECK(csv_field(r, &start, &last));
      else dat_field(r, &start, &last);
      if (k < MAX_COLS) at[k++] = start;
    }
    if (k != 3)
      return bad_line(r->path, line, "expected 3 columns %s, found %d%s",
                      fmt == DT_ML_CSV ? "(movieId,title,genres)" : "(MovieID::Title::Genres)", k, k == MAX_COLS ? " or more" : "");
    const span id = {r->text + at[0], (size_t)(at[1] - at[0] - 1)};
    DT_CHECK(parse_id(id, r->path, line, fmt == DT_ML_CSV ? "movieId" : "MovieID", &m->id[i]));
    for (int c = 1; c < 3; c++) {
      const size_t n = (size_t)(c == 1 ? at[2] - at[1] - 1 : (int64_t)r->used - at[2] - 1);
      const char *what = c == 1 ? "title" : "genres";
      if (memchr(r->text + at[c], '\0', n)) return bad_line(r->path, line, "a NUL byte in the %s", what);
      if (!dt_utf8_valid(r->text + at[c], n)) return bad_line(r->path, line, "the %s is not UTF-8", what);
    }
    m->line[i] = line;
    m->title[i] = at[1];
    m->genres[i] = at[2];
    m->n++;
  }
  if (m->n == 0) return dt_error(DT_CORRUPT, "%s: holds no movies", r->path);
  return DT_OK;
}

dt_status dt_ml_read_movies(const char *path, dt_ml_format fmt, dt_ml_movies *out) {
  char *buf = NULL;
  size_t len = 0;
  DT_CHECK(read_file(path, &buf, &len));
  dt_status st = DT_OK;
  dt_ml_movies m = {0};
  if (len == 0) {
    st = dt_error(DT_CORRUPT, "%s: the file is empty", path);
    goto done;
  }
  /* Records are at most the lines; text at most two bytes per input byte (latin-1) plus a NUL per field. */
  const size_t rows = (size_t)count_lines(buf, len);
  size_t text_len;
  if (dt_mul_overflow(len, 3, &text_len)) {
    st = dt_error(DT_OUT_OF_MEMORY, "%s: %zu bytes is too large", path, len);
    goto done;
  }
  DT_CHECK_GOTO(dt_alloc_array(rows, sizeof *m.id, "MovieLens movies", (void **)&m.id), st, done);
  DT_CHECK_GOTO(dt_alloc_array(rows, sizeof *m.line, "MovieLens movies", (void **)&m.line), st, done);
  DT_CHECK_GOTO(dt_alloc_array(rows, sizeof *m.title, "MovieLens titles", (void **)&m.title), st, done);
  DT_CHECK_GOTO(dt_alloc_array(rows, sizeof *m.genres, "MovieLens genres", (void **)&m.genres), st, done);
  DT_CHECK_GOTO(dt_alloc_array(text_len + 16, 1, "MovieLens titles", (void **)&m.text), st, done);
  movie_reader r = {.path = path, .p = buf, .end = buf + len, .line = 1, .text = m.text};
  DT_CHECK_GOTO(parse_movies(&r, fmt, &m), st, done);
  *out = m;
  m = (dt_ml_movies){0};
done:
  dt_ml_movies_free(&m);
  dt_free(buf);
  return st;
}
