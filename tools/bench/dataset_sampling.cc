#include "tools/bench/dataset_sampling.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::bench {

std::mt19937_64 SeededRng(uint64_t seed, RngStream stream, uint64_t key) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(stream), static_cast<uint32_t>(key),
                    static_cast<uint32_t>(key >> 32)};
  return std::mt19937_64(seq);
}

uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  // 2^64 mod n, computed in 64 bits: (2^64 - n) mod n.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t x = rng();
    if (x >= threshold) return x % n;
  }
}

int64_t UniformInRange(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
  return lo + static_cast<int64_t>(UniformBelow(rng, span));
}

absl::StatusOr<TokenSampler> TokenSampler::Make(int32_t vocab_size,
                                                const std::vector<int32_t>& special_token_ids) {
  if (vocab_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size: must be >= 2 (the model's vocabulary), got ", vocab_size));
  }
  std::vector<bool> special(static_cast<size_t>(vocab_size), false);
  int32_t n_special = 0;
  for (int32_t id : special_token_ids) {
    if (id < 0 || id >= vocab_size || special[id]) continue;
    special[id] = true;
    ++n_special;
  }
  if (n_special == vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size: all ", vocab_size,
                     " ids are special tokens: nothing left to draw prompts from"));
  }
  return TokenSampler(vocab_size, std::move(special));
}

int32_t TokenSampler::Draw(std::mt19937_64& rng) const {
  for (;;) {
    const auto id = static_cast<int32_t>(UniformBelow(rng, static_cast<uint64_t>(vocab_size_)));
    if (!special_[id]) return id;
  }
}

void TokenSampler::Append(std::mt19937_64& rng, int64_t n, std::vector<int32_t>& out) const {
  out.reserve(out.size() + static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(Draw(rng));
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read (", std::strerror(errno), ")"));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read (", std::strerror(errno), ")"));
  }
  return std::move(bytes).str();
}

}  // namespace tandem::bench
