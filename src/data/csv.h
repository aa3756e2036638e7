/* Internal: an RFC 4180 CSV/TSV reader (header row, quoted fields, one read of the file) for the text source. */
#ifndef DT_DATA_CSV_H
#define DT_DATA_CSV_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

/* A field: bytes [off, off + len) of the buffer, unescaped (a quoted field's quotes dropped, "" made "). */
typedef struct dt_csv_cell {
  int64_t off, len;
} dt_csv_cell;

/* A parsed file. Row 0 is the header; rows 1..n_rows the records, each with exactly n_cols fields. */
typedef struct dt_csv {
  char *buf;          /* the file's bytes, quoted fields unescaped in place (owned) */
  int n_cols;
  int64_t n_rows;     /* records after the header */
  dt_csv_cell *cell;  /* (n_rows + 1, n_cols) */
  int64_t *line;      /* (n_rows + 1): the line each record starts on, from 1 */
  int64_t skipped;    /* with skip_bad: malformed records left out */
  char first_bad[256]; /* with skip_bad: "file:line: what" of the first one left out ("" if none) */
  int64_t first_bad_line;
  char delim;
} dt_csv;

typedef struct dt_csv_options {
  char delim;   /* ',' or '\t'; 0: '\t' for a name ending in ".tsv" (any case), else ',' */
  int skip_bad; /* leave out malformed records (counted) instead of failing on the first */
} dt_csv_options;

/* Rules: records end at LF, CRLF or a lone CR outside quotes; a field that starts with '"' runs to the
 * matching '"' (line breaks and delimiters inside are text, "" is one quote); a UTF-8 byte-order mark at
 * the start is dropped; empty lines between records are skipped; the last record needs no line break.
 * Malformed, each DT_CORRUPT "name:line: what" with the line where the record starts: a quoted field not
 * closed by the end of the file, text after a closing quote, a '"' inside an unquoted field (CSV only: TSV
 * keeps it as text, as TSV files commonly do), a NUL byte, bytes that are not UTF-8, a record whose field
 * count differs from the header's. An empty file (no header) is DT_CORRUPT; the header itself is never
 * skipped. With skip_bad, a malformed record is parsed leniently (stray quotes as text) to find where it
 * ends, then left out. */
/* Reads path whole and parses it. A file that cannot be read is DT_NOT_FOUND or DT_IO naming it. */
dt_status dt_csv_read(const char *path, const dt_csv_options *opt, dt_csv *out);
/* Parses a copy of text[0..len); name is used in messages (and for the ".tsv" rule). */
dt_status dt_csv_parse(const char *name, const char *text, size_t len, const dt_csv_options *opt, dt_csv *out);
void dt_csv_free(dt_csv *c);

/* Field col of row (0: the header). */
static inline const char *dt_csv_field(const dt_csv *c, int64_t row, int col, size_t *len) {
  const dt_csv_cell *f = &c->cell[row * c->n_cols + col];
  *len = (size_t)f->len;
  return c->buf + f->off;
}
/* The first column whose header field is name, or -1. */
int dt_csv_column(const dt_csv *c, const char *name);
/* The header's fields as "a, b, c" into out (cut with "..." when longer than len), for messages. */
const char *dt_csv_header_list(const dt_csv *c, char *out, size_t len);

#endif
