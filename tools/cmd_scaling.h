/* `dtrain bench scaling`: the same training job with 1..N workers, as DDP
 * processes under dtrun and as DataParallel threads, against one worker. */
#ifndef DT_TOOLS_CMD_SCALING_H
#define DT_TOOLS_CMD_SCALING_H

typedef struct bench_scaling_args {
  const char *model;      /* zoo model name; NULL: fashioncnn */
  const char *hidden;     /* mlp widths "W1,W2,..."; NULL: the model's own */
  const char *data;       /* dataset name or IDX directory; NULL: train's default */
  int max_workers;        /* largest worker count; 0: online cores / threads_per_worker (at least 1) */
  int epochs;             /* 0: 1 */
  int skip_epochs;        /* > 0: train samples/s over the epochs after these (warm-up left out); < epochs */
  long long limit_train;  /* training samples; 0: all */
  int batch_size;         /* samples per worker per step (dp gets workers x this); 0: 64 */
  int threads_per_worker; /* compute threads of each worker; 0: 1 */
  int reps;               /* rounds of every run, alternated; each row shows its median round; 0: 1 */
  const char *dtrain;     /* the dtrain binary to run; NULL: this process's own (/proc/self/exe) */
  const char *dtrun;      /* the launcher; NULL: dtrun in the directory of dtrain */
  char *const *extra;     /* more `dtrain train` flags for every run (text data: --vocab, --text-column, ...) */
  int n_extra;
} bench_scaling_args;

/* Runs `dtrain train` once with --strategy single (the baseline: one worker),
 * then for k = 1..max_workers with --strategy ddp (k processes under dtrun) and
 * --strategy dp (k worker threads), every run on the same data, epochs and
 * global batch of k x batch_size, and prints one table row per run: train and
 * inference samples/s, speedup over the baseline, efficiency (speedup / k),
 * and for ddp the time spent in all-reduce and the share of it hidden behind
 * backward; for k >= 2 also k baseline runs at once that never communicate
 * (row "indep": their samples/s summed, the ceiling of k workers here).
 * Every round ends with a second single run; a line gives every other row's
 * samples/s over the mean of the round's two single runs, round by round.
 * With reps > 1 the whole sequence runs reps times and each row is the run
 * with the median train samples/s of its reps (of an even count the lower
 * middle one, single's the upper one: the speedups' base never flatters
 * them), printed after the last round with every round's samples/s.
 * Progress goes to stderr, the table to stdout. Returns an exit code:
 * 0 success, 1 failure (one line "dtrain: ..." on stderr naming the failed
 * command and its exit status). */
int bench_scaling_run(const bench_scaling_args *a);

#endif
