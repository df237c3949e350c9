// Batch-invariant mode switch, shaped like vllm::vllm_is_batch_invariant() in
// csrc/core/batch_invariant.hpp: VLLM_BATCH_INVARIANT is read with getenv once and cached, so it
// must be set before the process starts.
#ifndef DEMOLLM_BATCH_INVARIANT_H
#define DEMOLLM_BATCH_INVARIANT_H

#include <stdlib.h>

static inline int vllm_is_batch_invariant(void) {
  static int cached = -1;
  if (cached < 0) {
    const char *value = getenv("VLLM_BATCH_INVARIANT");
    cached = (value != NULL && atoi(value) != 0) ? 1 : 0;
  }
  return cached;
}

#endif  // DEMOLLM_BATCH_INVARIANT_H
