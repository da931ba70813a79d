// Launchers of the eagle3 CUDA kernels. Plain CUDA + C++17: no torch headers,
// so every .cu compiles standalone with nvcc (CI checks sm_90 and sm_120);
// ops.cpp wraps these for torch.library.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace eagle3 {

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// buffer[t, col + h] = cast(round_to_in_dtype(hidden[t, h] + residual[t, h])).
struct CaptureIntoParams {
  const void* hidden;
  int64_t hidden_row_stride;
  const void* residual;  // nullptr: plain copy of hidden
  int64_t residual_row_stride;
  void* buffer;
  int64_t buffer_row_stride;
  int64_t col;  // slot * hidden_size
  int64_t num_rows;
  int64_t hidden_size;
  DType in_dtype;
  DType out_dtype;
};

// Greedy acceptance over a draft tree, SGLang's verify_tree_greedy contract.
// Tree tensors are [batch, num_draft] int64; accept_index [batch, max_accept]
// int32; accept_token_num [batch] int32; predicts [batch * num_draft] int32.
struct VerifyTreeParams {
  int32_t* predicts;
  int32_t* accept_index;
  int32_t* accept_token_num;
  const int64_t* candidates;
  const int64_t* retrieve_index;
  const int64_t* retrieve_next_token;
  const int64_t* retrieve_next_sibling;
  const int64_t* target_predict;
  int64_t batch;
  int64_t num_draft;
  int64_t max_accept;
};

cudaError_t launch_capture_into(const CaptureIntoParams& p, cudaStream_t stream);
cudaError_t launch_verify_tree_greedy(const VerifyTreeParams& p, cudaStream_t stream);

}  // namespace eagle3
