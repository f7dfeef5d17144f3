// A Dockerfile and a .dockerignore read the way `docker build` reads them,
// as far as tests/deploy needs (docs.docker.com/reference/dockerfile,
// docs.docker.com/build/concepts/context/#dockerignore-files):
//
//   - A line whose first non-blank character is `#` is a comment, also in
//     the middle of an instruction continued with `\` (Docker drops those
//     lines); a parser directive (`# syntax=...`) is a comment here too.
//   - An instruction is KEYWORD ARGS; a line ending in `\` continues on the
//     next line, joined with one space. Keywords are case-insensitive and
//     stored upper-case. Heredocs (`<<EOF`) are refused, not half-read.
//   - `FROM [--platform=P] IMAGE [AS NAME]` starts a stage; ARGs before the
//     first FROM are the preamble.
#ifndef TANDEM_TESTS_DEPLOY_DOCKERFILE_H_
#define TANDEM_TESTS_DEPLOY_DOCKERFILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::testing {

// One instruction: `keyword` upper-case (RUN, COPY, ...), `args` the rest of
// its text with continuations joined, `line` 1-based where it starts.
struct DockerInstruction {
  std::string keyword;
  std::string args;
  int line = 0;
};

// One build stage: FROM's image and `AS` name ("" when unnamed).
struct DockerStage {
  std::string base;
  std::string name;
  std::vector<DockerInstruction> instructions;
};

struct Dockerfile {
  std::vector<DockerInstruction> preamble;  // ARGs before the first FROM
  std::vector<DockerStage> stages;          // in file order; the last is the image
};

// Parses `text`. Errors (INVALID_ARGUMENT) name the line: an instruction
// before FROM other than ARG, a FROM without an image, a heredoc, a `\` on
// the last line, no FROM at all.
absl::StatusOr<Dockerfile> ParseDockerfile(absl::string_view text);

// The words of an exec-form (JSON array of strings) ENTRYPOINT/CMD; an
// error for the shell form, whose words a shell would split.
absl::StatusOr<std::vector<std::string>> ParseExecForm(absl::string_view args);

// COPY or ADD: `--from=STAGE` ("" when absent; other --flags are skipped),
// the sources and the destination. Errors: fewer than two paths, the JSON
// form (not read here).
struct DockerCopy {
  std::string from;
  std::vector<std::string> sources;
  std::string destination;
};
absl::StatusOr<DockerCopy> ParseCopy(absl::string_view args);

// The packages `apt-get install` (or `apt install`) is given in shell text:
// commands split at `&&`, `||`, `;` and `|`; options (`-y`,
// `--no-install-recommends`, `-o X`) skipped; `=VERSION` pins removed;
// words with `$` (unknown until the build) skipped.
std::vector<std::string> AptInstallPackages(absl::string_view shell);

// The packages of a list file fed to `xargs apt-get install`: whitespace-
// separated words, everything from `#` to the end of a line a comment.
std::vector<std::string> PackageListWords(absl::string_view text);

// .dockerignore: one pattern a line (`#` lines and blanks skipped), paths
// relative to the context root, `*`/`?`/`[...]` within one path element,
// `**` any number of elements, a leading `!` re-includes; the last pattern
// that matches a path or one of its parent directories decides.
class DockerIgnore {
 public:
  explicit DockerIgnore(absl::string_view text);
  // True when `path` (relative to the context, e.g. "scripts/setup") is
  // left out of the build context.
  bool Excludes(absl::string_view path) const;

 private:
  struct Pattern {
    std::vector<std::string> elements;
    bool exception = false;
  };
  std::vector<Pattern> patterns_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_DEPLOY_DOCKERFILE_H_
