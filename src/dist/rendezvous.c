/* Rendezvous: who this process is (rank, world, local rank) and where the
 * master's store is, from tcp://host:port or from what the launcher set
 * (dtrun/torchrun, Open MPI's mpirun, Slurm's srun). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist-impl.h"

/* The value of an environment variable, NULL if unset or empty. */
static const char *env_get(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* Parses a decimal integer in [lo, hi] named `name` (for messages). */
static dt_status parse_int(const char *name, const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (errno || end == s || *end != '\0')
    return dt_error(DT_INVALID_ARGUMENT, "%s='%s' is not an integer", name, s);
  if (x < lo || x > hi) return dt_error(DT_INVALID_ARGUMENT, "%s=%s is outside %ld..%ld", name, s, lo, hi);
  *out = (int)x;
  return DT_OK;
}

/* An optional integer variable: *out = -1 when unset. */
static dt_status env_int_opt(const char *name, long lo, long hi, int *out) {
  const char *v = env_get(name);
  if (!v) {
    *out = -1;
    return DT_OK;
  }
  return parse_int(name, v, lo, hi, out);
}

/* A required integer variable; `why` says who requires it. */
static dt_status env_int_req(const char *name, long lo, long hi, const char *why, int *out) {
  const char *v = env_get(name);
  if (!v) return dt_error(DT_INVALID_ARGUMENT, "%s is not set (%s)", name, why);
  return parse_int(name, v, lo, hi, out);
}

static dt_status set_master_addr(dt_dist_env *e, const char *name, const char *v) {
  size_t n = strlen(v);
  if (n == 0 || n >= sizeof e->master_addr)
    return dt_error(DT_INVALID_ARGUMENT, "%s='%.64s' must have 1..%zu characters", name, v, sizeof e->master_addr - 1);
  memcpy(e->master_addr, v, n + 1);
  return DT_OK;
}

/* rank < world, both named for the message. */
static dt_status check_rank(const char *rname, int rank, const char *wname, int world) {
  if (rank >= world)
    return dt_error(DT_INVALID_ARGUMENT, "%s=%d is not below %s=%d", rname, rank, wname, world);
  return DT_OK;
}

/* ---- Slurm ------------------------------------------------------------------ */

/* The first host of a Slurm node list: "node[01-04,07],gpu2" -> "node01",
 * "rack[1-2]-n[3,5]" -> "rack1-n3". DT_INVALID_ARGUMENT naming var if malformed. */
static dt_status slurm_first_host(const char *var, const char *list, char *out, size_t cap) {
  size_t o = 0;
  const char *p = list;
  while (*p && *p != ',') {
    if (*p == ']') goto bad;
    if (*p == '[') {
      const char *q = ++p;
      while (*q && *q != ']' && *q != '[') q++;
      if (*q != ']') goto bad;
      /* the first item of the range list: digits up to ',' or '-' */
      const char *d = p;
      while (d < q && *d != ',' && *d != '-') d++;
      if (d == p) goto bad;
      for (const char *c = p; c < d; c++) {
        if (*c < '0' || *c > '9') goto bad;
        if (o + 1 >= cap) goto bad;
        out[o++] = *c;
      }
      p = q + 1;
      continue;
    }
    if (o + 1 >= cap) goto bad;
    out[o++] = *p++;
  }
  if (o == 0) goto bad;
  out[o] = '\0';
  return DT_OK;
bad:
  return dt_error(DT_INVALID_ARGUMENT, "%s='%.200s' is not a Slurm node list (like node[01-04,07],gpu2)", var, list);
}

/* Tasks on node `node` from SLURM_TASKS_PER_NODE ("2(x3),1": 2 on nodes 0-2, 1 on node 3); -1 if unknown. */
static int slurm_tasks_on_node(const char *spec, int node) {
  if (!spec || node < 0) return -1;
  const char *p = spec;
  int first = 0;
  while (*p) {
    char *end;
    long count = strtol(p, &end, 10);
    if (end == p || count < 1) return -1;
    long rep = 1;
    p = end;
    if (*p == '(') {
      if (p[1] != 'x') return -1;
      rep = strtol(p + 2, &end, 10);
      if (end == p + 2 || *end != ')' || rep < 1) return -1;
      p = end + 1;
    }
    if (node < first + rep) return (int)count;
    first += (int)rep;
    if (*p == ',') p++;
    else if (*p) return -1;
  }
  return -1;
}

/* Rank, world and local figures of Slurm (no master). */
static dt_status slurm_ranks(dt_dist_env *e) {
  static const char *why = "srun sets it";
  DT_CHECK(env_int_req("SLURM_NTASKS", 1, 1 << 24, why, &e->world_size));
  DT_CHECK(env_int_req("SLURM_PROCID", 0, 1 << 24, why, &e->rank));
  DT_CHECK(check_rank("SLURM_PROCID", e->rank, "SLURM_NTASKS", e->world_size));
  DT_CHECK(env_int_opt("SLURM_LOCALID", 0, 1 << 24, &e->local_rank));
  DT_CHECK(env_int_opt("SLURM_NODEID", 0, 1 << 24, &e->node_rank));
  e->local_world_size = slurm_tasks_on_node(env_get("SLURM_TASKS_PER_NODE"), e->node_rank);
  if (e->local_rank >= 0 && e->local_world_size >= 0 && e->local_rank >= e->local_world_size)
    e->local_world_size = -1; /* inconsistent: let the group find out by host identity */
  return DT_OK;
}

static dt_status from_slurm(dt_dist_env *e) {
  DT_CHECK(slurm_ranks(e));
  const char *addr = env_get("MASTER_ADDR");
  if (addr) {
    DT_CHECK(set_master_addr(e, "MASTER_ADDR", addr));
  } else {
    const char *var = "SLURM_JOB_NODELIST";
    const char *list = env_get(var);
    if (!list) list = env_get(var = "SLURM_NODELIST");
    if (!list)
      return dt_error(DT_INVALID_ARGUMENT,
                      "MASTER_ADDR is not set and neither is SLURM_JOB_NODELIST or SLURM_NODELIST to take it from");
    DT_CHECK(slurm_first_host(var, list, e->master_addr, sizeof e->master_addr));
  }
  const char *port = env_get("MASTER_PORT");
  if (port) {
    DT_CHECK(parse_int("MASTER_PORT", port, 1, 65535, &e->master_port));
  } else {
    const char *job = env_get("SLURM_JOB_ID");
    if (!job) return dt_error(DT_INVALID_ARGUMENT, "MASTER_PORT is not set and neither is SLURM_JOB_ID to derive it from");
    int id;
    DT_CHECK(parse_int("SLURM_JOB_ID", job, 0, 2147483647L, &id));
    e->master_port = 10000 + id % 20000; /* same on every task of the job, clear of the well-known ports */
  }
  e->source = "slurm";
  return DT_OK;
}

/* ---- Open MPI ----------------------------------------------------------------- */

static dt_status master_from_env(dt_dist_env *e, const char *launcher) {
  const char *addr = env_get("MASTER_ADDR"), *port = env_get("MASTER_PORT");
  if (!addr || !port)
    return dt_error(DT_INVALID_ARGUMENT,
                    "%s sets the ranks but not the master: %s (pass --master HOST:PORT, or export MASTER_ADDR and "
                    "MASTER_PORT and forward them with mpirun -x MASTER_ADDR -x MASTER_PORT)",
                    launcher,
                    !addr && !port ? "MASTER_ADDR and MASTER_PORT are not set"
                    : !addr        ? "MASTER_ADDR is not set"
                                   : "MASTER_PORT is not set");
  DT_CHECK(set_master_addr(e, "MASTER_ADDR", addr));
  DT_CHECK(parse_int("MASTER_PORT", port, 1, 65535, &e->master_port));
  return DT_OK;
}

/* Rank, world and local figures of Open MPI (no master). */
static dt_status ompi_ranks(dt_dist_env *e) {
  static const char *why = "mpirun sets it";
  DT_CHECK(env_int_req("OMPI_COMM_WORLD_SIZE", 1, 1 << 24, why, &e->world_size));
  DT_CHECK(env_int_req("OMPI_COMM_WORLD_RANK", 0, 1 << 24, why, &e->rank));
  DT_CHECK(check_rank("OMPI_COMM_WORLD_RANK", e->rank, "OMPI_COMM_WORLD_SIZE", e->world_size));
  DT_CHECK(env_int_opt("OMPI_COMM_WORLD_LOCAL_RANK", 0, 1 << 24, &e->local_rank));
  DT_CHECK(env_int_opt("OMPI_COMM_WORLD_LOCAL_SIZE", 1, 1 << 24, &e->local_world_size));
  if (e->local_rank >= 0 && e->local_world_size >= 0)
    DT_CHECK(check_rank("OMPI_COMM_WORLD_LOCAL_RANK", e->local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE", e->local_world_size));
  e->node_rank = -1;
  return DT_OK;
}

/* ---- torchrun / dtrun ------------------------------------------------------------ */

static dt_status torchrun_ranks(dt_dist_env *e) {
  static const char *why = "torchrun and dtrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT together";
  DT_CHECK(env_int_req("WORLD_SIZE", 1, 1 << 24, why, &e->world_size));
  DT_CHECK(env_int_req("RANK", 0, 1 << 24, why, &e->rank));
  DT_CHECK(check_rank("RANK", e->rank, "WORLD_SIZE", e->world_size));
  DT_CHECK(env_int_opt("LOCAL_RANK", 0, 1 << 24, &e->local_rank));
  DT_CHECK(env_int_opt("LOCAL_WORLD_SIZE", 1, 1 << 24, &e->local_world_size));
  if (e->local_rank >= 0 && e->local_world_size >= 0)
    DT_CHECK(check_rank("LOCAL_RANK", e->local_rank, "LOCAL_WORLD_SIZE", e->local_world_size));
  DT_CHECK(env_int_opt("GROUP_RANK", 0, 1 << 24, &e->node_rank));
  return DT_OK;
}

static dt_status from_torchrun(dt_dist_env *e) {
  static const char *why = "torchrun and dtrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT together";
  DT_CHECK(torchrun_ranks(e));
  const char *addr = env_get("MASTER_ADDR");
  if (!addr) return dt_error(DT_INVALID_ARGUMENT, "MASTER_ADDR is not set (%s)", why);
  DT_CHECK(set_master_addr(e, "MASTER_ADDR", addr));
  DT_CHECK(env_int_req("MASTER_PORT", 1, 65535, why, &e->master_port));
  e->source = "torchrun";
  return DT_OK;
}

static int torchrun_launched(void) { return env_get("RANK") || env_get("WORLD_SIZE"); }
static int slurm_launched(void) { return env_get("SLURM_PROCID") != NULL; }

/* ---- tcp://host:port ------------------------------------------------------------- */

static dt_status from_tcp(const char *init_method, int rank, int world_size, dt_dist_env *e) {
  const char *hp = init_method + strlen("tcp://");
  const char *colon = strrchr(hp, ':');
  if (!colon || colon == hp)
    return dt_error(DT_INVALID_ARGUMENT, "init_method '%s': expected tcp://HOST:PORT", init_method);
  size_t hn = (size_t)(colon - hp);
  if (hn >= sizeof e->master_addr)
    return dt_error(DT_INVALID_ARGUMENT, "init_method '%.64s...': host name longer than %zu characters", init_method,
                    sizeof e->master_addr - 1);
  memcpy(e->master_addr, hp, hn);
  e->master_addr[hn] = '\0';
  char port_name[300];
  snprintf(port_name, sizeof port_name, "port of init_method '%.250s'", init_method);
  DT_CHECK(parse_int(port_name, colon + 1, 1, 65535, &e->master_port));
  e->local_rank = e->local_world_size = e->node_rank = -1;
  if (rank >= 0) {
    if (world_size < 1) return dt_error(DT_INVALID_ARGUMENT, "%s: world size %d must be at least 1", init_method, world_size);
    if (rank >= world_size)
      return dt_error(DT_INVALID_ARGUMENT, "%s: rank %d is not below world size %d", init_method, rank, world_size);
    e->rank = rank;
    e->world_size = world_size;
  } else if (torchrun_launched()) {
    DT_CHECK(torchrun_ranks(e));
  } else if (env_get("OMPI_COMM_WORLD_RANK") || env_get("OMPI_COMM_WORLD_SIZE")) {
    DT_CHECK(ompi_ranks(e));
  } else if (slurm_launched()) {
    DT_CHECK(slurm_ranks(e));
  } else {
    return dt_error(DT_INVALID_ARGUMENT,
                    "%s: no rank given and no launcher variables to take it from (set rank and world size, or "
                    "launch with dtrun, torchrun, mpirun or srun)",
                    init_method);
  }
  e->source = "tcp";
  return DT_OK;
}

/* ---- job identity ------------------------------------------------------------------ */

/* Under srun with no DT_RUN_ID: "slurm-<job>.<step>", so two jobs sharing a node never share names (shm). */
static const char *slurm_run_id(dt_dist_env *e, char *buf, size_t cap) {
  const char *job = env_get("SLURM_JOB_ID"), *step = env_get("SLURM_STEP_ID");
  if (strcmp(e->source, "slurm") != 0 || !job) return NULL;
  snprintf(buf, cap, "slurm-%.40s.%.20s", job, step ? step : "0");
  return buf;
}

static dt_status job_identity(dt_dist_env *e) {
  char slurm_id[80];
  const char *name = "DT_RUN_ID";
  const char *id = env_get(name);
  if (!id) id = env_get(name = "TORCHELASTIC_RUN_ID");
  if (!id) id = slurm_run_id(e, slurm_id, sizeof slurm_id);
  if (!id) id = "default";
  size_t n = strlen(id);
  if (n < 1 || n >= sizeof e->run_id)
    return dt_error(DT_INVALID_ARGUMENT, "%s='%.64s' must have 1..%zu characters", name, id, sizeof e->run_id - 1);
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
             c == '-';
    if (!ok)
      return dt_error(DT_INVALID_ARGUMENT, "%s='%s' may hold only letters, digits, '.', '_' and '-'", name, id);
  }
  memcpy(e->run_id, id, n + 1);
  const char *rc = env_get(name = "DT_RESTART_COUNT");
  if (!rc) rc = env_get(name = "TORCHELASTIC_RESTART_COUNT");
  e->restart_count = 0;
  if (rc) DT_CHECK(parse_int(name, rc, 0, 1 << 30, &e->restart_count));
  const char *served = env_get("DT_STORE_SERVED");
  e->store_served = 0;
  if (served) DT_CHECK(parse_int("DT_STORE_SERVED", served, 0, 1, &e->store_served));
  return dt_job_secret_from_env(e->job_secret, sizeof e->job_secret);
}

int dt_dist_launched_world(const char **var) {
  static const char *const vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = env_get(vars[i]);
    char *end = NULL;
    errno = 0;
    const long n = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || n < 1 || n > 1 << 24) continue;
    if (var) *var = vars[i];
    return (int)n;
  }
  if (var) *var = NULL;
  return 1;
}

dt_status dt_dist_env_detect(const char *init_method, int rank, int world_size, dt_dist_env *env) {
  dt_dist_env e;
  memset(&e, 0, sizeof e);
  e.local_rank = e.local_world_size = e.node_rank = -1;
  if (init_method && *init_method && strcmp(init_method, "env://") != 0) {
    if (strncmp(init_method, "tcp://", 6) != 0)
      return dt_error(DT_INVALID_ARGUMENT, "init_method '%s': expected env:// or tcp://HOST:PORT", init_method);
    DT_CHECK(from_tcp(init_method, rank, world_size, &e));
  } else if (torchrun_launched()) {
    DT_CHECK(from_torchrun(&e));
  } else if (env_get("OMPI_COMM_WORLD_RANK") || env_get("OMPI_COMM_WORLD_SIZE")) {
    DT_CHECK(ompi_ranks(&e));
    DT_CHECK(master_from_env(&e, "mpirun"));
    e.source = "openmpi";
  } else if (slurm_launched()) {
    DT_CHECK(from_slurm(&e));
  } else {
    return dt_error(DT_INVALID_ARGUMENT,
                    "no distributed environment: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (dtrun and "
                    "torchrun do), or launch with mpirun or srun");
  }
  dt_status st = job_identity(&e);
  if (st == DT_OK) *env = e;
  memset(e.job_secret, 0, sizeof e.job_secret);
  return st;
}
