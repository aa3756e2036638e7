/* One comment line naming the CPU under a benchmark table (cpu_line.h). */
#include "cpu_line.h"

#include <string.h>
#include <unistd.h>

/* The text after "key" and its colon on the first /proc/cpuinfo line starting with key, or "" (no /proc). */
static void cpuinfo_field(const char *key, char *out, size_t cap) {
  out[0] = '\0';
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  static char line[8192]; /* the flags line of a recent x86 CPU runs past 1,500 characters */
  const size_t klen = strlen(key);
  while (fgets(line, sizeof line, f)) {
    const char *colon = strchr(line, ':');
    if (strncmp(line, key, klen) != 0 || !colon) continue;
    const char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    snprintf(out, cap, "%.*s", (int)strcspn(v, "\n"), v);
    break;
  }
  fclose(f);
}

/* word appears in the space-separated list */
static int has_word(const char *list, const char *word) {
  const size_t n = strlen(word);
  for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
  return 0;
}

void print_cpu_line(FILE *f) {
  static const char *const features[] = {"avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"};
  char model[256], flags[8192];
  cpuinfo_field("model name", model, sizeof model);
  cpuinfo_field("flags", flags, sizeof flags);
  fprintf(f, "# CPU: %s;", *model ? model : "unknown model");
  for (size_t i = 0; i < sizeof features / sizeof features[0]; i++)
    fprintf(f, " %s%c", features[i], has_word(flags, features[i]) ? '+' : '-');
  fprintf(f, "; %ld online CPUs\n", sysconf(_SC_NPROCESSORS_ONLN));
}
