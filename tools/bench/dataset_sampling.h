// The random draws behind `tandem bench`'s datasets (datasets.h), written
// so that a seed gives the same requests with any C++ standard library:
// std::mt19937_64 and std::seed_seq are specified exactly by the standard
// ([rand.eng.mers], [rand.util.seedseq]), while std::uniform_int_distribution
// and std::shuffle are not, so the integer mapping and the shuffle are our
// own. Internal to tools/bench (datasets.cc, datasets_files.cc, tests).
//
// Threads: pure functions; a TokenSampler is immutable after Make.
#ifndef TANDEM_TOOLS_BENCH_DATASET_SAMPLING_H_
#define TANDEM_TOOLS_BENCH_DATASET_SAMPLING_H_

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::bench {

// What a generator is for: seeds of different streams never coincide.
enum class RngStream : uint32_t {
  kRandom = 1,            // the random dataset (prefix, lengths, ids)
  kPrefixRepetition = 2,  // prefix-repetition (prefixes, suffixes, shuffle)
  kShareGpt = 3,          // ShareGPT's entry order
  kMooncakeBlock = 4,     // a Mooncake hash block; `key` = the hash id
  kMooncakeLine = 5,      // a Mooncake prompt's own tail; `key` = its 1-based line
};

// A generator seeded by std::seed_seq{seed low 32 bits, seed high 32 bits,
// stream, key low 32 bits, key high 32 bits}.
std::mt19937_64 SeededRng(uint64_t seed, RngStream stream, uint64_t key = 0);

// Uniform integer in [0, n), n >= 1: draws x from `rng` until x >= 2^64 mod
// n, then returns x mod n (OpenBSD's arc4random_uniform, widened to 64
// bits): unbiased, and the same values on every platform.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n);

// Uniform integer in [lo, hi], lo <= hi: lo + UniformBelow(rng, hi - lo + 1).
int64_t UniformInRange(std::mt19937_64& rng, int64_t lo, int64_t hi);

// Shuffles `items` in place: Durstenfeld's Fisher–Yates (Knuth, TAOCP vol.
// 2, 3.4.2, Algorithm P): for i = n-1 down to 1, swap items[i] with
// items[UniformBelow(rng, i + 1)].
template <typename T>
void Shuffle(std::vector<T>& items, std::mt19937_64& rng) {
  for (size_t i = items.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(UniformBelow(rng, i));
    std::swap(items[i - 1], items[j]);
  }
}

// Draws token ids uniformly over [0, vocab_size) minus the special ids, by
// rejection (a special id drawn is drawn again).
class TokenSampler {
 public:
  // INVALID_ARGUMENT for vocab_size < 2 or when every id is special. Special
  // ids outside [0, vocab_size) are ignored.
  [[nodiscard]] static absl::StatusOr<TokenSampler> Make(
      int32_t vocab_size, const std::vector<int32_t>& special_token_ids);

  int32_t Draw(std::mt19937_64& rng) const;
  // Appends n ids drawn one after another.
  void Append(std::mt19937_64& rng, int64_t n, std::vector<int32_t>& out) const;

 private:
  TokenSampler(int32_t vocab_size, std::vector<bool> special)
      : vocab_size_(vocab_size), special_(std::move(special)) {}
  int32_t vocab_size_;
  std::vector<bool> special_;  // [vocab_size_]
};

// The whole file as bytes. NOT_FOUND "PATH: cannot read (reason)" for a
// file that cannot be opened or read; INVALID_ARGUMENT for a directory.
[[nodiscard]] absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_DATASET_SAMPLING_H_
