#pragma once

// PyTorch's serialization (torch.save / torch.load) of one value to and from bytes in
// memory: a whole .pt file, or one entry of a distributed checkpoint's .distcp file.

#include <cstddef>
#include <functional>
#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace tdist::checkpoint::detail {

/// What torch.save(value) writes: tensors saved alone (contiguous, on the CPU), containers
/// untagged, so Python's torch.load(weights_only=True) reads it.
std::string torch_save_bytes(const c10::IValue& value);
/// The same bytes handed to `sink` as they are produced (tensor data without a copy).
void torch_save_to(const c10::IValue& value, const std::function<void(const void*, size_t)>& sink);

/// What torch.load returns for torch.save's bytes; `where` names them in errors.
c10::IValue torch_load_bytes(const void* data, size_t size, const std::string& where);

/// torch_load_bytes of the byte tensor `bytes` (1-D, CPU), whose tensors' storages are views
/// of `bytes` instead of copies (Note [Loading in place]).
c10::IValue torch_load_in_place(const at::Tensor& bytes, const std::string& where);

}  // namespace tdist::checkpoint::detail
