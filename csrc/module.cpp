// Python bindings of torchtpu._C: device state, storage events, generators.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <ATen/MemoryOverlap.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include "core/allocator.h"
#include "core/device.h"
#include "core/generator.h"

namespace py = pybind11;

namespace {

torchtpu::TpuGeneratorImpl* generator_of(py::object gen, int64_t device_index) {
  if (gen.is_none()) {
    return torchtpu::default_generator(static_cast<c10::DeviceIndex>(device_index))
        .get<torchtpu::TpuGeneratorImpl>();
  }
  TORCH_CHECK(THPGenerator_Check(gen.ptr()), "expected a torch.Generator");
  auto& g = reinterpret_cast<THPGenerator*>(gen.ptr())->cdata;
  TORCH_CHECK(g.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'tpu' device type for generator but found '", g.device().type(), "'");
  return g.get<torchtpu::TpuGeneratorImpl>();
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.def("_set_device_count", [](int64_t n) { torchtpu::set_device_count(static_cast<c10::DeviceIndex>(n)); });
  m.def("_device_count", []() { return static_cast<int64_t>(torchtpu::device_count()); });
  m.def("_current_device", []() { return static_cast<int64_t>(torchtpu::current_device()); });
  m.def("_set_device", [](int64_t i) { torchtpu::set_current_device(static_cast<c10::DeviceIndex>(i)); });
  m.def("_set_synchronize_callback", [](std::function<void(int64_t)> fn) {
    // The callback is invoked from C++ threads that may not hold the GIL (the guard).
    auto holder = std::make_shared<std::function<void(int64_t)>>(std::move(fn));
    torchtpu::set_synchronize_callback([holder](c10::DeviceIndex i) {
      py::gil_scoped_acquire gil;
      (*holder)(static_cast<int64_t>(i));
    });
  });
  m.def("_clear_synchronize_callback", []() { torchtpu::set_synchronize_callback(nullptr); });
  m.def("_drain_storage_events", &torchtpu::drain_storage_events);
  m.def("_allocator_stats", [](int64_t device) {
    auto s = torchtpu::allocator_stats(static_cast<c10::DeviceIndex>(device));
    return py::dict(py::arg("allocated_bytes") = s.allocated_bytes, py::arg("peak_bytes") = s.peak_bytes,
                    py::arg("live_storages") = s.live_storages, py::arg("total_allocations") = s.total_allocations);
  });
  // CPU's out= aliasing checks, on tpu tensors' storage tokens (nothing is dereferenced).
  m.def("_assert_no_internal_overlap", [](const at::Tensor& t) { at::assert_no_internal_overlap(t); });
  m.def("_assert_no_overlap", [](const at::Tensor& a, const at::Tensor& b) { at::assert_no_overlap(a, b); });
  m.def("_reset_peak_allocated",
        [](int64_t device) { torchtpu::reset_peak_allocated(static_cast<c10::DeviceIndex>(device)); });
  m.def(
      "_philox_advance",
      [](py::object gen, int64_t device_index, uint64_t increment) {
        return generator_of(std::move(gen), device_index)->philox_advance(increment);
      },
      py::arg("generator"), py::arg("device_index"), py::arg("increment"));
  m.def("_default_generator", [](int64_t idx) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(torchtpu::default_generator(static_cast<c10::DeviceIndex>(idx))));
  });
}
