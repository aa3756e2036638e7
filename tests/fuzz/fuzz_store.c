/* Fuzz target: the store server's handshake and request parser (two clients,
 * authenticated or not, their bytes in chunks; see dt_store_server_fuzz). */
#include <stddef.h>
#include <stdint.h>

#include "core/impl.h"
#include "dist/dist-impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dt_log_set_level(DT_LOG_LEVEL_ERROR); /* every dropped client is a warning */
  dt_store_server_fuzz(data, size);
  return 0;
}
