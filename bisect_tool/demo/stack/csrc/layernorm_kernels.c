// RMSNorm kernels of demollm, written the way vLLM's CUDA launchers are
// (csrc/libtorch_stable/layernorm_kernels.cu): one thread block per row; each of `block` lanes
// accumulates a strided slice of the row's squares, a warp-shuffle tree adds the 32 lanes of each
// warp, and warp 0 adds the warp sums in order (cub::BlockReduce). The block size therefore fixes
// the float32 reduction order of a row.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "batch_invariant.h"

#define DEMOLLM_KERNELS_REV 2600
#define WARP_SIZE 32
#define MAX_BLOCK_SIZE 1024
#define VEC_WIDTH 8

static const char OP_SCHEMAS[] =
    "_C::rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()\n"
    "_C::fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()\n";

const char *bisect_op_schemas(void) { return OP_SCHEMAS; }

int demollm_kernels_rev(void) { return DEMOLLM_KERNELS_REV; }

// Lane 0 of each warp ends with a tree over adjacent lanes (shfl_down by 1, 2, 4, 8, 16); the
// warp sums are then added one after the other.
static float block_reduce_sum(float *lanes, int block) {
  int warps = (block + WARP_SIZE - 1) / WARP_SIZE;
  for (int t = block; t < warps * WARP_SIZE; ++t) lanes[t] = 0.0f;
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) {
    float *v = lanes + w * WARP_SIZE;
    for (int offset = 1; offset < WARP_SIZE; offset <<= 1) {
      for (int lane = 0; lane + offset < WARP_SIZE; lane += 2 * offset) v[lane] += v[lane + offset];
    }
    total += v[0];
  }
  return total;
}

// Loads a lane's slice either element by element or through a VEC_WIDTH staging buffer (the
// "vectorised" path). Both add the same values in the same order.
static float lane_sum_squares(const float *row, int64_t hidden, int lane, int block, int vec) {
  float acc = 0.0f;
  if (vec) {
    float stage[VEC_WIDTH];
    int64_t i = lane;
    while (i < hidden) {
      int n = 0;
      for (; n < VEC_WIDTH && i < hidden; ++n, i += block) stage[n] = row[i];
      for (int k = 0; k < n; ++k) acc += stage[k] * stage[k];
    }
  } else {
    for (int64_t i = lane; i < hidden; i += block) acc += row[i] * row[i];
  }
  return acc;
}

static float row_inv_rms(const float *row, int64_t hidden, float epsilon, int block, int vec) {
  float lanes[MAX_BLOCK_SIZE + WARP_SIZE];
  for (int t = 0; t < block; ++t) lanes[t] = lane_sum_squares(row, hidden, t, block, vec);
  float variance = block_reduce_sum(lanes, block) / (float)hidden;
  return 1.0f / sqrtf(variance + epsilon);
}

// The launcher's block size. Small launches get wide blocks for latency; at 256 tokens and more
// narrower blocks keep more of them resident.
int demollm_rms_norm_block_size(int64_t num_tokens, int64_t hidden_size) {
  int max_block_size = (num_tokens < 256) ? 1024 : 256;
  return hidden_size < max_block_size ? (int)hidden_size : max_block_size;
}

static int use_vectorized_loads(int64_t hidden_size) {
  // Batch-invariant mode disables the vectorised loads.
  return !vllm_is_batch_invariant() && hidden_size % VEC_WIDTH == 0;
}

int rms_norm(float *result, const float *input, const float *weight, float epsilon,
             int64_t num_tokens, int64_t hidden_size) {
  if (num_tokens < 0 || hidden_size <= 0) return -1;
  int block = demollm_rms_norm_block_size(num_tokens, hidden_size);
  int vec = use_vectorized_loads(hidden_size);
  for (int64_t r = 0; r < num_tokens; ++r) {
    const float *in = input + r * hidden_size;
    float *out = result + r * hidden_size;
    float inv = row_inv_rms(in, hidden_size, epsilon, block, vec);
    for (int64_t i = 0; i < hidden_size; ++i) {
      out[i] = in[i] * inv * (weight != NULL ? weight[i] : 1.0f);
    }
  }
  return 0;
}

// In place, like vLLM's: residual <- input + residual; input <- rms_norm(residual) * weight.
int fused_add_rms_norm(float *input, float *residual, const float *weight, float epsilon,
                       int64_t num_tokens, int64_t hidden_size) {
  if (num_tokens < 0 || hidden_size <= 0) return -1;
  int block = demollm_rms_norm_block_size(num_tokens, hidden_size);
  int vec = use_vectorized_loads(hidden_size);
  for (int64_t r = 0; r < num_tokens; ++r) {
    float *in = input + r * hidden_size;
    float *res = residual + r * hidden_size;
    for (int64_t i = 0; i < hidden_size; ++i) res[i] = in[i] + res[i];
    float inv = row_inv_rms(res, hidden_size, epsilon, block, vec);
    for (int64_t i = 0; i < hidden_size; ++i) {
      in[i] = res[i] * inv * (weight != NULL ? weight[i] : 1.0f);
    }
  }
  return 0;
}
