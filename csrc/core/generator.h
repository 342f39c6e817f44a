#pragma once
// Counter-based (seed, offset) generator, like CUDA's Philox one: random ops take
// (seed, offset) as runtime parameters and advance the offset on the host.
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <utility>
#include <vector>

namespace torchtpu {

struct TpuGeneratorImpl : public c10::GeneratorImpl {
  explicit TpuGeneratorImpl(c10::DeviceIndex idx);
  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  // 16 bytes: uint64 seed, int64 offset (the layout DTensor's RNG tracker reads).
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  // Returns (seed, offset before) and advances the offset by `increment`.
  std::pair<uint64_t, uint64_t> philox_advance(uint64_t increment);

 private:
  TpuGeneratorImpl* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

const at::Generator& default_generator(c10::DeviceIndex idx);

// While a compiled graph is captured, every advance is logged: each run of the program then draws fresh states
// from the same generators by the same increments, in the same order as op-by-op execution does.
struct PhiloxAdvance {
  at::Generator generator;
  uint64_t seed, offset, increment;
};
void set_philox_log(std::vector<PhiloxAdvance>* log);  // nullptr: stop logging

}  // namespace torchtpu
