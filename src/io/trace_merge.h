/* Merging every rank's trace events into one Chrome trace file on rank 0. */
#ifndef DT_IO_TRACE_MERGE_H
#define DT_IO_TRACE_MERGE_H

#include "dtrain/dist.h"
#include "dtrain/trace.h"

/* Gathers every rank's events (dt_trace_serialize) to rank 0 over the group
 * (g NULL: this process alone) and rank 0 writes
 *   {"traceEvents":[...],"displayTimeUnit":"ms","otherData":{...}}
 * to path atomically (a temporary next to it, fsync, rename, fsync of the
 * directory). otherData holds the world size, the events kept and dropped in
 * all and per rank, the clock and the dtrain version. Collective: every rank
 * calls it, in the same order relative to its other collectives; the others
 * write nothing. A rank that never recorded (tracing off, no events)
 * contributes nothing. Ranks must have enabled tracing with their group rank
 * (it is their pid in the file).
 *
 * Errors: DT_IO naming path when rank 0 cannot write it; then no file (and no
 * temporary) is left at path, an existing file there is untouched, and every
 * rank returns DT_IO. A failed collective returns its status (the group is
 * then broken, as after any failed collective). */
dt_status dt_trace_write_merged(dt_group *g, const char *path);

#endif
