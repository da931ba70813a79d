// Greedy verification of a draft token tree (SGLang's verify_tree_greedy
// contract; see eagle3_backend/ops/reference.py for the specification).
//
// One thread per request: the walk is sequential by nature (each level
// depends on the token accepted at the previous one) and touches at most
// num_draft nodes, so the op is one small launch.
#include "eagle3_kernels.h"

namespace eagle3 {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) verify_tree_greedy_kernel(const VerifyTreeParams p) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= p.batch) return;
  const int64_t base = b * p.num_draft;
  int32_t* accept = p.accept_index + b * p.max_accept;

  int64_t last_row = p.retrieve_index[base];  // the root: last verified token
  accept[0] = static_cast<int32_t>(last_row);
  int64_t node = 0;
  int32_t num_accepted = 0;
  for (int64_t level = 1; level < p.max_accept; ++level) {
    const int64_t want = p.target_predict[last_row];
    int64_t child = p.retrieve_next_token[base + node];
    while (child != -1 && p.candidates[base + child] != want) {
      child = p.retrieve_next_sibling[base + child];
    }
    if (child == -1) break;
    p.predicts[last_row] = static_cast<int32_t>(want);
    last_row = p.retrieve_index[base + child];
    ++num_accepted;
    accept[num_accepted] = static_cast<int32_t>(last_row);
    node = child;
  }
  p.accept_token_num[b] = num_accepted;
  p.predicts[last_row] = static_cast<int32_t>(p.target_predict[last_row]);
}

}  // namespace

cudaError_t launch_verify_tree_greedy(const VerifyTreeParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (p.num_draft <= 0 || p.max_accept <= 0) return cudaErrorInvalidValue;
  const int64_t blocks = (p.batch + kThreads - 1) / kThreads;
  verify_tree_greedy_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace eagle3
