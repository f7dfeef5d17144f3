#include "engine/model/model_arch.h"

#include <cstdlib>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace tandem::model {
namespace {

// llama.cpp c392e50: llama_model_rope_type (LLAMA -> NORM, QWEN2 -> NEOX);
// load_tensors (LLAMA: bq/bk/bv and rope_freqs TENSOR_NOT_REQUIRED; QWEN2:
// bq/bk/bv required, no rope_freqs); both create output.weight
// TENSOR_NOT_REQUIRED and fall back to token_embd.
constexpr ArchInfo kArchitectures[] = {
    {ModelArch::kLlama, "llama", RopeType::kNorm, TensorRule::kOptional, TensorRule::kOptional,
     true},
    {ModelArch::kQwen2, "qwen2", RopeType::kNeox, TensorRule::kRequired, TensorRule::kAbsent, true},
};

// The table is indexed by enum value.
static_assert(static_cast<int>(ModelArch::kLlama) == 0);
static_assert(static_cast<int>(ModelArch::kQwen2) == 1);
static_assert(std::size(kArchitectures) == 2);

}  // namespace

std::span<const ArchInfo> Architectures() { return kArchitectures; }

const ArchInfo& GetArchInfo(ModelArch arch) {
  const ArchInfo& row = kArchitectures[static_cast<size_t>(arch)];
  if (row.arch != arch) std::abort();  // table out of enum order: a programmer error
  return row;
}

const ArchInfo* FindArch(std::string_view name) {
  for (const ArchInfo& row : kArchitectures) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

std::string SupportedArchNames() {
  std::string names;
  for (const ArchInfo& row : kArchitectures) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", row.name);
  }
  return names;
}

std::string ArchKey(const ArchInfo& arch, std::string_view suffix) {
  std::string key = arch.name;
  key += '.';
  key += suffix;
  return key;
}

}  // namespace tandem::model
