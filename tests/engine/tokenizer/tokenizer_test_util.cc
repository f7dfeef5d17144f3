#include "tests/engine/tokenizer/tokenizer_test_util.h"

#include <sstream>
#include <utility>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tandem::tokenizer::testing {

using ::tandem::testing::ReadFileOrDie;
using ::tandem::testing::SharedPath;

Loaded Load(const std::string& relative) {
  Loaded l;
  auto f = gguf::GgufFile::Open(SharedPath(relative));
  if (!f.ok()) {
    ADD_FAILURE() << f.status();
    return l;
  }
  l.file = std::move(*f);
  auto t = Tokenizer::FromGguf(*l.file);
  if (!t.ok()) {
    ADD_FAILURE() << t.status();
    return l;
  }
  l.tokenizer = std::move(*t);
  return l;
}

std::vector<std::string> VocabInputs(const std::string& model) {
  static const std::string kSeparator = "\n__ggml_vocab_test__\n";
  const std::string inp = ReadFileOrDie(SharedPath("models/" + model + ".inp"));
  std::vector<std::string> cases;
  size_t start = 0;
  for (size_t at; (at = inp.find(kSeparator, start)) != std::string::npos;
       start = at + kSeparator.size()) {
    cases.push_back(inp.substr(start, at - start));
  }
  cases.push_back(inp.substr(start));
  return cases;
}

std::vector<std::vector<int32_t>> VocabOutputs(const std::string& model) {
  std::istringstream out(ReadFileOrDie(SharedPath("models/" + model + ".out")));
  std::vector<std::vector<int32_t>> lines;
  for (std::string line; std::getline(out, line);) {
    std::istringstream ids(line);
    std::vector<int32_t> v;
    for (int32_t id; ids >> id;) v.push_back(id);
    lines.push_back(v);
  }
  return lines;
}

std::string Decode(const Tokenizer& t, const std::vector<int32_t>& ids) {
  IncrementalDecoder d(t);
  std::string text;
  for (int32_t id : ids) text += d.Push(id);
  return text + d.Flush();
}

std::string RawBytes(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::string bytes;
  for (int32_t id : ids) bytes += t.TokenBytes(id);
  return bytes;
}

}  // namespace tandem::tokenizer::testing
