// torch.library bindings of the eagle3 CUDA kernels: torch.ops.eagle3.*.
//
// Every op writes into tensors the caller passes (mutation is declared in the
// schema) and returns nothing, so the fake implementations registered from
// Python (eagle3_backend/ops/_ext.py) are no-ops and the ops are safe under
// torch.compile and CUDA graph capture. Checks name the offending tensor.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "eagle3_kernels.h"

namespace eagle3 {
namespace {

DType to_dtype(const at::Tensor& t, const std::string& name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: break;
  }
  TORCH_CHECK(false, name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
}

void check_cuda(const at::Tensor& t, const std::string& name, const at::Device& device) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but the other tensors are on ", device);
}

void check_rows(const at::Tensor& t, const std::string& name) {
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [rows, hidden], got shape ", t.sizes());
  TORCH_CHECK(t.size(1) <= 1 || t.stride(1) == 1, name,
              " must have a contiguous last dimension, got strides ", t.strides());
}

void check_tree(const at::Tensor& t, const std::string& name, int64_t batch, int64_t num_draft,
                const at::Device& device) {
  TORCH_CHECK(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == batch && t.size(1) == num_draft, name,
              " must be [", batch, ", ", num_draft, "] like candidates, got ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  check_cuda(t, name, device);
}

void throw_on(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, "eagle3::", op, " launch failed: ", cudaGetErrorString(err));
}

void capture_into(at::Tensor& buffer, int64_t slot, const at::Tensor& hidden,
                  const std::optional<at::Tensor>& residual) {
  check_rows(buffer, "buffer");
  check_rows(hidden, "hidden");
  const DType out_dtype = to_dtype(buffer, "buffer");
  const DType in_dtype = to_dtype(hidden, "hidden");
  const int64_t width = hidden.size(1);
  TORCH_CHECK(width > 0 && buffer.size(1) % width == 0, "buffer width ", buffer.size(1),
              " is not a multiple of hidden's width ", width);
  const int64_t slots = buffer.size(1) / width;
  TORCH_CHECK(slot >= 0 && slot < slots, "slot must be in [0, ", slots, "), got ", slot);
  TORCH_CHECK(buffer.size(0) == hidden.size(0), "buffer has ", buffer.size(0),
              " rows but hidden has ", hidden.size(0));
  if (residual.has_value()) {
    check_rows(*residual, "residual");
    TORCH_CHECK(residual->sizes() == hidden.sizes(), "residual has shape ", residual->sizes(),
                " but hidden has ", hidden.sizes());
    TORCH_CHECK(residual->scalar_type() == hidden.scalar_type(), "residual has dtype ",
                residual->scalar_type(), " but hidden has ", hidden.scalar_type());
  }
  TORCH_CHECK(buffer.is_cuda(), "buffer must be a CUDA tensor, got device ", buffer.device());
  const at::Device device = buffer.device();
  check_cuda(hidden, "hidden", device);
  if (residual.has_value()) check_cuda(*residual, "residual", device);

  const c10::cuda::CUDAGuard guard(device);
  CaptureIntoParams p{};
  p.hidden = hidden.data_ptr();
  p.hidden_row_stride = hidden.stride(0);
  p.residual = residual.has_value() ? residual->data_ptr() : nullptr;
  p.residual_row_stride = residual.has_value() ? residual->stride(0) : 0;
  p.buffer = buffer.data_ptr();
  p.buffer_row_stride = buffer.stride(0);
  p.col = slot * width;
  p.num_rows = hidden.size(0);
  p.hidden_size = width;
  p.in_dtype = in_dtype;
  p.out_dtype = out_dtype;
  throw_on(launch_capture_into(p, c10::cuda::getCurrentCUDAStream(device.index()).stream()),
           "capture_into");
}

void verify_tree_greedy(at::Tensor& predicts, at::Tensor& accept_index, at::Tensor& accept_token_num,
                        const at::Tensor& candidates, const at::Tensor& retrieve_index,
                        const at::Tensor& retrieve_next_token,
                        const at::Tensor& retrieve_next_sibling, const at::Tensor& target_predict) {
  TORCH_CHECK(candidates.dim() == 2, "candidates must be 2-D [batch, num_draft], got shape ",
              candidates.sizes());
  const int64_t batch = candidates.size(0);
  const int64_t num_draft = candidates.size(1);
  TORCH_CHECK(candidates.is_cuda(), "candidates must be a CUDA tensor, got device ",
              candidates.device());
  const at::Device device = candidates.device();
  check_tree(candidates, "candidates", batch, num_draft, device);
  check_tree(retrieve_index, "retrieve_index", batch, num_draft, device);
  check_tree(retrieve_next_token, "retrieve_next_token", batch, num_draft, device);
  check_tree(retrieve_next_sibling, "retrieve_next_sibling", batch, num_draft, device);
  check_tree(target_predict, "target_predict", batch, num_draft, device);
  TORCH_CHECK(predicts.scalar_type() == at::kInt && predicts.dim() == 1 &&
                  predicts.size(0) == batch * num_draft && predicts.is_contiguous(),
              "predicts must be contiguous int32 [", batch * num_draft, "], got ",
              predicts.scalar_type(), " ", predicts.sizes());
  TORCH_CHECK(accept_index.scalar_type() == at::kInt && accept_index.dim() == 2 &&
                  accept_index.size(0) == batch && accept_index.size(1) >= 1 &&
                  accept_index.is_contiguous(),
              "accept_index must be contiguous int32 [", batch, ", max_accept >= 1], got ",
              accept_index.scalar_type(), " ", accept_index.sizes());
  TORCH_CHECK(accept_token_num.scalar_type() == at::kInt && accept_token_num.dim() == 1 &&
                  accept_token_num.size(0) == batch && accept_token_num.is_contiguous(),
              "accept_token_num must be contiguous int32 [", batch, "], got ",
              accept_token_num.scalar_type(), " ", accept_token_num.sizes());
  check_cuda(predicts, "predicts", device);
  check_cuda(accept_index, "accept_index", device);
  check_cuda(accept_token_num, "accept_token_num", device);
  TORCH_CHECK(batch == 0 || num_draft > 0, "candidates must have at least one node per request");

  const c10::cuda::CUDAGuard guard(device);
  VerifyTreeParams p{};
  p.predicts = predicts.data_ptr<int32_t>();
  p.accept_index = accept_index.data_ptr<int32_t>();
  p.accept_token_num = accept_token_num.data_ptr<int32_t>();
  p.candidates = candidates.data_ptr<int64_t>();
  p.retrieve_index = retrieve_index.data_ptr<int64_t>();
  p.retrieve_next_token = retrieve_next_token.data_ptr<int64_t>();
  p.retrieve_next_sibling = retrieve_next_sibling.data_ptr<int64_t>();
  p.target_predict = target_predict.data_ptr<int64_t>();
  p.batch = batch;
  p.num_draft = num_draft;
  p.max_accept = accept_index.size(1);
  throw_on(launch_verify_tree_greedy(p, c10::cuda::getCurrentCUDAStream(device.index()).stream()),
           "verify_tree_greedy");
}

}  // namespace

TORCH_LIBRARY(eagle3, m) {
  m.def("capture_into(Tensor(a!) buffer, int slot, Tensor hidden, Tensor? residual) -> ()");
  m.def(
      "verify_tree_greedy(Tensor(a!) predicts, Tensor(b!) accept_index, "
      "Tensor(c!) accept_token_num, Tensor candidates, Tensor retrieve_index, "
      "Tensor retrieve_next_token, Tensor retrieve_next_sibling, Tensor target_predict) -> ()");
}

// CUDA is the real implementation. CPU runs the same checks, so a CPU call
// fails with a message naming the tensor instead of a dispatcher error.
TORCH_LIBRARY_IMPL(eagle3, CUDA, m) {
  m.impl("capture_into", &capture_into);
  m.impl("verify_tree_greedy", &verify_tree_greedy);
}

TORCH_LIBRARY_IMPL(eagle3, CPU, m) {
  m.impl("capture_into", &capture_into);
  m.impl("verify_tree_greedy", &verify_tree_greedy);
}

}  // namespace eagle3

// A Python module object, so that `import eagle3_backend._C` loads the
// library (and with it the TORCH_LIBRARY registrations above).
#ifdef TORCH_EXTENSION_NAME
#define EAGLE3_CAT_(a, b) a##b
#define EAGLE3_CAT(a, b) EAGLE3_CAT_(a, b)
PyMODINIT_FUNC EAGLE3_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
#endif
