/* Parity helper: runs dtrain's optimizers, schedules and clipping on inputs from a file, for test_optim_torch.py.
 *
 *   dump_optim step  key=value... IN OUT  IN: params (count) | lr (steps) | grads (steps x count), f32 LE
 *                                          OUT: params (count) | each state buffer (count)
 *   dump_optim lr    key=value...          prints dt_lr_at for steps 0..steps-1, one per line
 *   dump_optim clip  max_norm=X count=N IN OUT   IN: grads (count); OUT: norm | grads (count)
 *
 * keys: kind count steps wd momentum dampening nesterov beta1 beta2 eps nodecay=LO:N,LO:N... (step: the
 *       elements [LO, LO+N) take no weight decay, dt_optim_set_no_decay);
 *       sched base warmup warmup_start step_size gamma total min steps (lr). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"

static int die(const char *what) {
  fprintf(stderr, "dump_optim: %s%s%s\n", what, *dt_last_error() ? ": " : "", dt_last_error());
  return 1;
}

/* Value of key=... among the arguments, or def. */
static double arg(int argc, char **argv, const char *key, double def) {
  size_t k = strlen(key);
  for (int i = 2; i < argc; i++)
    if (strncmp(argv[i], key, k) == 0 && argv[i][k] == '=') return strtod(argv[i] + k + 1, NULL);
  return def;
}
static const char *sarg(int argc, char **argv, const char *key, const char *def) {
  size_t k = strlen(key);
  for (int i = 2; i < argc; i++)
    if (strncmp(argv[i], key, k) == 0 && argv[i][k] == '=') return argv[i] + k + 1;
  return def;
}

static float *read_f32(const char *path, size_t n) {
  float *buf = malloc(n ? n * sizeof(float) : 1);
  FILE *f = fopen(path, "rb");
  int ok = buf && f && fread(buf, sizeof(float), n, f) == n;
  if (f) fclose(f);
  if (!ok) {
    free(buf);
    return NULL;
  }
  return buf;
}

static int write_f32(FILE *f, const float *x, size_t n) { return fwrite(x, sizeof(float), n, f) == n; }

static int cmd_step(int argc, char **argv) {
  dt_optim_kind kind;
  if (dt_optim_kind_parse(sarg(argc, argv, "kind", "sgd"), &kind) != DT_OK) return die("kind");
  dt_optim_config c;
  dt_optim_config_default(kind, &c);
  c.weight_decay = (float)arg(argc, argv, "wd", c.weight_decay);
  c.momentum = (float)arg(argc, argv, "momentum", c.momentum);
  c.dampening = (float)arg(argc, argv, "dampening", c.dampening);
  c.nesterov = (int)arg(argc, argv, "nesterov", c.nesterov);
  c.beta1 = (float)arg(argc, argv, "beta1", c.beta1);
  c.beta2 = (float)arg(argc, argv, "beta2", c.beta2);
  c.eps = (float)arg(argc, argv, "eps", c.eps);
  const size_t count = (size_t)arg(argc, argv, "count", 0);
  const size_t steps = (size_t)arg(argc, argv, "steps", 0);
  float *in = read_f32(argv[argc - 2], count + steps + steps * count);
  if (!in) return die("cannot read input (short file?)");
  float *params = in, *lrs = in + count, *grads = in + count + steps;
  dt_optim *o = NULL;
  if (dt_optim_new(&c, count, &o) != DT_OK) return free(in), die("dt_optim_new");
  dt_optim_range ranges[16];
  int n_ranges = 0;
  for (const char *r = sarg(argc, argv, "nodecay", NULL); r && *r && n_ranges < 16; n_ranges++) {
    char *end;
    ranges[n_ranges].lo = strtoull(r, &end, 10);
    ranges[n_ranges].n = strtoull(end + 1, &end, 10);
    r = *end == ',' ? end + 1 : end;
  }
  if (dt_optim_set_no_decay(o, ranges, n_ranges) != DT_OK) return free(in), die("dt_optim_set_no_decay");
  for (size_t t = 0; t < steps; t++)
    if (dt_optim_step(o, params, grads + t * count, lrs[t]) != DT_OK) return die("dt_optim_step");
  FILE *f = fopen(argv[argc - 1], "wb");
  int ok = f && write_f32(f, params, count);
  for (int i = 0; ok && i < dt_optim_num_states(o); i++) ok = write_f32(f, dt_optim_state(o, i, NULL), count);
  if (f) ok = (fclose(f) == 0) && ok;
  dt_optim_free(o);
  free(in);
  return ok ? 0 : die("cannot write output");
}

static int cmd_lr(int argc, char **argv) {
  dt_lr_schedule s;
  memset(&s, 0, sizeof s);
  if (dt_sched_kind_parse(sarg(argc, argv, "sched", "constant"), &s.kind) != DT_OK) return die("sched");
  s.base_lr = (float)arg(argc, argv, "base", 0.1);
  s.warmup_steps = (int64_t)arg(argc, argv, "warmup", 0);
  s.warmup_start = (float)arg(argc, argv, "warmup_start", 1.0 / 3.0);
  s.step_size = (int64_t)arg(argc, argv, "step_size", 1);
  s.gamma = (float)arg(argc, argv, "gamma", 0.1);
  s.total_steps = (int64_t)arg(argc, argv, "total", 1);
  s.min_lr = (float)arg(argc, argv, "min", 0);
  if (dt_lr_schedule_check(&s) != DT_OK) return die("schedule");
  const int64_t steps = (int64_t)arg(argc, argv, "steps", 1);
  for (int64_t t = 0; t < steps; t++) printf("%.9g\n", (double)dt_lr_at(&s, t));
  return 0;
}

static int cmd_clip(int argc, char **argv) {
  const size_t count = (size_t)arg(argc, argv, "count", 0);
  float *g = read_f32(argv[argc - 2], count), norm = 0;
  if (!g) return die("cannot read input (short file?)");
  if (dt_clip_grad_norm(g, count, (float)arg(argc, argv, "max_norm", 1), &norm) != DT_OK) return free(g), die("clip");
  FILE *f = fopen(argv[argc - 1], "wb");
  int ok = f && write_f32(f, &norm, 1) && write_f32(f, g, count);
  if (f) ok = (fclose(f) == 0) && ok;
  free(g);
  return ok ? 0 : die("cannot write output");
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "lr") == 0) return cmd_lr(argc, argv);
  if (argc >= 4 && strcmp(argv[1], "step") == 0) return cmd_step(argc, argv);
  if (argc >= 4 && strcmp(argv[1], "clip") == 0) return cmd_clip(argc, argv);
  fprintf(stderr, "usage: dump_optim step|lr|clip key=value... [IN OUT]\n");
  return 2;
}
