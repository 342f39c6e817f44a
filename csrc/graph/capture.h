#pragma once
// Compiled graphs (torch.compile(backend="tpu")): the ops of one FX graph, run once in fused mode, are captured
// as one chunk, which becomes one fragment: a program. Each later call whose inputs have the captured layout
// records a single node of that program (no op-by-op dispatch, no Python per op): in fused mode it fuses with
// the eager ops around it, in strict mode it launches at once, as any op does.
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace torchtpu {

// Launches what is pending on the device, then records the graph's ops as one capture (the caller runs them in
// fused mode). `inputs`: the graph's tensor inputs, all on this tpu device.
void capture_begin(c10::DeviceIndex device, const std::vector<at::Tensor>& inputs);

struct CaptureResult {
  int32_t program = -1;  // -1: not a program (`why`); the captured ops were launched as an ordinary chunk
  std::string why;
  std::vector<int32_t> check_fragments;  // fragments whose device-side checks the program returns, in order
  int64_t ops = 0;
};
// Ends the capture: the graph's ops become one program, whose node now produces `outputs` (and the new values
// of the inputs the graph overwrote).
CaptureResult capture_end(c10::DeviceIndex device, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs);

// Records one node of the program on `inputs`; nullopt when their layout differs from the captured one.
std::optional<std::vector<at::Tensor>> run_program(int32_t program, const std::vector<at::Tensor>& inputs);

struct ProgramInfo {
  int32_t fragment;
  int64_t ops, leaves, constants, results, mutated, rng;
};
ProgramInfo program_info(int32_t program);

}  // namespace torchtpu
