/* The optimizer object: configuration defaults and checks, state buffers, step dispatch. */
#include <math.h>
#include <string.h>

#include "core/impl.h"
#include "optim/optim-impl.h"

static const char *const kind_names[] = {"sgd", "adam", "adamw"};
#define NUM_KINDS ((int)(sizeof kind_names / sizeof kind_names[0]))

void dt_optim_config_default(dt_optim_kind kind, dt_optim_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->kind = kind;
  if (kind == DT_OPTIM_ADAM || kind == DT_OPTIM_ADAMW) {
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = 1e-8f;
    if (kind == DT_OPTIM_ADAMW) cfg->weight_decay = 0.01f;
  }
}

dt_status dt_optim_kind_parse(const char *s, dt_optim_kind *out) {
  if (!s || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_optim_kind_parse: NULL argument");
  for (int k = 0; k < NUM_KINDS; k++) {
    if (strcmp(s, kind_names[k]) == 0) {
      *out = (dt_optim_kind)k;
      return DT_OK;
    }
  }
  return dt_error(DT_INVALID_ARGUMENT, "unknown optimizer \"%s\": choose one of sgd, adam, adamw", s);
}

const char *dt_optim_kind_name(dt_optim_kind k) {
  return (int)k >= 0 && (int)k < NUM_KINDS ? kind_names[k] : "unknown";
}

/* The hyper-parameter checks of torch.optim's constructors (SGD, Adam, AdamW),
 * plus finiteness, which torch leaves to chance. */
static dt_status check_config(const dt_optim_config *c) {
  const char *kind = dt_optim_kind_name(c->kind);
  if ((int)c->kind < 0 || (int)c->kind >= NUM_KINDS)
    return dt_error(DT_INVALID_ARGUMENT, "unknown optimizer kind %d: choose one of sgd, adam, adamw", (int)c->kind);
  if (!isfinite(c->weight_decay) || c->weight_decay < 0)
    return dt_error(DT_INVALID_ARGUMENT, "%s: invalid weight_decay %g: must be finite and >= 0", kind,
                    (double)c->weight_decay);
  if (c->kind == DT_OPTIM_SGD) {
    if (!isfinite(c->momentum) || c->momentum < 0)
      return dt_error(DT_INVALID_ARGUMENT, "sgd: invalid momentum %g: must be finite and >= 0", (double)c->momentum);
    if (!isfinite(c->dampening))
      return dt_error(DT_INVALID_ARGUMENT, "sgd: invalid dampening %g: must be finite", (double)c->dampening);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
      return dt_error(DT_INVALID_ARGUMENT,
                      "sgd: nesterov momentum requires momentum > 0 and dampening 0 (got momentum %g, dampening %g)",
                      (double)c->momentum, (double)c->dampening);
    return DT_OK;
  }
  if (!(c->beta1 >= 0 && c->beta1 < 1))
    return dt_error(DT_INVALID_ARGUMENT, "%s: invalid beta1 %g: must be in [0, 1)", kind, (double)c->beta1);
  if (!(c->beta2 >= 0 && c->beta2 < 1))
    return dt_error(DT_INVALID_ARGUMENT, "%s: invalid beta2 %g: must be in [0, 1)", kind, (double)c->beta2);
  if (!isfinite(c->eps) || c->eps < 0)
    return dt_error(DT_INVALID_ARGUMENT, "%s: invalid eps %g: must be finite and >= 0", kind, (double)c->eps);
  return DT_OK;
}

dt_status dt_optim_new(const dt_optim_config *cfg, size_t count, dt_optim **out) {
  if (!cfg || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_optim_new: NULL argument");
  DT_CHECK(check_config(cfg));
  dt_status st;
  dt_optim *o = NULL;
  DT_CHECK(dt_alloc_array(1, sizeof *o, "optimizer", (void **)&o));
  o->cfg = *cfg;
  o->count = count;
  if (cfg->kind == DT_OPTIM_SGD) {
    /* torch keeps no buffer without momentum */
    if (cfg->momentum != 0) o->state_name[o->num_states++] = "momentum_buffer";
  } else {
    o->state_name[o->num_states++] = "exp_avg";
    o->state_name[o->num_states++] = "exp_avg_sq";
  }
  for (int i = 0; i < o->num_states; i++)
    DT_CHECK_GOTO(dt_alloc_array(count, sizeof(float), o->state_name[i], (void **)&o->state[i]), st, fail);
  *out = o;
  return DT_OK;
fail:
  dt_optim_free(o);
  return st;
}

static void release_states(dt_optim *o) {
  if (o->state_mem)
    o->state_release(o->state_mem, dt_optim_state_bytes(o));
  else
    for (int i = DT_OPTIM_MAX_STATES - 1; i >= 0; i--) dt_free(o->state[i]);
  o->state_mem = NULL;
  for (int i = 0; i < DT_OPTIM_MAX_STATES; i++) o->state[i] = NULL;
}

void dt_optim_free(dt_optim *o) {
  if (!o) return;
  dt_free(o->pieces);
  release_states(o);
  dt_free(o);
}

size_t dt_optim_size(const dt_optim *o) { return o ? o->count : 0; }

size_t dt_optim_state_bytes(const dt_optim *o) {
  return o && o->num_states ? (size_t)o->num_states * o->count * sizeof(float) : 0;
}

dt_status dt_optim_set_state_memory(dt_optim *o, float *mem, int copy, void (*release)(void *mem, size_t bytes)) {
  if (!o || !mem || !release || ((uintptr_t)mem & 63) || !o->num_states || !o->count)
    return dt_error(DT_INVALID_ARGUMENT, "dt_optim_set_state_memory: %s",
                    o && (!o->num_states || !o->count) ? "the optimizer keeps no state"
                                                       : "NULL or unaligned memory, or no release");
  if (mem == o->state_mem) return DT_OK;
  for (int i = 0; copy && i < o->num_states; i++)
    memcpy(mem + (size_t)i * o->count, o->state[i], o->count * sizeof(float));
  release_states(o);
  o->state_mem = mem;
  o->state_release = release;
  for (int i = 0; i < o->num_states; i++) o->state[i] = mem + (size_t)i * o->count;
  return DT_OK;
}

dt_status dt_optim_begin_step(dt_optim *o, float lr) {
  if (!o) return dt_error(DT_INVALID_ARGUMENT, "dt_optim_begin_step: NULL argument");
  if (!isfinite(lr) || lr < 0)
    return dt_error(DT_INVALID_ARGUMENT, "%s: invalid learning rate %g at step %lld: must be finite and >= 0",
                    dt_optim_kind_name(o->cfg.kind), (double)lr, (long long)o->steps + 1);
  o->steps++;
  return DT_OK;
}

/* Part k of parts: a contiguous run of the no-decay table's pieces, or of 8192-element chunks without one, so
 * every element gets exactly dt_optim_step's update. */
void dt_optim_step_part(dt_optim *o, float *params, const float *grads, float lr, int k, int parts) {
  if (!o || parts < 1 || k < 0 || k >= parts) return;
  if (o->pieces) {
    const int64_t a = o->n_pieces * k / parts, b = o->n_pieces * (k + 1) / parts;
    (o->cfg.kind == DT_OPTIM_SGD ? dt_sgd_update_piece_run : dt_adam_update_piece_run)(o, params, grads, lr, a, b);
    return;
  }
  const size_t chunks = (o->count + DT_OPTIM_PIECE - 1) / DT_OPTIM_PIECE;
  const size_t lo = chunks * (size_t)k / (size_t)parts * DT_OPTIM_PIECE;
  size_t hi = chunks * (size_t)(k + 1) / (size_t)parts * DT_OPTIM_PIECE;
  if (hi > o->count) hi = o->count;
  if (lo < hi) (o->cfg.kind == DT_OPTIM_SGD ? dt_sgd_update_span : dt_adam_update_span)(o, params, grads, lr, lo, hi - lo);
}

void dt_optim_step_range(dt_optim *o, float *params, const float *grads, float lr, size_t lo, size_t hi) {
  if (o && grads && lo < hi && lo < o->count) dt_optim_step_block(o, params, grads + lo, lr, lo, hi);
}

/* Elements [lo, hi) with their parameters at p and gradients at g (p[0] and g[0] are element lo's). */
static void step_run(dt_optim *o, float *p, const float *g, float lr, size_t lo, size_t hi) {
  void (*run)(dt_optim *, float *, const float *, float, size_t, size_t, int) =
      o->cfg.kind == DT_OPTIM_SGD ? dt_sgd_update_run : dt_adam_update_run;
  if (!o->pieces) {
    run(o, p, g, lr, lo, hi - lo, 1);
    return;
  }
  int64_t a = 0, b = o->n_pieces; /* the first piece that ends after lo */
  while (a < b) {
    const int64_t mid = a + (b - a) / 2;
    if (o->pieces[mid].lo + o->pieces[mid].n <= lo) a = mid + 1;
    else b = mid;
  }
  for (int64_t i = a; i < o->n_pieces && o->pieces[i].lo < hi; i++) {
    const dt_optim_piece pc = o->pieces[i];
    const size_t s = pc.lo > lo ? pc.lo : lo, e = pc.lo + pc.n < hi ? pc.lo + pc.n : hi;
    run(o, p + (s - lo), g + (s - lo), lr, s, e - s, pc.decay);
  }
}

/* Parameters other cores read between steps are stepped in a copy in L1, SHARED_BLOCK at a time, and streamed back
 * (dt_stream_store): the same arithmetic, so the same bits. */
#define SHARED_BLOCK 2048

void dt_optim_step_block(dt_optim *o, float *params, const float *g, float lr, size_t lo, size_t hi) {
  if (!o) return;
  if (hi > o->count) hi = o->count;
  if (lo >= hi) return;
  if (!o->shared_params) {
    step_run(o, params + lo, g, lr, lo, hi);
    return;
  }
  float copy[SHARED_BLOCK];
  for (size_t b = lo; b < hi; b += SHARED_BLOCK) {
    const size_t e = hi - b < SHARED_BLOCK ? hi : b + SHARED_BLOCK;
    memcpy(copy, params + b, (e - b) * sizeof *copy);
    step_run(o, copy, g + (b - lo), lr, b, e);
    dt_stream_store(params + b, copy, e - b);
  }
}

void dt_optim_set_shared_params(dt_optim *o, int on) {
  if (o) o->shared_params = on != 0;
}

dt_status dt_optim_step(dt_optim *o, float *params, const float *grads, float lr) {
  if (!o || (o->count > 0 && (!params || !grads)))
    return dt_error(DT_INVALID_ARGUMENT, "dt_optim_step: NULL argument");
  DT_CHECK(dt_optim_begin_step(o, lr));
  if (o->pieces)
    (o->cfg.kind == DT_OPTIM_SGD ? dt_sgd_update_pieces : dt_adam_update_pieces)(o, params, grads, lr);
  else if (o->cfg.kind == DT_OPTIM_SGD)
    dt_sgd_update(o, params, grads, lr);
  else
    dt_adam_update(o, params, grads, lr);
  return DT_OK;
}

int64_t dt_optim_step_count(const dt_optim *o) { return o ? o->steps : 0; }

int dt_optim_num_states(const dt_optim *o) { return o ? o->num_states : 0; }

float *dt_optim_state(dt_optim *o, int i, const char **name) {
  if (!o || i < 0 || i >= o->num_states) {
    if (name) *name = NULL;
    return NULL;
  }
  if (name) *name = o->state_name[i];
  return o->state[i];
}

void dt_optim_set_step_count(dt_optim *o, int64_t steps) {
  if (o) o->steps = steps < 0 ? 0 : steps;
}
