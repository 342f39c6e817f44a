// Kernels that only touch tensor metadata (sizes, strides, storage) and must be
// real kernels: the CPU fallback itself calls them. Every op that computes
// values is registered from the Python lowering table.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/MemoryFormat.h>
#include <torch/library.h>

#include "core/allocator.h"
#include "core/device.h"
#include "executor/executor.h"

namespace torchtpu {
namespace {

constexpr c10::DispatchKeySet kTpuKeys{c10::DispatchKey::PrivateUse1};

c10::DeviceIndex device_index_of(std::optional<at::Device> device) {
  c10::DeviceIndex idx = device && device->has_index() ? device->index() : current_device();
  check_device_index(idx);
  return idx;
}

// Complex32 (chalf) has no XLA element type; quantized types have no tpu kernels.
void check_dtype(at::ScalarType st) {
  TORCH_CHECK(st != at::kComplexHalf && !c10::isQIntType(st), "tpu: dtype ", st, " is not supported on tpu");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_index_of(device)));
  TORCH_CHECK(!layout || *layout == at::kStrided, "tpu tensors support only the strided layout, got ", *layout);
  const auto st = c10::dtype_or_default(dtype);
  check_dtype(st);
  if (!memory_format || *memory_format == at::MemoryFormat::Contiguous) {
    at::Tensor t = sym_empty(size, st);  // torch.ones(L, L) while L varies: a storage of L's bucket
    if (t.defined()) return t;
  }
  return at::detail::empty_generic(size, tpu_allocator(), kTpuKeys, st, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_index_of(device)));
  const auto st = c10::dtype_or_default(dtype);
  check_dtype(st);
  return at::detail::empty_strided_generic(size, stride, tpu_allocator(), kTpuKeys, st);
}

// empty_like keeps a routed tensor's rows bucketed (the ops on zeros_like(h) then share h's table entries)
at::Tensor empty_like(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                      std::optional<at::Device> device, std::optional<bool> pin_memory,
                      std::optional<at::MemoryFormat> memory_format) {
  return bucketed_like(self, at::native::empty_like(self, dtype, layout, device, pin_memory, memory_format));
}

// x.float() and x.clone() of a tensor whose sizes follow a varying inner size L: the copy follows L too (a storage
// of L's bucket from empty_like). torch's _to_copy and clone take empty_strided, which knows no source: the copy was
// exact, and every op after it ran at exact sizes (a program per length). Undefined when it does not apply.
at::Tensor sym_copy(const at::Tensor& self, at::ScalarType dtype, std::optional<at::MemoryFormat> memory_format,
                    bool non_blocking) {
  if ((memory_format && *memory_format != at::MemoryFormat::Preserve) || self.is_conj() || self.is_neg() ||
      !self.is_non_overlapping_and_dense() || std::get<0>(sym_of(self)) < 0) {
    return at::Tensor();
  }
  at::Tensor r = at::empty_like(self, self.options().dtype(dtype), at::MemoryFormat::Preserve);
  r.copy_(self, non_blocking);
  return r;
}

at::Tensor to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                   std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<at::MemoryFormat> memory_format) {
  if ((!device || (device->is_privateuseone() && (!device->has_index() || device->index() == self.device().index()))) &&
      (!layout || *layout == at::kStrided)) {
    at::Tensor r = sym_copy(self, dtype.value_or(self.scalar_type()), memory_format, non_blocking);
    if (r.defined()) return r;
  }
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

at::Tensor clone(const at::Tensor& self, std::optional<at::MemoryFormat> memory_format) {
  at::Tensor r = sym_copy(self, self.scalar_type(), memory_format, false);
  return r.defined() ? r : at::native::clone(self, memory_format);
}

void maybe_grow_storage(at::TensorImpl* self, size_t needed_bytes) {
  if (needed_bytes == 0) return;
  const auto& storage = self->unsafe_storage();
  if (!storage) {
    const c10::DeviceGuard guard(self->device());
    self->set_storage_keep_dtype(c10::Storage(c10::Storage::use_byte_size_t(), needed_bytes, tpu_allocator(), true));
  } else if (needed_bytes > storage.nbytes()) {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), needed_bytes);
  }
}

// Same metadata rules as CPU's resize_impl_cpu_, with the storage grown through our allocator
// (the CPU version memcpy's the old bytes, which a token cannot be).
void resize_impl(at::TensorImpl* self, c10::IntArrayRef size, at::OptionalIntArrayRef stride, bool resize_storage) {
  if (self->sizes() == size && (!stride || self->strides() == stride.value())) return;
  const auto itemsize = self->dtype().itemsize();
  const auto offset = self->storage_offset();
  size_t nbytes;
  if (stride) {
    self->set_sizes_and_strides(size, *stride);
    nbytes = at::detail::computeStorageNbytes(size, *stride, itemsize, offset);
  } else {
    self->set_sizes_contiguous(size);
    nbytes = at::detail::computeStorageNbytesContiguous(size, itemsize, offset);
  }
  if (resize_storage) maybe_grow_storage(self, nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  resize_impl(impl, size, std::nullopt, true);
  if (memory_format) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve, "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& result, at::Storage storage, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  at::native::checkSetStorage(result, storage, storage_offset, size, stride);
  result.unsafeGetTensorImpl()->set_storage_offset(storage_offset);
  at::OptionalIntArrayRef stride_opt = stride.data() != nullptr ? at::OptionalIntArrayRef(stride) : std::nullopt;
  resize_impl(result.unsafeGetTensorImpl(), size, stride_opt, /*resize_storage=*/true);
  return result;
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  const auto itemsize = self.dtype().itemsize();
  TORCH_CHECK(source.nbytes() % itemsize == 0, "Expected the storage's nbytes (", source.nbytes(),
              ") to be a multiple of the tensor's element size (", itemsize, ")");
  const int64_t numel = static_cast<int64_t>(source.nbytes() / itemsize);
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, tpu_allocator(), true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

bool is_set_to(const at::Tensor& self, const at::Tensor& src) {
  return self.storage().is_alias_of(src.storage()) && self.storage_offset() == src.storage_offset() &&
         self.sizes().equals(src.sizes()) && self.strides().equals(src.strides());
}

// Module._apply and `param.data = t` ask this before swapping a tensor's data in place. Stock TensorImpl only
// knows the in-tree dense backends, so without this every cpu<->tpu move of a module made new Parameters and
// split tied weights. Dense tpu tensors are shallow-copy compatible with each other and with dense CPU tensors,
// as cuda's are.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && !t.is_quantized() && !t.is_nested() &&
           (t.device().is_cpu() || t.device().is_privateuseone());
  };
  return dense(self) && dense(from);
}

}  // namespace
}  // namespace torchtpu

// arange(end) and arange(start, end) as arange(start, end, 1), which the op table lowers as one functional op (torch's
// own composite is empty + arange.out: an out= form resized per call, which no bucketed size can follow)
namespace torchtpu {
at::Tensor arange_start(const at::Scalar& start, const at::Scalar& end, std::optional<at::ScalarType> dtype,
                        std::optional<at::Layout> layout, std::optional<at::Device> device,
                        std::optional<bool> pin_memory) {
  return at::arange(start, end, 1, dtype, layout, device, pin_memory);
}
at::Tensor arange_end(const at::Scalar& end, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                      std::optional<at::Device> device, std::optional<bool> pin_memory) {
  return at::arange(0, end, 1, dtype, layout, device, pin_memory);
}
}  // namespace torchtpu

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("arange.start", torchtpu::arange_start);
  m.impl("arange", torchtpu::arange_end);
  m.impl("empty.memory_format", torchtpu::empty_memory_format);
  m.impl("empty_strided", torchtpu::empty_strided);
  m.impl("empty_like", torchtpu::empty_like);
  m.impl("_to_copy", torchtpu::to_copy);
  m.impl("clone", torchtpu::clone);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("alias", at::native::alias);
  m.impl("resize_", torchtpu::resize_);
  m.impl("set_.source_Storage_storage_offset", torchtpu::set_storage);
  m.impl("set_.source_Storage", torchtpu::set_source_storage);
  m.impl("set_.source_Tensor", torchtpu::set_source_tensor);
  m.impl("set_", torchtpu::set_empty);
  m.impl("is_set_to", torchtpu::is_set_to);
  m.impl("_has_compatible_shallow_copy_type", torchtpu::has_compatible_shallow_copy_type);
}
