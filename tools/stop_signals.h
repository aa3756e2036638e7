/* SIGINT and SIGTERM for `dtrain train`, taken by one thread that computes nothing.
 *
 * A signal handler runs on a thread the kernel picks, which writes the signal frame below that thread's stack
 * pointer. oneDNN's JIT sgemm kernels (our f32 GEMM on AVX-512 CPUs) point the stack pointer into a heap buffer
 * while they run (oneDNN issue 4845, fixed upstream after the version Debian ships), so a handler that lands on a
 * thread inside one corrupts the heap: "corrupted size vs. prev_size" a few steps after Ctrl-C. Here the signals
 * are blocked in every thread (the mask is inherited, so this starts before any other thread) and one thread takes
 * them with sigwait: no frame is ever written on a compute thread. */
#ifndef DT_TOOLS_STOP_SIGNALS_H
#define DT_TOOLS_STOP_SIGNALS_H

/* Blocks SIGINT and SIGTERM in the calling thread, and so in every thread it creates later, and starts the
 * thread that takes them. Unarmed, a signal does what it did before: ends the process (or nothing, where it was
 * ignored). Returns 0, or -1 with a message printed. Call it once, before any other thread exists. */
int stop_signals_start(void);

/* Armed: the first signal asks the run to stop at the next step boundary (dt_train_request_stop); a second one
 * of the same kind ends the process at once (the Ctrl-C Ctrl-C of a stuck run). */
void stop_signals_arm(int on);

/* The first signal taken while armed (SIGINT or SIGTERM), or 0. */
int stop_signals_first(void);

#endif
