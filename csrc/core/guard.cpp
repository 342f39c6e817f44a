// Device guard (needed by autograd, torch.Stream/Event and torch.accelerator) and device state.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>

#include "core/device.h"

namespace torchtpu {
namespace {
std::atomic<c10::DeviceIndex> g_count{1};
thread_local c10::DeviceIndex t_current = 0;
std::mutex g_cb_mu;
std::function<void(c10::DeviceIndex)> g_sync_cb;
}  // namespace

c10::DeviceIndex device_count() noexcept { return g_count.load(); }
void set_device_count(c10::DeviceIndex n) { g_count.store(n); }
c10::DeviceIndex current_device() noexcept { return t_current; }

void check_device_index(c10::DeviceIndex idx) {
  TORCH_CHECK(idx >= 0 && idx < device_count(), "Invalid device: tpu:", static_cast<int>(idx), " (this process has ",
              static_cast<int>(device_count()), " tpu device(s): tpu:0..tpu:", static_cast<int>(device_count()) - 1,
              "). Use a device index below the device count, see torch.tpu.device_count().");
}

void set_current_device(c10::DeviceIndex idx) {
  check_device_index(idx);
  t_current = idx;
}

void set_synchronize_callback(std::function<void(c10::DeviceIndex)> fn) {
  std::lock_guard<std::mutex> lk(g_cb_mu);
  g_sync_cb = std::move(fn);
}

void synchronize_device(c10::DeviceIndex idx) {
  std::function<void(c10::DeviceIndex)> cb;
  {
    std::lock_guard<std::mutex> lk(g_cb_mu);
    cb = g_sync_cb;
  }
  if (cb) cb(idx);
}

namespace {

// One in-order queue per device: every stream maps onto it, so events are
// ordered by construction and waiting on one means draining the device.
struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kType, current_device()}; }
  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kType);
    if (d.index() >= 0) set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) t_current = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag) const override {
    // The event remembers its device (index + 1, so that null means "never recorded").
    *event = reinterpret_cast<void*>(static_cast<intptr_t>(stream.device_index()) + 1);
  }
  void block(void*, const c10::Stream&) const override {}  // single in-order queue: nothing to wait for
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override { synchronize_device(s.device_index()); }
  void synchronizeEvent(void* event) const override {
    if (event) synchronize_device(static_cast<c10::DeviceIndex>(reinterpret_cast<intptr_t>(event) - 1));
  }
  void synchronizeDevice(const c10::DeviceIndex idx) const override { synchronize_device(idx); }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override {
    TORCH_CHECK(false, "tpu events do not record timestamps yet (elapsed_time); time with torch.tpu.synchronize()");
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

}  // namespace
}  // namespace torchtpu
