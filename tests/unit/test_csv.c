/* Tests of the CSV/TSV reader: quoting, embedded line breaks and quotes, CRLF, TSV, empty fields, and errors naming the line. */
#include <stdio.h>
#include <string.h>

#include "data/csv.h"
#include "harness.h"
#include "test_files.h"

static const dt_csv_options csv_strict = {0}, csv_skip = {.skip_bad = 1};

/* Parses text (NUL-terminated) as name. */
static dt_status parse(const char *name, const char *text, const dt_csv_options *opt, dt_csv *c) {
  return dt_csv_parse(name, text, strlen(text), opt, c);
}

/* 1 if field (row, col) of c is exactly want. */
static int field_is(const dt_csv *c, int64_t row, int col, const char *want) {
  size_t n = 0;
  const char *s = dt_csv_field(c, row, col, &n);
  return n == strlen(want) && memcmp(s, want, n) == 0;
}

/* The parse of text must fail with DT_CORRUPT and a message holding want (e.g. "t.csv:3:"). */
#define ASSERT_BAD(text, want)                                                              \
  do {                                                                                      \
    dt_csv c_ = {0};                                                                        \
    ASSERT_STATUS(parse("t.csv", (text), &csv_strict, &c_), DT_CORRUPT);                    \
    ASSERT_MSG(strstr(dt_last_error(), (want)) != NULL, dt_last_error());                  \
  } while (0)

TEST(plain_and_quoted_fields) {
  dt_csv c = {0};
  ASSERT_OK(parse("t.csv", "a,b,c\n1,\"x, y\",3\n\"say \"\"hi\"\"\",,\"\"\n", &csv_strict, &c));
  ASSERT_EQ(c.n_cols, 3);
  ASSERT_EQ(c.n_rows, 2);
  ASSERT(field_is(&c, 0, 0, "a") && field_is(&c, 0, 2, "c"));
  ASSERT(field_is(&c, 1, 0, "1"));
  ASSERT(field_is(&c, 1, 1, "x, y"));
  ASSERT(field_is(&c, 2, 0, "say \"hi\""));
  ASSERT(field_is(&c, 2, 1, ""));
  ASSERT(field_is(&c, 2, 2, ""));
  ASSERT_EQ(c.line[1], 2);
  ASSERT_EQ(c.line[2], 3);
  ASSERT_EQ(dt_csv_column(&c, "b"), 1);
  ASSERT_EQ(dt_csv_column(&c, "d"), -1);
  dt_csv_free(&c);
}

TEST(embedded_line_breaks_keep_line_numbers) {
  dt_csv c = {0};
  ASSERT_OK(parse("t.csv", "text,y\n\"one\ntwo\r\nthree\",1\nfour,0\n\"\"\"\n\",2\n", &csv_strict, &c));
  ASSERT_EQ(c.n_rows, 3);
  ASSERT(field_is(&c, 1, 0, "one\ntwo\r\nthree"));
  ASSERT(field_is(&c, 2, 0, "four"));
  ASSERT(field_is(&c, 3, 0, "\"\n"));
  ASSERT_EQ(c.line[1], 2);
  ASSERT_EQ(c.line[2], 5);
  ASSERT_EQ(c.line[3], 6);
  dt_csv_free(&c);
}

TEST(crlf_bom_empty_lines_and_no_final_newline) {
  dt_csv c = {0};
  ASSERT_OK(parse("t.csv", "\xef\xbb\xbf" "a,b\r\n1,2\r\n\r\n\n3,\"4\"", &csv_strict, &c));
  ASSERT_EQ(c.n_rows, 2);
  ASSERT(field_is(&c, 0, 0, "a"));
  ASSERT(field_is(&c, 1, 1, "2"));
  ASSERT(field_is(&c, 2, 0, "3") && field_is(&c, 2, 1, "4"));
  ASSERT_EQ(c.line[2], 5);
  dt_csv_free(&c);
  /* a trailing delimiter is an empty last field, also at the very end */
  ASSERT_OK(parse("t.csv", "a,b\n1,\n2,", &csv_strict, &c));
  ASSERT_EQ(c.n_rows, 2);
  ASSERT(field_is(&c, 1, 1, "") && field_is(&c, 2, 1, ""));
  dt_csv_free(&c);
  /* a header alone: no records */
  ASSERT_OK(parse("t.csv", "a,b\n", &csv_strict, &c));
  ASSERT_EQ(c.n_rows, 0);
  dt_csv_free(&c);
}

TEST(tsv_by_name_or_option) {
  dt_csv c = {0};
  ASSERT_OK(parse("t.TSV", "a\tb\nx, y\t\"q\"\"\"\nit's \"so\"\t2\n", &csv_strict, &c));
  ASSERT_EQ(c.delim, '\t');
  ASSERT_EQ(c.n_rows, 2);
  ASSERT(field_is(&c, 1, 0, "x, y"));
  ASSERT(field_is(&c, 1, 1, "q\""));
  ASSERT(field_is(&c, 2, 0, "it's \"so\"")); /* TSV: a quote inside a field is text */
  dt_csv_free(&c);
  const dt_csv_options tab = {.delim = '\t'};
  ASSERT_OK(parse("t.txt", "a\tb\n1\t2\n", &tab, &c));
  ASSERT_EQ(c.n_cols, 2);
  ASSERT(field_is(&c, 1, 1, "2"));
  dt_csv_free(&c);
  /* the same text read as CSV is one column */
  ASSERT_OK(parse("t.csv", "a\tb\n1\t2\n", &csv_strict, &c));
  ASSERT_EQ(c.n_cols, 1);
  dt_csv_free(&c);
}

TEST(utf8_text_passes) {
  dt_csv c = {0};
  ASSERT_OK(parse("t.csv", "t\n\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"\nna\xc3\xafve\n", &csv_strict, &c));
  ASSERT_EQ(c.n_rows, 2);
  ASSERT(field_is(&c, 1, 0, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  dt_csv_free(&c);
}

TEST(errors_name_the_line_where_the_record_starts) {
  ASSERT_BAD("a,b\n1,2\n3\n", "t.csv:3: 1 field; the header has 2");
  ASSERT_BAD("a,b\n1,2\n3,4,5\n", "t.csv:3: 3 fields; the header has 2");
  ASSERT_BAD("a,b\n1,2\n\"open\n\nstill,2\n", "t.csv:3: quoted field 1 (a) (opened on line 3) is not closed");
  ASSERT_BAD("a,b\n\"x\"y,2\n", "t.csv:2: text after the closing quote of field 1 (a)");
  ASSERT_BAD("a,b\n1,x\"y\n", "t.csv:2: a '\"' inside unquoted field 2 (b)");
  ASSERT_BAD("a,b\n\"multi\nline\",\xff\n", "t.csv:2: field 2 (b) is not valid UTF-8 (byte 0xff)");
  ASSERT_BAD("a,b\n1,\"\xc3\x28\"\n", "t.csv:2: field 2 (b) is not valid UTF-8 (byte 0xc3)");
  ASSERT_BAD("a,b\n1,\xed\xa0\x80\n", "not valid UTF-8"); /* a surrogate */
}

TEST(nul_and_empty_file) {
  dt_csv c = {0};
  static const char nul[] = "a,b\n1,x\0y\n";
  ASSERT_STATUS(dt_csv_parse("t.csv", nul, sizeof nul - 1, &csv_strict, &c), DT_CORRUPT);
  ASSERT_MSG(strstr(dt_last_error(), "t.csv:2: a NUL byte in field 2 (b)") != NULL, dt_last_error());
  ASSERT_STATUS(parse("t.csv", "", &csv_strict, &c), DT_CORRUPT);
  ASSERT_MSG(strstr(dt_last_error(), "t.csv: empty") != NULL, dt_last_error());
  ASSERT_STATUS(parse("t.csv", "\n\r\n", &csv_strict, &c), DT_CORRUPT);
  ASSERT_STATUS(parse("t.csv", "a,\"b\n", &csv_strict, &c), DT_CORRUPT); /* the header is never skipped */
  ASSERT_MSG(strstr(dt_last_error(), "t.csv:1: the header: quoted header field 2") != NULL, dt_last_error());
}

TEST(skip_bad_leaves_records_out_and_counts_them) {
  dt_csv c = {0};
  ASSERT_OK(parse("t.csv", "a,b\n1,2\n3\n\"x\"y,4\n5,6\n7,\xff\n8,\"open\n9,10\n", &csv_skip, &c));
  /* kept: 1,2 and 5,6; left out: "3", "x"y, the bad byte, and the unclosed quote that runs to the end */
  ASSERT_EQ(c.n_rows, 2);
  ASSERT_EQ(c.skipped, 4);
  ASSERT(field_is(&c, 1, 0, "1") && field_is(&c, 2, 0, "5"));
  ASSERT_EQ(c.line[2], 5);
  ASSERT_MSG(strstr(c.first_bad, "t.csv:3: 1 field") != NULL, c.first_bad);
  dt_csv_free(&c);
}

TEST(read_from_a_file) {
  const char *path = tmp_path("rows.tsv");
  FILE *f = fopen(path, "wb");
  ASSERT(f);
  fputs("text\tlabel\nhello\t1\n\"two\nlines\"\t0\n", f);
  fclose(f);
  dt_csv c = {0};
  ASSERT_OK(dt_csv_read(path, NULL, &c));
  ASSERT_EQ(c.delim, '\t');
  ASSERT_EQ(c.n_rows, 2);
  ASSERT(field_is(&c, 2, 0, "two\nlines"));
  ASSERT_EQ(c.line[2], 3);
  char list[64];
  ASSERT_STR_EQ(dt_csv_header_list(&c, list, sizeof list), "text, label");
  dt_csv_free(&c);
  ASSERT_STATUS(dt_csv_read(tmp_path("missing.csv"), NULL, &c), DT_NOT_FOUND);
  ASSERT_MSG(strstr(dt_last_error(), "missing.csv") != NULL, dt_last_error());
  remove_tmpdir();
}

/* A large file: rows parse at a useful rate (printed; checked loosely). */
TEST(large_input_rate) {
  const int rows = 200000;
  const size_t cap = (size_t)rows * 64 + 64;
  char *text = malloc(cap);
  ASSERT(text);
  size_t n = (size_t)snprintf(text, cap, "id,comment_text,toxic\n");
  for (int i = 0; i < rows; i++)
    n += (size_t)snprintf(text + n, cap - n, i % 3 ? "%d,plain words here,0\n" : "%d,\"a \"\"quoted\"\"\nline\",1\n", i);
  dt_csv c = {0};
  const double t0 = dt_time_now();
  dt_status st = dt_csv_parse("big.csv", text, n, &csv_strict, &c);
  const double s = dt_time_now() - t0;
  free(text);
  ASSERT_OK(st);
  printf("  %d rows, %.1f MB parsed in %.1f ms (%.0f MB/s)\n", rows, n / 1e6, s * 1e3, n / 1e6 / s);
  ASSERT_EQ(c.n_rows, rows);
  ASSERT(field_is(&c, 1, 1, "a \"quoted\"\nline"));
  int64_t line = 2; /* the header is line 1; every third record spans two lines */
  for (int i = 0; i < rows - 1; i++) line += i % 3 ? 1 : 2;
  ASSERT_EQ(c.line[rows], line);
  dt_csv_free(&c);
}

TEST_MAIN(TEST_ENTRY(plain_and_quoted_fields), TEST_ENTRY(embedded_line_breaks_keep_line_numbers),
          TEST_ENTRY(crlf_bom_empty_lines_and_no_final_newline), TEST_ENTRY(tsv_by_name_or_option),
          TEST_ENTRY(utf8_text_passes), TEST_ENTRY(errors_name_the_line_where_the_record_starts),
          TEST_ENTRY(nul_and_empty_file), TEST_ENTRY(skip_bad_leaves_records_out_and_counts_them),
          TEST_ENTRY(read_from_a_file), TEST_ENTRY(large_input_rate))
