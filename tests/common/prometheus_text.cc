#include "tests/common/prometheus_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::testing {
namespace {

// Prints "key<TAB>type<TAB>value" per sample of the file argv[1]. No
// single quote inside: the shell command quotes the script with them.
constexpr char kScript[] = R"(
import sys
from prometheus_client.parser import text_string_to_metric_families
for f in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in f.samples:
        labels = ",".join("%s=\"%s\"" % (k, v) for k, v in sorted(s.labels.items()))
        print("%s{%s}\t%s\t%r" % (s.name, labels, f.type, float(s.value)))
)";

// Debian's interpreter, which python3-prometheus-client installs into (a
// python3 earlier on PATH, e.g. pyenv's, may lack the module).
constexpr char kPython[] = "/usr/bin/python3";

}  // namespace

absl::StatusOr<std::map<std::string, PromSample>> ParsePrometheusText(const std::string& text) {
  char path[] = "/tmp/tandem_prom_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return absl::InternalError("mkstemp failed");
  close(fd);
  {
    std::ofstream out(path, std::ios::binary);
    out << text;
  }
  const std::string err_path = std::string(path) + ".err";
  const std::string command =
      absl::StrCat(kPython, " -c '", kScript, "' ", path, " 2>", err_path);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen python3 failed");
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  std::stringstream err;
  err << std::ifstream(err_path).rdbuf();
  unlink(path);
  unlink(err_path.c_str());
  if (status != 0) {
    return absl::InternalError(absl::StrCat("prometheus_client could not parse: ", err.str()));
  }
  std::map<std::string, PromSample> samples;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, '\t');
    PromSample s;
    if (parts.size() != 3 || !absl::SimpleAtod(parts[2], &s.value)) {
      return absl::InternalError(absl::StrCat("bad parser line: ", line));
    }
    s.type = parts[1];
    samples[parts[0]] = s;
  }
  return samples;
}

}  // namespace tandem::testing
