#include "tdist/fsdp/custom_comm.h"

#include <ATen/ATen.h>

namespace tdist::fsdp {

at::Tensor Comm::allocate(c10::IntArrayRef size, c10::ScalarType dtype, c10::Device device) {
  return at::empty(size, at::TensorOptions().dtype(dtype).device(device));
}

}  // namespace tdist::fsdp
