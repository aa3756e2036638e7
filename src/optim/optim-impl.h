/* Internal to src/optim: the optimizer object and the per-kind update loops. */
#ifndef DT_OPTIM_IMPL_H
#define DT_OPTIM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/optim.h"

/* Parallel loops below this many elements run on one thread: the fork/join
 * costs more than the arithmetic (the updates are memory bound, ~5 ns/elem). */
#define DT_OPTIM_PAR_MIN 32768

#define DT_OPTIM_MAX_STATES 2

/* A work item of a step with a no-decay table: elements [lo, lo + n) of the
 * arena, at most DT_OPTIM_PIECE of them, all with or all without weight decay. */
#define DT_OPTIM_PIECE 8192
typedef struct dt_optim_piece {
  size_t lo, n;
  int decay; /* 1: the configured weight_decay; 0: none */
} dt_optim_piece;

struct dt_optim {
  dt_optim_config cfg;
  size_t count;              /* floats in the parameter arena */
  int64_t steps;             /* updates taken so far */
  int num_states;
  float *state[DT_OPTIM_MAX_STATES]; /* each (count), parallel to params */
  float *state_mem; /* the caller's memory holding every state (dt_optim_set_state_memory), else NULL */
  void (*state_release)(void *mem, size_t bytes);
  const char *state_name[DT_OPTIM_MAX_STATES];
  dt_optim_piece *pieces; /* (n_pieces) tiling [0, count) in order; NULL: every element decays */
  int64_t n_pieces;
  size_t no_decay;        /* elements without weight decay */
  int shared_params;      /* dt_optim_set_shared_params: blocks are stepped in a copy and streamed back */
};

/* One update at learning rate lr; o->steps is already the 1-based number of
 * this update. params and grads are o->count floats each. */
void dt_sgd_update(dt_optim *o, float *params, const float *grads, float lr);
void dt_adam_update(dt_optim *o, float *params, const float *grads, float lr);
/* The same over the work items of a no-decay table (o->pieces), in one parallel loop. */
void dt_sgd_update_pieces(dt_optim *o, float *params, const float *grads, float lr);
void dt_adam_update_pieces(dt_optim *o, float *params, const float *grads, float lr);
/* The same over pieces [a, b) of the table, on the calling thread. */
void dt_sgd_update_piece_run(dt_optim *o, float *params, const float *grads, float lr, int64_t a, int64_t b);
void dt_adam_update_piece_run(dt_optim *o, float *params, const float *grads, float lr, int64_t a, int64_t b);
/* The same over elements [lo, lo + n) of the arena on the calling thread, all with the configured weight decay
 * (decay 1) or none (0); their parameters at p and gradients at g (p[0] and g[0] are element lo's). */
void dt_sgd_update_run(dt_optim *o, float *p, const float *g, float lr, size_t lo, size_t n, int decay);
void dt_adam_update_run(dt_optim *o, float *p, const float *g, float lr, size_t lo, size_t n, int decay);
/* The same over elements [lo, lo + n) of the arena only. */
void dt_sgd_update_span(dt_optim *o, float *params, const float *grads, float lr, size_t lo, size_t n);
void dt_adam_update_span(dt_optim *o, float *params, const float *grads, float lr, size_t lo, size_t n);

#endif
