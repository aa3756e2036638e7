/* Internal: the MovieLens file readers (movielens_read.c) that the movielens source (movielens.c) builds on. */
#ifndef DT_DATA_MOVIELENS_H
#define DT_DATA_MOVIELENS_H

#include <stdint.h>

#include "dtrain/status.h"

/* ml-latest-small, ml-25m: "ratings.csv" with a header; ml-1m: "ratings.dat", '::'-separated, no header. */
typedef enum dt_ml_format { DT_ML_CSV, DT_ML_DAT } dt_ml_format;

/* Ids are non-negative integers up to INT32_MAX (the largest MovieLens id is below 300,000); ratings are
 * finite decimals in [0, 5] (half stars in ml-latest and ml-25m, whole stars in ml-1m). */
#define DT_ML_MAX_RATING 5.0

/* Every rating of a file, in file order. */
typedef struct dt_ml_ratings {
  int64_t n;
  int32_t *user, *item; /* (n) original userId and movieId */
  float *rating;        /* (n) */
  int64_t *time;        /* (n) seconds since the epoch; NULL unless asked for */
} dt_ml_ratings;

/* Reads path in one go and parses it strictly: every malformed line (column count, an id or timestamp that
 * is not a non-negative integer, an id above INT32_MAX, a rating that is not a decimal in [0, 5], an empty
 * line, CSV's header missing) is DT_CORRUPT "path:line: what". A last line without its newline is fine;
 * an empty file or one without ratings is DT_CORRUPT. A file that cannot be read is DT_NOT_FOUND or DT_IO.
 * *out is written only on success (free with dt_ml_ratings_free). */
dt_status dt_ml_read_ratings(const char *path, dt_ml_format fmt, int want_time, dt_ml_ratings *out);
void dt_ml_ratings_free(dt_ml_ratings *r);

/* The movies of movies.csv (RFC 4180: quoted fields, "" for a quote; UTF-8) or movies.dat (ml-1m:
 * '::'-separated, latin-1, converted to UTF-8), in file order. */
typedef struct dt_ml_movies {
  int64_t n;
  int32_t *id;              /* (n) movieId */
  int64_t *line;            /* (n) where each record starts, for messages */
  int64_t *title, *genres;  /* (n) offsets of NUL-terminated UTF-8 strings in text */
  char *text;
} dt_ml_movies;

/* Same contract as dt_ml_read_ratings: a record without exactly 3 fields, a bad id, an unterminated quote,
 * text after a closing quote, a quote inside an unquoted field, a NUL byte or (CSV) text that is not UTF-8
 * is DT_CORRUPT "path:line: what". */
dt_status dt_ml_read_movies(const char *path, dt_ml_format fmt, dt_ml_movies *out);
void dt_ml_movies_free(dt_ml_movies *m);

#endif
