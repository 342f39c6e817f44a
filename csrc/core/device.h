#pragma once
// Device bookkeeping shared by the guard, the hooks and the generator.
#include <c10/core/Device.h>

#include <functional>

namespace torchtpu {

c10::DeviceIndex device_count() noexcept;
void set_device_count(c10::DeviceIndex n);
c10::DeviceIndex current_device() noexcept;
void set_current_device(c10::DeviceIndex idx);
void check_device_index(c10::DeviceIndex idx);

// Set by the Python layer: waits for all queued work on the device (takes the GIL itself).
void set_synchronize_callback(std::function<void(c10::DeviceIndex)> fn);
void synchronize_device(c10::DeviceIndex idx);

}  // namespace torchtpu
