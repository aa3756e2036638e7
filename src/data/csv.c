/* An RFC 4180 CSV/TSV reader: the whole file read once, fields kept as spans of it, quoted ones unescaped in place. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "core/text.h"
#include "data/csv.h"

typedef struct parser {
  const char *name;
  char *buf, *p, *end;
  int64_t line;          /* the line p is on, from 1 */
  char delim;
  int quote_in_unquoted; /* CSV: a '"' inside an unquoted field is malformed; TSV: text */
  uint8_t stop[256];     /* bytes an unquoted scan stops at: delimiter, '"', CR, LF, NUL, non-ASCII */
  uint8_t stop_q[256];   /* bytes a quoted scan stops at: '"', CR, LF, NUL, non-ASCII */
  dt_csv_cell *rec;      /* the record being parsed (grows with its field count) */
  int64_t rec_cap, n_fields;
  int64_t rec_line;      /* the line the record starts on */
  const dt_csv *head;    /* the header once parsed: names fields in messages */
  char what[200];        /* the first thing wrong with the record ("" while none) */
} parser;

/* Notes the first thing wrong with the current record; parsing goes on to find where it ends. */
static void flag(parser *ps, const char *fmt, ...) DT_PRINTF(2, 3);
static void flag(parser *ps, const char *fmt, ...) {
  if (ps->what[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ps->what, sizeof ps->what, fmt, ap);
  va_end(ap);
}

/* "field 3 (toxic)" with the header's name when there is one; k counts from 0. */
static const char *field_name(const parser *ps, int64_t k, char out[96]) {
  const dt_csv *h = ps->head;
  if (!h || k >= h->n_cols) {
    snprintf(out, 96, "%sfield %lld", h ? "" : "header ", (long long)k + 1);
    return out;
  }
  size_t len = 0;
  const char *s = dt_csv_field(h, 0, (int)k, &len);
  snprintf(out, 96, "field %lld (%.*s)", (long long)k + 1, (int)(len > 48 ? 48 : len), s);
  return out;
}

/* One byte that stops a scan and is not structure: a NUL or the start of a UTF-8 character. Moves p past it. */
static void check_byte(parser *ps, int64_t k) {
  char nm[96];
  if (*ps->p == '\0') {
    flag(ps, "a NUL byte in %s", field_name(ps, k, nm));
    ps->p++;
    return;
  }
  const size_t n = dt_utf8_char_len(ps->p, (size_t)(ps->end - ps->p));
  if (!n) flag(ps, "%s is not valid UTF-8 (byte 0x%02x)", field_name(ps, k, nm), (unsigned char)*ps->p);
  ps->p += n ? n : 1;
}

/* The first byte at or after p that the table stops at, or end. Locals, so the compiler keeps them in registers
 * (stores through the buffer could alias the parser's fields). */
static char *skip_plain(char *p, const char *end, const uint8_t *stop) {
  while (p < end && !stop[(uint8_t)*p]) p++;
  return p;
}

/* An unquoted run from p up to a delimiter, line break or the end; returns where it started. */
static char *scan_unquoted(parser *ps, int64_t k, int lenient) {
  char *start = ps->p;
  char nm[96];
  for (;;) {
    ps->p = skip_plain(ps->p, ps->end, ps->stop);
    if (ps->p == ps->end) break;
    const char c = *ps->p;
    if (c == ps->delim || c == '\n' || c == '\r') break;
    if (c == '"') {
      if (ps->quote_in_unquoted && !lenient)
        flag(ps, "a '\"' inside unquoted %s (quote the whole field and double the quote)", field_name(ps, k, nm));
      ps->p++;
    } else {
      check_byte(ps, k);
    }
  }
  return start;
}

/* A quoted field from its opening quote: its text is moved down over the quotes; returns its length. */
static int64_t scan_quoted(parser *ps, int64_t k, int64_t first_line) {
  char *start = ++ps->p, *seg = start, *w = start;
  char nm[96];
  int closed = 0;
  while (!closed) {
    ps->p = skip_plain(ps->p, ps->end, ps->stop_q);
    if (ps->p == ps->end) {
      flag(ps, "quoted %s (opened on line %lld) is not closed by the end of the file", field_name(ps, k, nm),
           (long long)first_line);
      break;
    }
    const char c = *ps->p;
    if (c == '"') {
      const size_t n = (size_t)(ps->p - seg);
      memmove(w, seg, n);
      w += n;
      closed = !(ps->p + 1 < ps->end && ps->p[1] == '"');
      if (!closed) *w++ = '"';
      ps->p += closed ? 1 : 2;
      seg = ps->p;
    } else if (c == '\n' || c == '\r') {
      ps->line += c == '\n' || !(ps->p + 1 < ps->end && ps->p[1] == '\n');
      ps->p++;
    } else {
      check_byte(ps, k);
    }
  }
  const size_t tail = (size_t)(ps->p - seg);
  if (!closed) memmove(w, seg, tail), w += tail;
  if (closed && ps->p < ps->end && *ps->p != ps->delim && *ps->p != '\n' && *ps->p != '\r') {
    flag(ps, "text after the closing quote of %s", field_name(ps, k, nm));
    const char *more = scan_unquoted(ps, k, 1); /* kept as Python's csv keeps it, for a lenient skip */
    const size_t n = (size_t)(ps->p - more);
    memmove(w, more, n);
    w += n;
  }
  return (int64_t)(w - start);
}

/* Appends a field to the record. */
static dt_status add_field(parser *ps, int64_t off, int64_t len) {
  if (ps->n_fields == ps->rec_cap)
    DT_CHECK(dt_grow_array((void **)&ps->rec, &ps->rec_cap, ps->n_fields, ps->n_fields + 1, 16, sizeof *ps->rec,
                           "CSV record"));
  ps->rec[ps->n_fields++] = (dt_csv_cell){off, len};
  return DT_OK;
}

/* Consumes one line break at p (LF, CRLF or CR). */
static void eat_line_break(parser *ps) {
  if (*ps->p == '\r' && ps->p + 1 < ps->end && ps->p[1] == '\n') ps->p++;
  ps->p++;
  ps->line++;
}

/* The next record into ps->rec (empty lines before it skipped); *more = 0 at the end of the input. */
static dt_status parse_record(parser *ps, int *more) {
  while (ps->p < ps->end && (*ps->p == '\n' || *ps->p == '\r')) eat_line_break(ps);
  ps->n_fields = 0;
  ps->what[0] = '\0';
  *more = ps->p < ps->end;
  if (!*more) return DT_OK;
  const int64_t first_line = ps->rec_line = ps->line;
  for (;;) {
    const int64_t k = ps->n_fields;
    int64_t off, len;
    if (*ps->p == '"') {
      off = ps->p + 1 - ps->buf;
      len = scan_quoted(ps, k, first_line);
    } else {
      const char *s = scan_unquoted(ps, k, 0);
      off = s - ps->buf;
      len = ps->p - s;
    }
    DT_CHECK(add_field(ps, off, len));
    if (ps->p == ps->end) break;
    if (*ps->p == ps->delim) {
      ps->p++;
      if (ps->p == ps->end) DT_CHECK(add_field(ps, ps->p - ps->buf, 0)); /* "a,b," ends with an empty field */
      if (ps->p == ps->end) break;
      continue;
    }
    eat_line_break(ps);
    break;
  }
  return DT_OK;
}

static int ends_with_tsv(const char *name) {
  const size_t n = strlen(name);
  if (n < 4) return 0;
  const char *e = name + n - 4;
  return e[0] == '.' && tolower((unsigned char)e[1]) == 't' && tolower((unsigned char)e[2]) == 's' &&
         tolower((unsigned char)e[3]) == 'v';
}

static void init_parser(parser *ps, const char *name, char *buf, size_t len, char delim) {
  memset(ps, 0, sizeof *ps);
  ps->name = name;
  ps->buf = ps->p = buf;
  ps->end = buf + len;
  ps->line = 1;
  ps->delim = delim;
  ps->quote_in_unquoted = delim != '\t';
  for (int c = 0; c < 256; c++) ps->stop[c] = ps->stop_q[c] = c >= 0x80 || c == 0 || c == '\n' || c == '\r' || c == '"';
  ps->stop[(uint8_t)delim] = 1;
  if (len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0) ps->p += 3; /* Excel's byte-order mark */
}

/* Appends ps->rec as row c->n_rows + 1 (the header is row 0). */
static dt_status add_row(dt_csv *c, parser *ps, int64_t line, int64_t *cell_cap, int64_t *line_cap) {
  const int64_t row = c->n_rows + 1;
  DT_CHECK(dt_grow_array((void **)&c->cell, cell_cap, row * c->n_cols, (row + 1) * c->n_cols, 1024, sizeof *c->cell,
                         "CSV fields"));
  DT_CHECK(dt_grow_array((void **)&c->line, line_cap, row, row + 1, 256, sizeof *c->line, "CSV lines"));
  memcpy(c->cell + row * c->n_cols, ps->rec, (size_t)c->n_cols * sizeof *c->cell);
  c->line[row] = line;
  c->n_rows++;
  return DT_OK;
}

/* The header: row 0, which fixes the field count. */
static dt_status parse_header(dt_csv *c, parser *ps, int64_t *cell_cap, int64_t *line_cap) {
  int more = 0;
  DT_CHECK(parse_record(ps, &more));
  if (!more) return dt_error(DT_CORRUPT, "%s: empty: a header row naming the columns comes first", ps->name);
  if (ps->what[0]) return dt_error(DT_CORRUPT, "%s:1: the header: %s", ps->name, ps->what);
  if (ps->n_fields > 1 << 20) return dt_error(DT_CORRUPT, "%s:1: the header has over 2^20 columns", ps->name);
  c->n_cols = (int)ps->n_fields;
  DT_CHECK(dt_grow_array((void **)&c->cell, cell_cap, 0, c->n_cols, 1024, sizeof *c->cell, "CSV fields"));
  DT_CHECK(dt_grow_array((void **)&c->line, line_cap, 0, 1, 256, sizeof *c->line, "CSV lines"));
  memcpy(c->cell, ps->rec, (size_t)c->n_cols * sizeof *c->cell);
  c->line[0] = 1;
  return DT_OK;
}

/* Parses c->buf[0..len) (owned by c) into c. */
static dt_status parse_owned(const char *name, size_t len, const dt_csv_options *opt, dt_csv *c) {
  parser ps;
  const char delim = opt && opt->delim ? opt->delim : ends_with_tsv(name) ? '\t' : ',';
  if (delim == '"' || delim == '\n' || delim == '\r' || delim == '\0')
    return dt_error(DT_INVALID_ARGUMENT, "%s: delimiter 0x%02x cannot separate fields", name, (unsigned char)delim);
  init_parser(&ps, name, c->buf, len, delim);
  c->delim = delim;
  int64_t cell_cap = 0, line_cap = 0;
  dt_status st;
  DT_CHECK_GOTO(parse_header(c, &ps, &cell_cap, &line_cap), st, done);
  ps.head = c;
  for (;;) {
    int more = 0;
    DT_CHECK_GOTO(parse_record(&ps, &more), st, done);
    if (!more) break;
    if (!ps.what[0] && ps.n_fields != c->n_cols)
      flag(&ps, "%lld field%s; the header has %d", (long long)ps.n_fields, ps.n_fields == 1 ? "" : "s", c->n_cols);
    if (!ps.what[0]) {
      DT_CHECK_GOTO(add_row(c, &ps, ps.rec_line, &cell_cap, &line_cap), st, done);
      continue;
    }
    if (!opt || !opt->skip_bad) {
      st = dt_error(DT_CORRUPT, "%s:%lld: %s", name, (long long)ps.rec_line, ps.what);
      goto done;
    }
    if (!c->skipped++) {
      snprintf(c->first_bad, sizeof c->first_bad, "%s:%lld: %s", name, (long long)ps.rec_line, ps.what);
      c->first_bad_line = ps.rec_line;
    }
  }
  st = DT_OK;
done:
  dt_free(ps.rec);
  return st;
}

dt_status dt_csv_parse(const char *name, const char *text, size_t len, const dt_csv_options *opt, dt_csv *out) {
  dt_csv c = {0};
  DT_CHECK(dt_alloc_array(len + 1, 1, name, (void **)&c.buf));
  memcpy(c.buf, text, len);
  const dt_status st = parse_owned(name, len, opt, &c);
  if (st != DT_OK) {
    dt_csv_free(&c);
    return st;
  }
  *out = c;
  return DT_OK;
}

dt_status dt_csv_read(const char *path, const dt_csv_options *opt, dt_csv *out) {
  FILE *f = NULL;
  size_t len = 0;
  dt_csv c = {0};
  DT_CHECK(dt_file_open_regular(path, &f, &len));
  dt_status st = dt_alloc_array(len + 1, 1, path, (void **)&c.buf);
  if (st == DT_OK) st = dt_file_read_exact(f, path, c.buf, len);
  fclose(f);
  if (st == DT_OK) st = parse_owned(path, len, opt, &c);
  if (st != DT_OK) {
    dt_csv_free(&c);
    return st;
  }
  *out = c;
  return DT_OK;
}

void dt_csv_free(dt_csv *c) {
  if (!c) return;
  dt_free(c->line);
  dt_free(c->cell);
  dt_free(c->buf);
  memset(c, 0, sizeof *c);
}

int dt_csv_column(const dt_csv *c, const char *name) {
  const size_t n = strlen(name);
  for (int k = 0; k < c->n_cols; k++) {
    size_t len = 0;
    const char *s = dt_csv_field(c, 0, k, &len);
    if (len == n && memcmp(s, name, n) == 0) return k;
  }
  return -1;
}

const char *dt_csv_header_list(const dt_csv *c, char *out, size_t len) {
  size_t o = 0;
  out[0] = '\0';
  for (int k = 0; k < c->n_cols; k++) {
    size_t n = 0;
    const char *s = dt_csv_field(c, 0, k, &n);
    const int w = snprintf(out + o, len - o, "%s%s%.*s%s", k ? ", " : "", n ? "" : "\"", (int)n, s, n ? "" : "\"");
    if (w < 0 || (size_t)w >= len - o) {
      if (len >= 4) memcpy(out + len - 4, "...", 4);
      break;
    }
    o += (size_t)w;
  }
  return out;
}
