#include "tests/deploy/dockerfile.h"

#include <fnmatch.h>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem::testing {
namespace {

std::vector<std::string> Words(absl::string_view text) {
  return absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
}

absl::Status LineError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

// Reads `FROM [--platform=P] IMAGE [AS NAME]` into a new stage.
absl::StatusOr<DockerStage> ParseFrom(const DockerInstruction& from) {
  std::vector<std::string> words = Words(from.args);
  if (!words.empty() && absl::StartsWith(words[0], "--")) words.erase(words.begin());
  DockerStage stage;
  if (words.size() == 1) {
    stage.base = words[0];
  } else if (words.size() == 3 && absl::AsciiStrToUpper(words[1]) == "AS") {
    stage.base = words[0];
    stage.name = words[2];
  } else {
    return LineError(from.line, absl::StrCat("FROM needs IMAGE [AS NAME], got '", from.args, "'"));
  }
  return stage;
}

// fnmatch-style match of pattern elements against path elements, `**`
// standing for any number of elements (moby/patternmatcher's rule).
bool MatchElements(const std::vector<std::string>& pattern, size_t p,
                   const std::vector<std::string>& path, size_t q) {
  if (p == pattern.size()) return q == path.size();
  if (pattern[p] == "**") {
    for (size_t skip = q; skip <= path.size(); ++skip) {
      if (MatchElements(pattern, p + 1, path, skip)) return true;
    }
    return false;
  }
  if (q == path.size()) return false;
  if (fnmatch(pattern[p].c_str(), path[q].c_str(), 0) != 0) return false;
  return MatchElements(pattern, p + 1, path, q + 1);
}

std::vector<std::string> PathElements(absl::string_view path) {
  std::vector<std::string> elements;
  for (absl::string_view e : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (e == ".") continue;
    elements.emplace_back(e);
  }
  return elements;
}

}  // namespace

absl::StatusOr<Dockerfile> ParseDockerfile(absl::string_view text) {
  std::vector<DockerInstruction> instructions;
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  bool continuing = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int line_number = static_cast<int>(i) + 1;
    absl::string_view line = absl::StripAsciiWhitespace(lines[i]);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    const bool continues = absl::ConsumeSuffix(&line, "\\");
    line = absl::StripAsciiWhitespace(line);
    if (continuing) {
      DockerInstruction& current = instructions.back();
      if (!line.empty()) {
        absl::StrAppend(&current.args, current.args.empty() ? "" : " ", line);
      }
    } else {
      const size_t space = line.find_first_of(" \t");
      DockerInstruction instruction;
      instruction.keyword = absl::AsciiStrToUpper(line.substr(0, space));
      instruction.args = space == absl::string_view::npos
                             ? ""
                             : std::string(absl::StripAsciiWhitespace(line.substr(space)));
      instruction.line = line_number;
      instructions.push_back(std::move(instruction));
    }
    if (absl::StrContains(line, "<<")) return LineError(line_number, "heredocs are not read here");
    continuing = continues;
  }
  if (continuing) return LineError(static_cast<int>(lines.size()), "'\\' on the last line");

  Dockerfile file;
  for (DockerInstruction& instruction : instructions) {
    if (instruction.keyword == "FROM") {
      absl::StatusOr<DockerStage> stage = ParseFrom(instruction);
      if (!stage.ok()) return stage.status();
      file.stages.push_back(*std::move(stage));
    } else if (!file.stages.empty()) {
      file.stages.back().instructions.push_back(std::move(instruction));
    } else if (instruction.keyword == "ARG") {
      file.preamble.push_back(std::move(instruction));
    } else {
      return LineError(instruction.line, absl::StrCat(instruction.keyword, " before FROM"));
    }
  }
  if (file.stages.empty()) return absl::InvalidArgumentError("no FROM");
  return file;
}

absl::StatusOr<std::vector<std::string>> ParseExecForm(absl::string_view args) {
  const nlohmann::json json = nlohmann::json::parse(args, nullptr, /*allow_exceptions=*/false);
  if (!json.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not the exec form (a JSON array of strings): '", args, "'"));
  }
  std::vector<std::string> words;
  for (const nlohmann::json& word : json) {
    if (!word.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("not all strings: '", args, "'"));
    }
    words.push_back(word.get<std::string>());
  }
  return words;
}

absl::StatusOr<DockerCopy> ParseCopy(absl::string_view args) {
  if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(args), "[")) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON-form COPY is not read here: '", args, "'"));
  }
  DockerCopy copy;
  std::vector<std::string> paths;
  for (std::string& word : Words(args)) {
    if (absl::StartsWith(word, "--from=")) {
      copy.from = word.substr(7);
    } else if (!absl::StartsWith(word, "--")) {
      paths.push_back(std::move(word));
    }
  }
  if (paths.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("COPY needs SOURCE... DEST: '", args, "'"));
  }
  copy.destination = paths.back();
  paths.pop_back();
  copy.sources = std::move(paths);
  return copy;
}

std::vector<std::string> AptInstallPackages(absl::string_view shell) {
  std::vector<std::string> packages;
  // "||" and "&&" split as two '|' / '&' in a row: the empty piece between
  // them is skipped with the other empty ones.
  for (absl::string_view command : absl::StrSplit(shell, absl::ByAnyChar(";|&"))) {
    std::vector<std::string> words = Words(command);
    size_t i = 0;
    while (i < words.size() && words[i] != "apt-get" && words[i] != "apt") ++i;
    bool installing = false;
    for (++i; i < words.size(); ++i) {
      const std::string& word = words[i];
      if (word == "-o" || word == "-t" || word == "-c") {
        ++i;  // the option's value
      } else if (absl::StartsWith(word, "-")) {
        continue;
      } else if (!installing) {
        if (word != "install") break;
        installing = true;
      } else if (!absl::StrContains(word, "$")) {
        std::string package(absl::StripSuffix(absl::StripPrefix(word, "'"), "'"));
        packages.push_back(package.substr(0, package.find('=')));
      }
    }
  }
  return packages;
}

std::vector<std::string> PackageListWords(absl::string_view text) {
  std::vector<std::string> packages;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    for (std::string& word : Words(line.substr(0, line.find('#')))) {
      packages.push_back(std::move(word));
    }
  }
  return packages;
}

DockerIgnore::DockerIgnore(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    Pattern pattern;
    pattern.exception = absl::ConsumePrefix(&line, "!");
    pattern.elements = PathElements(line);
    if (!pattern.elements.empty()) patterns_.push_back(std::move(pattern));
  }
}

bool DockerIgnore::Excludes(absl::string_view path) const {
  const std::vector<std::string> elements = PathElements(path);
  bool excluded = false;
  for (const Pattern& pattern : patterns_) {
    // The path itself or any directory above it.
    for (size_t n = 1; n <= elements.size(); ++n) {
      const std::vector<std::string> prefix(elements.begin(), elements.begin() + n);
      if (MatchElements(pattern.elements, 0, prefix, 0)) {
        excluded = !pattern.exception;
        break;
      }
    }
  }
  return excluded;
}

}  // namespace tandem::testing
