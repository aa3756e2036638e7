/* --init-from: the run starts from pretrained weights taken by name, and says what it took and what it did not. */
#include <stdio.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "train/run.h"

dt_status dt_run_init_from(dt_run *r) {
  dt_init_report rep;
  dt_status st = dt_model_init_from(r->model, r->cfg->init_from, &rep);
  if (st != DT_OK) return dt_error_prefix(st, "--init-from");
  FILE *out = r->lead ? r->cfg->progress : NULL;
  if (!out) return DT_OK;
  fprintf(out, "init from %s%s%s%s: %d tensor(s) copied", rep.path, rep.model_type[0] ? " (model_type " : "",
          rep.model_type, rep.model_type[0] ? ")" : "", rep.copied);
  if (rep.converted) fprintf(out, " (%d converted from 16-bit floats)", rep.converted);
  fprintf(out, "; optimizer state starts fresh\n");
  if (rep.missing)
    fprintf(out, "  %d tensor(s) of %s not in the file keep their initialisation (newly initialized; train them): %s\n",
            rep.missing, r->cfg->model, rep.missing_names);
  if (rep.unexpected)
    fprintf(out, "  %d tensor(s) of the file not in %s are not used: %s\n", rep.unexpected, r->cfg->model,
            rep.unexpected_names);
  if (rep.state_skipped)
    fprintf(out, "  the snapshot's %d optimizer/trainer tensor(s) are not loaded (--resume continues a run)\n",
            rep.state_skipped);
  return DT_OK;
}
