// Linear algebra: torch.matmul.
//
// Thread safety: stateless; concurrent calls are safe. The float kernels call OpenBLAS
// (cblas_sgemm / cblas_dgemm), which may use its own threads inside one call, on the CPU, and
// cuBLAS (strided batched gemm, engine/ops/cuda/linalg_kernels.cu) on GPUs; int64 products have
// no GPU kernel (UNIMPLEMENTED).

#ifndef GRADSERVE_ENGINE_OPS_LINALG_H_
#define GRADSERVE_ENGINE_OPS_LINALG_H_

#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// torch.matmul: the dot product of two 1-d tensors (0-d result; DotBackward0); matrix times
// vector (MvBackward0) and vector times matrix (MmBackward0), with the vector's dim dropped from
// the result; the matrix product of 2-d tensors (MmBackward0); and batched products when
// either has more than 2 dims, broadcasting the batch dims (all but the last two) and treating a
// 1-d operand as a vector as above (BmmBackward0 for two batched operands).
// Both operands must share one dtype (float32, float64 or int64; PyTorch does not promote
// here either) and one device. float32/float64 are differentiable, also twice.
// Errors: INVALID_ARGUMENT for a 0-d operand, mismatched inner sizes ("matmul: shapes [2, 3]
// and [4, 5] cannot be multiplied (3 != 4)"), batch dims that do not broadcast, bool or
// mismatched dtypes.
Tensor matmul(const Tensor& input, const Tensor& other);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_LINALG_H_
