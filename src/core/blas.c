/* Which OpenBLAS kernels run (OpenBLAS picks them by CPU, or by OPENBLAS_CORETYPE, when it loads). */
#include "core/impl.h"

/* OpenBLAS's own query; declared here so the public headers need no cblas.h. */
char *openblas_get_corename(void);

const char *dt_blas_corename(void) {
  const char *name = openblas_get_corename();
  return name ? name : "unknown";
}
