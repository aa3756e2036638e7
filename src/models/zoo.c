/* Model zoo registry: name, one-line description and builder of every model, looked up by name. */
#include <string.h>

#include "core/impl.h"
#include "models/zoo.h"

static const struct zoo_entry {
  const char *name;
  const char *doc;
  dt_zoo_build_fn build;
} zoo[] = {
    {"mlp", "flatten, then Linear+ReLU per hidden width (default 256,128), then Linear to the classes",
     dt_zoo_build_mlp},
    {"fashioncnn",
     "2x (Conv2d 3x3 + BatchNorm2d + ReLU + MaxPool2d), Linear 600, Dropout 0.25, Linear 120, Linear classes",
     dt_zoo_build_fashioncnn},
};
#define ZOO_SIZE (sizeof zoo / sizeof zoo[0])

dt_status dt_model_zoo_new(const char *name, const dt_zoo_config *cfg, dt_model **out) {
  if (!name || !cfg || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_model_zoo_new: NULL argument");
  for (size_t i = 0; i < ZOO_SIZE; i++)
    if (strcmp(zoo[i].name, name) == 0) {
      if (cfg->classes < 1)
        return dt_error(DT_INVALID_ARGUMENT, "model %s: classes %d, expected >= 1", name, cfg->classes);
      for (int d = 0; d < 3; d++)
        if (cfg->sample_shape[d] < 1)
          return dt_error(DT_INVALID_ARGUMENT, "model %s: sample_shape[%d] is %lld, expected >= 1", name, d,
                          (long long)cfg->sample_shape[d]);
      dt_status st = zoo[i].build(cfg, out);
      return st == DT_OK ? st : dt_error_prefix(st, "building model %s", name);
    }
  char known[256] = "";
  size_t o = 0;
  for (size_t i = 0; i < ZOO_SIZE && o < sizeof known; i++)
    o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", i ? ", " : "", zoo[i].name);
  return dt_error(DT_NOT_FOUND, "unknown model \"%s\"; known models: %s", name, known);
}

void dt_model_zoo_each(void (*fn)(const char *name, const char *doc, void *user), void *user) {
  if (!fn) return;
  for (size_t i = 0; i < ZOO_SIZE; i++) fn(zoo[i].name, zoo[i].doc, user);
}
