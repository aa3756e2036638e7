/* Rendezvous: every launcher's variables, tcp://, job identity, and every
 * malformed or missing value (set and cleared in the test's own environment). */
#include <stdlib.h>

#include "dist/dist-impl.h"
#include "harness.h"

static const char *const all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_TASKS_PER_NODE", "DT_RUN_ID", "TORCHELASTIC_RUN_ID",
    "DT_RESTART_COUNT",
    "TORCHELASTIC_RESTART_COUNT", "DT_STORE_SERVED"};

static void clear_env(void) {
  for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
}

static void set(const char *k, const char *v) { setenv(k, v, 1); }

/* The call must fail with DT_INVALID_ARGUMENT, a detail containing `part`, and leave env untouched. */
#define ASSERT_ENV_ERROR(init_, rank_, world_, part_)                                              \
  do {                                                                                         \
    dt_dist_env e_;                                                                            \
    memset(&e_, 0x5a, sizeof e_);                                                              \
    ASSERT_STATUS(dt_dist_env_detect(init_, rank_, world_, &e_), DT_INVALID_ARGUMENT);            \
    if (!strstr(dt_last_error(), part_)) FAIL_("detail \"%s\" lacks \"%s\"", dt_last_error(), part_); \
    ASSERT_EQ(e_.rank, 0x5a5a5a5a);                                                            \
  } while (0)

static void torchrun_env(void) {
  set("RANK", "3");
  set("WORLD_SIZE", "4");
  set("MASTER_ADDR", "10.0.0.1");
  set("MASTER_PORT", "29500");
}

TEST(nothing_set_says_what_to_do) {
  clear_env();
  dt_dist_env e;
  ASSERT_STATUS(dt_dist_env_detect(NULL, -1, -1, &e), DT_INVALID_ARGUMENT);
  ASSERT_STR_EQ(dt_last_error(),
                "no distributed environment: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (dtrun and torchrun "
                "do), or launch with mpirun or srun");
  ASSERT_ENV_ERROR("env://", -1, -1, "no distributed environment");
  ASSERT_ENV_ERROR("file:///tmp/x", 0, 1, "expected env:// or tcp://HOST:PORT");
}

TEST(torchrun_variables) {
  clear_env();
  torchrun_env();
  dt_dist_env e;
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.source, "torchrun");
  ASSERT_EQ(e.rank, 3);
  ASSERT_EQ(e.world_size, 4);
  ASSERT_EQ(e.local_rank, -1);
  ASSERT_EQ(e.local_world_size, -1);
  ASSERT_EQ(e.node_rank, -1);
  ASSERT_STR_EQ(e.master_addr, "10.0.0.1");
  ASSERT_EQ(e.master_port, 29500);
  ASSERT_STR_EQ(e.run_id, "default");
  ASSERT_EQ(e.restart_count, 0);
  ASSERT_EQ(e.store_served, 0);
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "2");
  set("GROUP_RANK", "1");
  ASSERT_OK(dt_dist_env_detect("env://", -1, -1, &e));
  ASSERT_EQ(e.local_rank, 1);
  ASSERT_EQ(e.local_world_size, 2);
  ASSERT_EQ(e.node_rank, 1);
  /* torchrun wins over Open MPI and Slurm */
  set("OMPI_COMM_WORLD_RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "2");
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "2");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.source, "torchrun");
  ASSERT_EQ(e.rank, 3);
}

TEST(torchrun_errors) {
  clear_env();
  set("RANK", "0");
  ASSERT_ENV_ERROR(NULL, -1, -1, "WORLD_SIZE is not set");
  clear_env();
  set("WORLD_SIZE", "2");
  ASSERT_ENV_ERROR(NULL, -1, -1, "RANK is not set");
  set("RANK", "1");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_ADDR is not set");
  set("MASTER_ADDR", "h");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_PORT is not set");
  clear_env();
  torchrun_env();
  set("RANK", "x1");
  ASSERT_ENV_ERROR(NULL, -1, -1, "RANK='x1' is not an integer");
  set("RANK", "-1");
  ASSERT_ENV_ERROR(NULL, -1, -1, "RANK=-1 is outside");
  set("RANK", "4");
  ASSERT_ENV_ERROR(NULL, -1, -1, "RANK=4 is not below WORLD_SIZE=4");
  set("RANK", "0");
  set("WORLD_SIZE", "0");
  ASSERT_ENV_ERROR(NULL, -1, -1, "WORLD_SIZE=0 is outside");
  set("WORLD_SIZE", "4");
  set("MASTER_PORT", "0");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_PORT=0 is outside 1..65535");
  set("MASTER_PORT", "65536");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_PORT=65536");
  set("MASTER_PORT", "29500abc");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_PORT='29500abc'");
  set("MASTER_PORT", "29500");
  set("LOCAL_RANK", "2");
  set("LOCAL_WORLD_SIZE", "2");
  ASSERT_ENV_ERROR(NULL, -1, -1, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
  set("LOCAL_RANK", "z");
  ASSERT_ENV_ERROR(NULL, -1, -1, "LOCAL_RANK='z'");
  unsetenv("LOCAL_RANK");
  set("GROUP_RANK", "-3");
  ASSERT_ENV_ERROR(NULL, -1, -1, "GROUP_RANK=-3");
}

TEST(open_mpi_variables) {
  clear_env();
  set("OMPI_COMM_WORLD_RANK", "2");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "0");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_ADDR and MASTER_PORT are not set");
  ASSERT_ENV_ERROR(NULL, -1, -1, "--master HOST:PORT");
  set("MASTER_ADDR", "node1");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_PORT is not set");
  set("MASTER_PORT", "1234");
  dt_dist_env e;
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.source, "openmpi");
  ASSERT_EQ(e.rank, 2);
  ASSERT_EQ(e.world_size, 4);
  ASSERT_EQ(e.local_rank, 0);
  ASSERT_EQ(e.local_world_size, 2);
  ASSERT_EQ(e.node_rank, -1);
  ASSERT_STR_EQ(e.master_addr, "node1");
  ASSERT_EQ(e.master_port, 1234);
  /* Open MPI wins over Slurm (mpirun inside an allocation) */
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "1");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.source, "openmpi");
  set("OMPI_COMM_WORLD_RANK", "4");
  ASSERT_ENV_ERROR(NULL, -1, -1, "OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4");
  set("OMPI_COMM_WORLD_RANK", "one");
  ASSERT_ENV_ERROR(NULL, -1, -1, "OMPI_COMM_WORLD_RANK='one'");
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "");
  ASSERT_ENV_ERROR(NULL, -1, -1, "OMPI_COMM_WORLD_SIZE is not set");
}

static void slurm_env(void) {
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "8");
  set("SLURM_LOCALID", "1");
  set("SLURM_NODEID", "2");
  set("SLURM_JOB_ID", "123456");
  set("SLURM_JOB_NODELIST", "node[01-04,07],gpu2");
}

TEST(slurm_variables) {
  clear_env();
  slurm_env();
  dt_dist_env e;
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.source, "slurm");
  ASSERT_EQ(e.rank, 5);
  ASSERT_EQ(e.world_size, 8);
  ASSERT_EQ(e.local_rank, 1);
  ASSERT_EQ(e.node_rank, 2);
  ASSERT_EQ(e.local_world_size, -1);
  ASSERT_STR_EQ(e.master_addr, "node01");
  ASSERT_EQ(e.master_port, 10000 + 123456 % 20000);
  set("SLURM_TASKS_PER_NODE", "2(x3),1");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_EQ(e.local_world_size, 2);
  set("SLURM_NODEID", "3");
  set("SLURM_LOCALID", "0");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_EQ(e.local_world_size, 1);
  /* MASTER_ADDR / MASTER_PORT override the defaults */
  set("MASTER_ADDR", "head");
  set("MASTER_PORT", "4000");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.master_addr, "head");
  ASSERT_EQ(e.master_port, 4000);
}

/* Under srun the run id is the job and step (segment names of two jobs on one node differ); DT_RUN_ID wins. */
TEST(slurm_job_identity) {
  clear_env();
  slurm_env();
  dt_dist_env e;
  set("SLURM_STEP_ID", "3");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.run_id, "slurm-123456.3");
  unsetenv("SLURM_STEP_ID");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.run_id, "slurm-123456.0");
  set("DT_RUN_ID", "mine");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.run_id, "mine");
  /* a torchrun-style launch inside a Slurm job keeps torchrun's identity */
  clear_env();
  set("SLURM_JOB_ID", "77");
  set("RANK", "0");
  set("WORLD_SIZE", "1");
  set("MASTER_ADDR", "h");
  set("MASTER_PORT", "1234");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.run_id, "default");
  clear_env();
}

/* The first host of a node list as rendezvous reads it. */
static const char *first_host(const char *list, dt_dist_env *e) {
  clear_env();
  slurm_env();
  set("SLURM_JOB_NODELIST", list);
  return dt_dist_env_detect(NULL, -1, -1, e) == DT_OK ? e->master_addr : NULL;
}

TEST(slurm_node_list_parser) {
  dt_dist_env e;
  ASSERT_STR_EQ(first_host("node[01-04,07],gpu2", &e), "node01");
  ASSERT_STR_EQ(first_host("gpu2", &e), "gpu2");
  ASSERT_STR_EQ(first_host("a1,b2", &e), "a1");
  ASSERT_STR_EQ(first_host("n[7,9]", &e), "n7");
  ASSERT_STR_EQ(first_host("rack[1-2]-n[003-005]", &e), "rack1-n003");
  ASSERT_STR_EQ(first_host("gpu[10-12]-ib,cpu1", &e), "gpu10-ib");
  ASSERT_STR_EQ(first_host("host.example.org", &e), "host.example.org");
  const char *bad[] = {"node[01-04", "node]01", "[]", "node[a-b]", ",node1", "node[-3]"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    clear_env();
    slurm_env();
    set("SLURM_JOB_NODELIST", bad[i]);
    ASSERT_ENV_ERROR(NULL, -1, -1, "SLURM_JOB_NODELIST=");
  }
  /* SLURM_NODELIST when the job's list is absent */
  clear_env();
  slurm_env();
  unsetenv("SLURM_JOB_NODELIST");
  set("SLURM_NODELIST", "cn[100-101]");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.master_addr, "cn100");
  set("SLURM_NODELIST", "cn[");
  ASSERT_ENV_ERROR(NULL, -1, -1, "SLURM_NODELIST='cn['");
}

TEST(slurm_errors) {
  clear_env();
  slurm_env();
  unsetenv("SLURM_JOB_NODELIST");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_ADDR is not set and neither is SLURM_JOB_NODELIST");
  slurm_env();
  unsetenv("SLURM_JOB_ID");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_PORT is not set and neither is SLURM_JOB_ID");
  set("SLURM_JOB_ID", "12x");
  ASSERT_ENV_ERROR(NULL, -1, -1, "SLURM_JOB_ID='12x'");
  slurm_env();
  unsetenv("SLURM_NTASKS");
  ASSERT_ENV_ERROR(NULL, -1, -1, "SLURM_NTASKS is not set");
  set("SLURM_NTASKS", "5");
  ASSERT_ENV_ERROR(NULL, -1, -1, "SLURM_PROCID=5 is not below SLURM_NTASKS=5");
  set("SLURM_NTASKS", "8");
  set("SLURM_LOCALID", "-1");
  ASSERT_ENV_ERROR(NULL, -1, -1, "SLURM_LOCALID=-1");
  set("SLURM_LOCALID", "0");
  set("SLURM_NODEID", "n");
  ASSERT_ENV_ERROR(NULL, -1, -1, "SLURM_NODEID='n'");
  set("SLURM_NODEID", "0");
  set("MASTER_PORT", "99999");
  ASSERT_ENV_ERROR(NULL, -1, -1, "MASTER_PORT=99999");
}

TEST(tcp_init_method) {
  clear_env();
  dt_dist_env e;
  ASSERT_OK(dt_dist_env_detect("tcp://localhost:23456", 1, 3, &e));
  ASSERT_STR_EQ(e.source, "tcp");
  ASSERT_EQ(e.rank, 1);
  ASSERT_EQ(e.world_size, 3);
  ASSERT_EQ(e.local_rank, -1);
  ASSERT_STR_EQ(e.master_addr, "localhost");
  ASSERT_EQ(e.master_port, 23456);
  /* rank < 0: from the launcher (mpirun ... --master h:p) */
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  ASSERT_OK(dt_dist_env_detect("tcp://10.1.2.3:5000", -1, -1, &e));
  ASSERT_STR_EQ(e.source, "tcp");
  ASSERT_EQ(e.rank, 1);
  ASSERT_EQ(e.world_size, 2);
  ASSERT_EQ(e.local_rank, 1);
  ASSERT_EQ(e.local_world_size, 2);
  ASSERT_STR_EQ(e.master_addr, "10.1.2.3");
  ASSERT_EQ(e.master_port, 5000);
  /* explicit rank wins over the launcher */
  ASSERT_OK(dt_dist_env_detect("tcp://10.1.2.3:5000", 0, 1, &e));
  ASSERT_EQ(e.rank, 0);
  ASSERT_EQ(e.world_size, 1);
  clear_env();
  set("SLURM_PROCID", "3");
  set("SLURM_NTASKS", "4");
  ASSERT_OK(dt_dist_env_detect("tcp://h:5000", -1, -1, &e));
  ASSERT_EQ(e.rank, 3);
  ASSERT_EQ(e.world_size, 4);
  clear_env();
  set("RANK", "2");
  set("WORLD_SIZE", "3");
  ASSERT_OK(dt_dist_env_detect("tcp://h:5000", -1, -1, &e)); /* no MASTER_* needed: the URL says */
  ASSERT_EQ(e.rank, 2);
  clear_env();
  ASSERT_ENV_ERROR("tcp://h:5000", -1, -1, "no rank given");
  ASSERT_ENV_ERROR("tcp://h:5000", 3, 3, "rank 3 is not below world size 3");
  ASSERT_ENV_ERROR("tcp://h:5000", 0, 0, "world size 0");
  ASSERT_ENV_ERROR("tcp://h", 0, 1, "expected tcp://HOST:PORT");
  ASSERT_ENV_ERROR("tcp://:5000", 0, 1, "expected tcp://HOST:PORT");
  ASSERT_ENV_ERROR("tcp://h:0", 0, 1, "is outside 1..65535");
  ASSERT_ENV_ERROR("tcp://h:abc", 0, 1, "'abc' is not an integer");
  ASSERT_ENV_ERROR("tcp://h:", 0, 1, "is not an integer");
}

TEST(job_identity) {
  clear_env();
  torchrun_env();
  dt_dist_env e;
  set("TORCHELASTIC_RUN_ID", "te-1");
  set("TORCHELASTIC_RESTART_COUNT", "2");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.run_id, "te-1");
  ASSERT_EQ(e.restart_count, 2);
  set("DT_RUN_ID", "job_A.1");
  set("DT_RESTART_COUNT", "7");
  set("DT_STORE_SERVED", "1");
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_STR_EQ(e.run_id, "job_A.1");
  ASSERT_EQ(e.restart_count, 7);
  ASSERT_EQ(e.store_served, 1);
  set("DT_RUN_ID", "has space");
  ASSERT_ENV_ERROR(NULL, -1, -1, "DT_RUN_ID='has space'");
  unsetenv("DT_RUN_ID");
  set("TORCHELASTIC_RUN_ID", "a/b");
  ASSERT_ENV_ERROR(NULL, -1, -1, "TORCHELASTIC_RUN_ID='a/b'");
  char long_id[200];
  memset(long_id, 'x', 128);
  long_id[128] = '\0';
  set("DT_RUN_ID", long_id);
  ASSERT_ENV_ERROR(NULL, -1, -1, "must have 1..127 characters");
  long_id[127] = '\0';
  set("DT_RUN_ID", long_id);
  ASSERT_OK(dt_dist_env_detect(NULL, -1, -1, &e));
  ASSERT_EQ(strlen(e.run_id), 127);
  set("DT_RESTART_COUNT", "-1");
  ASSERT_ENV_ERROR(NULL, -1, -1, "DT_RESTART_COUNT=-1");
  unsetenv("DT_RESTART_COUNT");
  set("TORCHELASTIC_RESTART_COUNT", "two");
  ASSERT_ENV_ERROR(NULL, -1, -1, "TORCHELASTIC_RESTART_COUNT='two'");
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  set("DT_STORE_SERVED", "2");
  ASSERT_ENV_ERROR(NULL, -1, -1, "DT_STORE_SERVED=2");
  set("DT_STORE_SERVED", "yes");
  ASSERT_ENV_ERROR(NULL, -1, -1, "DT_STORE_SERVED='yes'");
  clear_env();
}

/* How many copies a launcher started: the first of WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_STEP_NUM_TASKS that holds a
 * count; a batch script's SLURM_NTASKS is not one. */
TEST(launched_world) {
  clear_env();
  const char *var = "x";
  ASSERT_EQ(dt_dist_launched_world(&var), 1);
  ASSERT(var == NULL);
  set("SLURM_NTASKS", "4"); /* sbatch --ntasks=4: the script itself is one process */
  ASSERT_EQ(dt_dist_launched_world(NULL), 1);
  set("SLURM_STEP_NUM_TASKS", "3");
  ASSERT_EQ(dt_dist_launched_world(&var), 3);
  ASSERT_STR_EQ(var, "SLURM_STEP_NUM_TASKS");
  set("OMPI_COMM_WORLD_SIZE", "5");
  ASSERT_EQ(dt_dist_launched_world(&var), 5);
  ASSERT_STR_EQ(var, "OMPI_COMM_WORLD_SIZE");
  set("WORLD_SIZE", "2");
  ASSERT_EQ(dt_dist_launched_world(&var), 2);
  ASSERT_STR_EQ(var, "WORLD_SIZE");
  static const char *const bad[] = {"two", "0", "-2", "3x", "", "99999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    set("WORLD_SIZE", bad[i]); /* passed over: the next variable counts */
    ASSERT_EQ(dt_dist_launched_world(&var), 5);
  }
  clear_env();
}

TEST_MAIN(TEST_ENTRY(nothing_set_says_what_to_do), TEST_ENTRY(torchrun_variables), TEST_ENTRY(torchrun_errors),
          TEST_ENTRY(open_mpi_variables), TEST_ENTRY(slurm_variables), TEST_ENTRY(slurm_job_identity),
          TEST_ENTRY(slurm_node_list_parser), TEST_ENTRY(slurm_errors), TEST_ENTRY(tcp_init_method),
          TEST_ENTRY(job_identity), TEST_ENTRY(launched_world))
