// Helpers for the tokenizer tests: loading shared models and reading
// llama.cpp's test-tokenizer-0 pairs (../shared/models/<model>.inp/.out).
#ifndef TANDEM_TESTS_ENGINE_TOKENIZER_TOKENIZER_TEST_UTIL_H_
#define TANDEM_TESTS_ENGINE_TOKENIZER_TOKENIZER_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem::tokenizer::testing {

// 46 cases per .inp file (models/README.md).
inline constexpr int kNumVocabCases = 46;

struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
};

// Opens ../shared/<relative> and builds its tokenizer; fails the test (and
// leaves tokenizer null) on error.
Loaded Load(const std::string& relative);

// The .inp strings of ../shared/models/<model>, split on the exact
// separator "\n__ggml_vocab_test__\n" without trimming; the file ends with a
// separator, so the last element is "".
std::vector<std::string> VocabInputs(const std::string& model);
// The .out lines as id lists, in order (blank lines are empty lists).
std::vector<std::vector<int32_t>> VocabOutputs(const std::string& model);

// Ids -> text through IncrementalDecoder.
std::string Decode(const Tokenizer& t, const std::vector<int32_t>& ids);
// Concatenated TokenBytes (no UTF-8 sanitizing).
std::string RawBytes(const Tokenizer& t, const std::vector<int32_t>& ids);

}  // namespace tandem::tokenizer::testing

#endif  // TANDEM_TESTS_ENGINE_TOKENIZER_TOKENIZER_TEST_UTIL_H_
