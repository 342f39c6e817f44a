#include "core/generator.h"

#include <ATen/Functions.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/GeneratorImpl.h>

#include <cstring>
#include <deque>
#include <mutex>

#include "core/device.h"

namespace torchtpu {

constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // same default as CPU/CUDA

TpuGeneratorImpl::TpuGeneratorImpl(c10::DeviceIndex idx)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, idx),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(kDefaultSeed) {}

void TpuGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}
void TpuGeneratorImpl::set_offset(uint64_t offset) { offset_ = offset; }
uint64_t TpuGeneratorImpl::get_offset() const { return offset_; }
uint64_t TpuGeneratorImpl::current_seed() const { return seed_; }
uint64_t TpuGeneratorImpl::seed() {
  auto s = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(s);
  return s;
}

void TpuGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && new_state.numel() == 16,
              "tpu generator: set_rng_state expects a uint8 tensor of 16 bytes (uint64 seed, int64 offset), got ",
              new_state.numel(), " elements of ", new_state.dtype().name());
  TORCH_CHECK(new_state.device().is_cpu(), "tpu generator: the rng state tensor must be on cpu");
  const auto* p = static_cast<const uint8_t*>(new_state.data());
  uint64_t seed;
  int64_t offset;
  std::memcpy(&seed, p, 8);
  std::memcpy(&offset, p + 8, 8);
  seed_ = seed;
  offset_ = static_cast<uint64_t>(offset);
}

c10::intrusive_ptr<c10::TensorImpl> TpuGeneratorImpl::get_state() const {
  auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte).device(at::kCPU));
  auto* p = t.data_ptr<uint8_t>();
  const int64_t offset = static_cast<int64_t>(offset_);
  std::memcpy(p, &seed_, 8);
  std::memcpy(p + 8, &offset, 8);
  return t.getIntrusivePtr();
}

namespace {
std::mutex g_log_mu;
std::vector<PhiloxAdvance>* g_log = nullptr;
}  // namespace

void set_philox_log(std::vector<PhiloxAdvance>* log) {
  std::lock_guard<std::mutex> lk(g_log_mu);
  g_log = log;
}

std::pair<uint64_t, uint64_t> TpuGeneratorImpl::philox_advance(uint64_t increment) {
  std::pair<uint64_t, uint64_t> out;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    out = std::make_pair(seed_, offset_);
    offset_ += increment;
  }
  std::lock_guard<std::mutex> lk(g_log_mu);
  if (g_log != nullptr) {
    g_log->push_back(
        {at::Generator(c10::intrusive_ptr<c10::GeneratorImpl>::reclaim_copy(this)), out.first, out.second, increment});
  }
  return out;
}

TpuGeneratorImpl* TpuGeneratorImpl::clone_impl() const {
  auto* g = new TpuGeneratorImpl(device().index());
  g->seed_ = seed_;
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex idx) {
  static std::mutex mu;
  static std::deque<at::Generator> gens;  // deque: references stay valid as it grows
  if (idx < 0) idx = current_device();
  check_device_index(idx);
  std::lock_guard<std::mutex> lk(mu);
  while (static_cast<c10::DeviceIndex>(gens.size()) <= idx) {
    gens.emplace_back(at::make_generator<TpuGeneratorImpl>(static_cast<c10::DeviceIndex>(gens.size())));
  }
  return gens[idx];
}

}  // namespace torchtpu
