/* `dtrain tokenize`: BERT WordPiece ids of every line (or NUL-separated record) of a stream. */
#ifndef DT_TOOLS_CMD_TOKENIZE_H
#define DT_TOOLS_CMD_TOKENIZE_H

#include <stdio.h>

#include "dtrain/status.h"

typedef struct tokenize_args {
  const char *vocab;
  int lower;      /* 1: uncased (lower-case and strip accents) */
  int max_len;    /* 0: no limit; else at most this many ids (with special: the whole [CLS] ... [SEP]) */
  int special;    /* 1: [CLS] text [SEP], truncated to max_len as BERT inputs are */
  int nul;        /* 1: records end at NUL bytes instead of newlines */
} tokenize_args;

/* Reads records from in, writes one line of space-separated ids per record to out; the id count of every
 * record on stderr with verbose. Errors name the record (its number, from 1). */
dt_status tokenize_stream(const tokenize_args *a, FILE *in, FILE *out);

#endif
