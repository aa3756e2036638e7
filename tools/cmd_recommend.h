/* `dtrain recommend`: the top K movies a user has not rated, by a recommender (mf, ncf) trained on ratings. */
#ifndef DT_TOOLS_CMD_RECOMMEND_H
#define DT_TOOLS_CMD_RECOMMEND_H

#include <stdio.h>

#include "dtrain/train.h"

/* Prints r to f: a table (rank, movieId, predicted rating, title, genres) under a line saying whose
 * and from what, or with json one JSON object {"user", "items": [{"movie_id", "score", "title",
 * "genres"}]} and a newline. Returns DT_OUT_OF_MEMORY only (escaping a long title). */
dt_status recommend_print(FILE *f, const dt_recommend_config *cfg, const dt_recommend_result *r, int json);

#endif
