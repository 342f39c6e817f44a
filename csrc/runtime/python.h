#pragma once
// Set-up of the Python side of the runtime (module.cpp): numpy's C API and the callbacks into torchtpu.
#include <pybind11/pybind11.h>

namespace torchtpu {
namespace runtime {

void init_numpy();
// {"lower", "python_kernel", "compile_chunk", "submit_checks", "user_line", "wait_all"}: torchtpu/_dispatch.py
void set_callbacks(pybind11::dict callbacks);
// The device-side checks of launched chunks not verified yet: [(int64 vector, fragment id, line)].
pybind11::list take_checks();

}  // namespace runtime
}  // namespace torchtpu
