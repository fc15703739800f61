#include "tdist/detail/util/torch_compat.h"

#include <mutex>

#include <ATen/Context.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/variable.h>

#include "tdist/error.h"

namespace tdist::util {

at::Tensor generator_state(const c10::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void free_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) return;
  // Swapping in an empty DataPtr releases the old allocation now, whoever else refers to
  // the StorageImpl. The device stays, so allocate_storage can refill it.
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(static_cast<size_t>(0));
}

void allocate_storage(const at::Tensor& tensor, size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes) return;
  at::Allocator* allocator = storage->allocator();
  if (allocator == nullptr) {
    TDIST_THROW(InvalidArgument,
                "allocate_storage: the storage has no allocator (it wraps external memory); "
                "FSDP needs tensors created by LibTorch");
  }
  // A device's caching allocator allocates on the current device (and stream): make that the
  // tensor's, or the storage would name one device and the TensorImpl another.
  c10::OptionalDeviceGuard on_device(tensor.device());
  storage->set_data_ptr_noswap(allocator->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

size_t storage_nbytes(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return 0;
  return tensor.storage().nbytes();
}

void set_data_in_place(const at::Tensor& variable, const at::Tensor& data) {
  // Tensor::set_data keeps the TensorImpl (so module members, the parameter dict and the
  // optimizer all see the change) and the version counter (so tensors autograd saved stay
  // valid).
  const_cast<at::Tensor&>(variable).set_data(data);
}

}  // namespace tdist::util
