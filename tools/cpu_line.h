/* The machine a benchmark table was measured on, as one comment line (model, the vector features that change
 * dtrain's kernels, online CPUs): every table prints it, since the machines differ from run to run. */
#ifndef DT_TOOLS_CPU_LINE_H
#define DT_TOOLS_CPU_LINE_H

#include <stdio.h>

/* "# CPU: AMD EPYC; avx2+ fma+ f16c+ avx512f+ avx512_bf16+ avx512_fp16- amx_bf16-; 2 online CPUs" */
void print_cpu_line(FILE *f);

#endif
