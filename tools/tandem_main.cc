// tandem: the command-line tool of a Tandem cluster. Thin dispatch on the
// subcommand; each lives in its own file (up.cc, generate.cc, status.cc,
// synth_model.cc, selftest.cc, bench/bench_cli.cc).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/bench/bench_cli.h"
#include "tools/generate.h"
#include "tools/role.h"
#include "tools/selftest.h"
#include "tools/status.h"
#include "tools/synth_model.h"
#include "tools/up.h"

namespace {

constexpr char kUsage[] =
    "usage: tandem <command> [flags]\n"
    "\n"
    "commands:\n"
    "  up        run a local cluster (router + workers) in the foreground\n"
    "            [--config deploy/local/cluster.yaml] [--model PATH] [--ready-timeout-s S]\n"
    "            [--prefill-workers N] [--decode-workers M]   (N >= 0, M >= 1; default: the "
    "config's)\n"
    "            [--ephemeral-ports]   (every listen port of the config that is not 0 binds 0:\n"
    "            a second cluster from one config; the process lines give the bound ports)\n"
    "            [--nccl-one-gpu-test]   (NCCL test mode, P and D on one GPU: each worker gets\n"
    "            NCCL_HOSTID=tandem-<name>, NCCL_NET=Socket, NCCL_IB_DISABLE=1,\n"
    "            NCCL_SOCKET_IFNAME=lo; slow, functional only; needs a worker on cuda:N and\n"
    "            kv.transport nccl or auto)\n"
    "  generate  stream one generation from the router\n"
    "            [--router H:P] [--api-key KEY] [--max-tokens N] [--temperature T] [--top-k K]\n"
    "            [--top-p P]\n"
    "            [--seed S] [--route auto|local|remote] [--json] [--timeout-ms MS]\n"
    "            [--stop STR]... [--stop-token-id ID]... [--include-stop-str] [--ignore-eos]\n"
    "            [--min-tokens N] [--logprobs N] [--n N] [--min-p P] [--repetition-penalty P]\n"
    "            [--presence-penalty P] [--frequency-penalty P] [--logit-bias ID=BIAS]...\n"
    "            [--chat] PROMPT   (--chat: send PROMPT as one user message)\n"
    "  status    one line per process; exit 0 when the cluster can serve\n"
    "            [--router H:P] [--api-key KEY] [--check-idle] [--json] [--timeout-ms MS]\n"
    "            (--check-idle: exit 3 while a worker holds work, 4 when one did not answer)\n"
    "  role      change a worker's role at run time (no reload; KV pool and prefix cache kept)\n"
    "            [--router H:P] [--api-key KEY] [--timeout-ms MS] NAME prefill|decode\n"
    "  synth-model  write a llama or qwen2 GGUF of a given shape with seeded random weights\n"
    "            --out PATH (--vocab-from GGUF | --vocab byte)\n"
    "            [--preset 15M|110M|1B|llama3.2-1b | --dim N --layers N --heads N [--kv-heads N]\n"
    "            --ff N [--context N]] [--type "
    "f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k|q4_k_m|q5_k_m]\n"
    "            [--seed S] [--arch llama|qwen2]\n"
    "  selftest  check the CUDA backend against the CPU backend and the goldens (greedy\n"
    "            ids, top-5 logits, BF16 teacher-forced argmax, batched/chunked bit-identity)\n"
    "            [--device cuda:N] [--model PATH]... [--shared DIR]   (default: ../shared's\n"
    "            stories260K and tiny BPE models; exit 0 pass, 1 fail, 77 no CUDA GPU)\n"
    "  bench     a serving benchmark against the router, as vLLM's `bench serve` (table,\n"
    "            --save-result JSON)   [--router H:P] [--backend tandem|openai]\n"
    "            [--dataset random|prefix-repetition|sharegpt|mooncake] [--num-prompts N]\n"
    "            [--request-rate R|inf] ...   (all flags: tandem bench --help)\n"
    "\n"
    "API keys (router.api_keys_file): --api-key KEY, else $TANDEM_API_KEY (which `up`\n"
    "sends in its readiness checks).\n";

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>& args);
  // Its own usage for `tandem <name> --help`; nullptr: the general usage.
  const char* (*usage)();
};

constexpr Command kCommands[] = {
    {"up", tandem::cli::RunUp, nullptr},
    {"generate", tandem::cli::RunGenerate, nullptr},
    {"status", tandem::cli::RunStatus, nullptr},
    {"role", tandem::cli::RunRole, nullptr},
    {"synth-model", tandem::cli::RunSynthModel, nullptr},
    {"selftest", tandem::cli::RunSelftest, nullptr},
    {"bench", tandem::cli::RunBench, tandem::cli::BenchUsage},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  // `tandem --help`, `tandem help`: the usage of every command, on stdout.
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  // The command is checked before any --help after it, so a misspelt
  // command is reported as such (exit 2), with or without --help.
  const Command* found = nullptr;
  for (const Command& c : kCommands) {
    if (command == c.name) found = &c;
  }
  if (found == nullptr) {
    std::fprintf(stderr, "tandem: unknown command '%s'\n%s", command.c_str(), kUsage);
    return 2;
  }
  // `tandem <command> --help`: the command's own usage when it has one,
  // else the usage of every command; stdout, exit 0.
  if (std::find_if(args.begin(), args.end(),
                   [](const std::string& a) { return a == "--help" || a == "-h"; }) != args.end()) {
    std::fputs(found->usage != nullptr ? found->usage() : kUsage, stdout);
    return 0;
  }
  return found->run(args);
}
