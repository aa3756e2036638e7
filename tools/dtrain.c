/* dtrain command-line tool (placeholder until the trainer lands). */
#include <stdio.h>
#include "dtrain/dtrain.h"
int main(void) { puts("dtrain " DTRAIN_VERSION); return 0; }
