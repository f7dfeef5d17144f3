// `tandem selftest`: checks this machine's CUDA backend against the CPU
// backend and llama.cpp's goldens (issue #15; DESIGN.md, GPU workers).
//
//   tandem selftest [--device cuda:N] [--model PATH]... [--shared DIR]
//
// Without a usable GPU (a build without CUDA, or no CUDA device) it prints
// one line, "selftest: no CUDA GPU (<reason>); nothing to check", on stdout
// and exits 77 (the "skipped" status of ctest and automake).
//
// With one, for each model (default: stories260K, qwen2-tiny-synth and
// llama3-tiny-synth from DIR/models; each --model PATH instead), its
// reference cases are the greedy goldens DIR/goldens/<stem>_greedy.json
// (stories260K: the *_f32kv fields, prompt_token_ids_with_bos; the others:
// prompt_token_ids, generated_token_ids, strict_prefix_len, steps[].top5),
// or, for a model without such a file, three fixed prompts greedily decoded
// (16 tokens) by the CPU backend, whose strict prefix ends at the first
// step with a top-1/top-2 margin under 1e-2. Checks, per model:
//   f32   per case: the CUDA backend with F32 KV, F32 weights kept F32,
//         TF32 off, batch_invariant (BackendOptions keep_f32_weights) and
//         the CPU backend (model::LlamaModel::Forward) greedily decode the
//         strict prefix; pass = the CUDA ids equal the reference's and the
//         CUDA logits of each reference top-5 id are within 1e-2 (plus,
//         for a golden whose output matrix is F16, the bound on llama.cpp's
//         F16 rounding of the activations there, as
//         tests/engine/model/arch_golden_test.cc: up to ~0.05 for the tiny
//         BPE models). The largest |CUDA - CPU| over every logit is
//         reported.
//   bf16  per case: BF16 KV and weights (keep_f32_weights false),
//         teacher-forced on the reference ids; pass = the argmax is the
//         reference id at every step whose reference margin (top-1 minus
//         top-2 logit) exceeds 0.5. Largest |diff| vs the top-5 and vs the
//         CPU's teacher-forced logits reported.
//   mix   f32 and bf16: the first three prompts in one batch, the longest
//         prompt of the cases prefilled in chunks of 7 tokens beside the
//         others' decode steps, 4 greedy steps each; pass = every logit row
//         bit-identical to the same sequence run alone (batch_invariant).
// The forwards run through ModelBackend::Forward on block tables of 16
// tokens (cuda::CudaBackend::LastLogitsForTesting for the logits).
// Output: a table on stdout, one row per check, then a summary line.
// Exit: 0 every check passed, 1 one failed (or a model, golden or backend
// could not be loaded / started: message on stderr), 2 bad flag (message
// naming it), 77 no usable GPU.
#ifndef TANDEM_TOOLS_SELFTEST_H_
#define TANDEM_TOOLS_SELFTEST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/device.h"

namespace tandem::cli {

struct SelftestOptions {
  backend::DeviceSpec device{backend::DeviceSpec::Kind::kCuda, 0};  // --device
  std::vector<std::string> models;  // --model (repeatable); empty: the defaults
  // --shared: the directory holding models/ and goldens/; default
  // $TANDEM_SHARED_DIR, else "../shared".
  std::string shared_dir;
};

// Parses the arguments after "selftest". INVALID_ARGUMENT naming the flag:
// an unknown flag, a positional argument, a --device that is not cuda:N
// (cpu included: the CPU backend is the reference), an empty --model or
// --shared.
[[nodiscard]] absl::StatusOr<SelftestOptions> ParseSelftestArgs(
    const std::vector<std::string>& args);

// The subcommand with the system's devices (backend::SystemDeviceQuery()).
// Returns the exit status (see top of file).
int RunSelftest(const std::vector<std::string>& args);

// The same with `query` answering for the devices (tests: a fake with no
// device gives 77; one with fewer devices than --device's index gives 1
// and CheckDeviceAvailable's message).
int RunSelftest(const std::vector<std::string>& args, const backend::DeviceQuery& query);

// Tests only (no GPU needed): every check above with the CPU backend
// standing in for the CUDA one (a fresh LlamaModel forward over its own F32
// KV), so each must pass; `models` empty: the defaults under shared_dir.
// Prints the table; returns 0 when every check passed, else 1.
int RunSelftestOnCpuForTesting(const std::vector<std::string>& models,
                               const std::string& shared_dir);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_SELFTEST_H_
