// `tandem selftest` (see selftest.h).
#include "tools/selftest.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend/backend_factory.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/kv/kv_storage.h"
#include "engine/model/llama_model.h"
#include "engine/model/weight_matrix.h"
#include "nlohmann/json.hpp"
#include "tools/cli_args.h"

#ifdef TANDEM_HAVE_CUDA
#include "engine/backend/cuda/cuda_backend.h"
#endif

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "usage: tandem selftest [--device cuda:N] [--model PATH]... [--shared DIR]\n";

constexpr int32_t kBlockSize = 16;
constexpr double kTop5Tolerance = 1e-2;  // F32 accuracy mode vs the reference
constexpr double kBf16Margin = 0.5;      // BF16: argmax checked where margin > this
constexpr double kStrictMargin = 1e-2;   // CPU reference: strict prefix ends below this
constexpr int kMixDecodeSteps = 4;
constexpr int kMixChunk = 7;
constexpr int kCpuReferenceSteps = 16;

[[nodiscard]] absl::Status FlagError(const std::string& flag, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", what));
}

// One reference case: prompt, the ids to reproduce, how many of them are
// strict, and per step the reference top-5 (id, logit) with its margin.
struct RefCase {
  std::string name;
  std::vector<int32_t> prompt;
  std::vector<int32_t> ids;
  size_t strict = 0;
  std::vector<std::vector<std::pair<int32_t, double>>> top5;  // per step, best first
};

double Margin(const std::vector<std::pair<int32_t, double>>& top5) {
  return top5.size() < 2 ? 0.0 : top5[0].second - top5[1].second;
}

// Lowest id among the largest logits.
int32_t Argmax(std::span<const float> row) {
  size_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

// The reference top-5 of a logits row: ids by descending logit, lowest id
// first on ties.
std::vector<std::pair<int32_t, double>> Top5(std::span<const float> row) {
  std::vector<int32_t> ids(row.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const size_t k = std::min<size_t>(5, ids.size());
  std::partial_sort(
      ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
      [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  std::vector<std::pair<int32_t, double>> top;
  for (size_t i = 0; i < k; ++i) top.emplace_back(ids[i], row[ids[i]]);
  return top;
}

// Reads DIR/goldens/<stem>_greedy.json. Stories260K's file keeps its F32-KV
// results in *_f32kv fields and its prompts with BOS in
// prompt_token_ids_with_bos; the others use the unsuffixed fields.
[[nodiscard]] absl::StatusOr<std::vector<RefCase>> LoadGoldens(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    std::vector<RefCase> cases;
    for (const nlohmann::json& c : j.at("cases")) {
      RefCase r;
      r.name = c.at("name").get<std::string>();
      const bool f32kv = c.contains("generated_token_ids_f32kv");
      const std::string sfx = f32kv ? "_f32kv" : "";
      r.prompt = c.at(c.contains("prompt_token_ids_with_bos") ? "prompt_token_ids_with_bos"
                                                              : "prompt_token_ids")
                     .get<std::vector<int32_t>>();
      r.ids = c.at("generated_token_ids" + sfx).get<std::vector<int32_t>>();
      r.strict = c.at("strict_prefix_len" + sfx).get<size_t>();
      for (const nlohmann::json& step : c.at("steps")) {
        std::vector<std::pair<int32_t, double>> top;
        for (const nlohmann::json& t : step.at("top5" + sfx)) {
          if (t.is_array()) {
            top.emplace_back(t.at(0).get<int32_t>(), t.at(1).get<double>());
          } else {
            top.emplace_back(t.at("id").get<int32_t>(), t.at("logit").get<double>());
          }
        }
        r.top5.push_back(std::move(top));
      }
      if (r.strict > r.ids.size() || r.top5.size() < r.strict || r.prompt.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": case ", r.name, ": strict prefix beyond its ids or steps"));
      }
      cases.push_back(std::move(r));
    }
    if (cases.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no cases"));
    return cases;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
}

// One slice of a step: tokens at [start_pos, start_pos + tokens.size()).
struct Slice {
  std::span<const int32_t> tokens;
  int32_t start_pos = 0;
  const std::vector<int32_t>* table = nullptr;
  bool want_logits = true;
};

// Runs forward steps and returns the logits of the slices that want them
// ([rows][vocab], batch order).
class Stepper {
 public:
  virtual ~Stepper() = default;
  [[nodiscard]] virtual absl::Status Step(std::span<const Slice> batch,
                                          std::vector<float>* logits) = 0;
};

// The CPU reference: LlamaModel's batch-invariant forward over an F32 KV.
class CpuStepper final : public Stepper {
 public:
  CpuStepper(const model::LlamaModel& model, int32_t num_blocks)
      : model_(model), kv_(model.kv_shape(kBlockSize), num_blocks) {}
  [[nodiscard]] absl::Status Step(std::span<const Slice> batch,
                                  std::vector<float>* logits) override {
    std::vector<model::SequenceBatch> seqs;
    for (const Slice& s : batch) {
      model::SequenceBatch b;
      b.tokens = s.tokens;
      b.start_pos = s.start_pos;
      b.block_table = s.table;
      b.want_logits = s.want_logits;
      seqs.push_back(b);
    }
    model_.Forward(seqs, kv_, logits);
    return absl::OkStatus();
  }

 private:
  const model::LlamaModel& model_;
  kv::CpuKvStorage kv_;
};

#ifdef TANDEM_HAVE_CUDA
// The CUDA backend through ModelBackend::Forward (greedy sampling options
// on the rows that want logits) and LastLogitsForTesting.
class CudaStepper final : public Stepper {
 public:
  CudaStepper(std::unique_ptr<backend::ModelBackend> owner, backend::cuda::CudaBackend* cuda,
              int32_t vocab)
      : owner_(std::move(owner)), cuda_(cuda), vocab_(vocab) {}
  [[nodiscard]] absl::Status Step(std::span<const Slice> batch,
                                  std::vector<float>* logits) override {
    std::vector<backend::ForwardEntry> entries;
    size_t rows = 0;
    for (const Slice& s : batch) {
      backend::ForwardEntry e;
      e.tokens = s.tokens;
      e.start_pos = s.start_pos;
      e.block_table = s.table;
      e.sampling = s.want_logits ? &greedy_ : nullptr;
      rows += s.want_logits ? 1 : 0;
      entries.push_back(e);
    }
    if (absl::Status st = cuda_->Forward(entries, nullptr, &views_); !st.ok()) return st;
    if (rows == 0) {
      logits->clear();
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<float>> got = cuda_->LastLogitsForTesting();
    if (!got.ok()) return got.status();
    if (got->size() != rows * static_cast<size_t>(vocab_)) {
      return absl::InternalError(absl::StrCat("LastLogitsForTesting: ", got->size(),
                                              " values, expected ", rows, " x ", vocab_));
    }
    *logits = std::move(*got);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<backend::ModelBackend> owner_;
  backend::cuda::CudaBackend* cuda_;
  int32_t vocab_;
  sampling::SamplingOptions greedy_;  // temperature 0: greedy
  std::vector<sampling::SamplingView> views_;
};
#endif

// Block tables of consecutive blocks from block 0: one per length.
std::vector<std::vector<int32_t>> Tables(const std::vector<int32_t>& token_counts) {
  std::vector<std::vector<int32_t>> tables;
  int32_t next = 0;
  for (int32_t n : token_counts) {
    std::vector<int32_t> t;
    for (int32_t b = 0; b < kv::BlocksForTokens(n, kBlockSize); ++b) t.push_back(next++);
    tables.push_back(std::move(t));
  }
  return tables;
}

// Feeds `prompt` then, for steps 1..n-1, `next(step, logits of the step
// before)`; returns the logits row of each of the n steps.
template <typename NextFn>
[[nodiscard]] absl::StatusOr<std::vector<std::vector<float>>> Decode(
    Stepper& stepper, const std::vector<int32_t>& prompt, size_t n, size_t vocab, NextFn next) {
  const std::vector<int32_t> table = Tables({static_cast<int32_t>(prompt.size() + n + 1)})[0];
  std::vector<std::vector<float>> rows;
  std::vector<float> logits;
  std::vector<int32_t> token(1);
  for (size_t s = 0; s < n; ++s) {
    Slice slice;
    if (s == 0) {
      slice.tokens = prompt;
    } else {
      token[0] = next(s, rows.back());
      slice.tokens = token;
      slice.start_pos = static_cast<int32_t>(prompt.size() + s - 1);
    }
    slice.table = &table;
    if (absl::Status st = stepper.Step(std::span<const Slice>(&slice, 1), &logits); !st.ok()) {
      return st;
    }
    if (logits.size() != vocab) return absl::InternalError("a step returned no logits row");
    rows.push_back(logits);
  }
  return rows;
}

// Greedy: each step feeds the argmax of the one before.
[[nodiscard]] absl::StatusOr<std::vector<std::vector<float>>> Greedy(
    Stepper& stepper, const std::vector<int32_t>& prompt, size_t n, size_t vocab) {
  return Decode(stepper, prompt, n, vocab,
                [](size_t, const std::vector<float>& prev) { return Argmax(prev); });
}

// Teacher-forced: step s feeds ids[s - 1].
[[nodiscard]] absl::StatusOr<std::vector<std::vector<float>>> Forced(
    Stepper& stepper, const std::vector<int32_t>& prompt, const std::vector<int32_t>& ids, size_t n,
    size_t vocab) {
  return Decode(stepper, prompt, n, vocab,
                [&](size_t s, const std::vector<float>&) { return ids[s - 1]; });
}

// One sequence of the batched / chunked mix.
struct MixSeq {
  std::vector<int32_t> prompt;
  int32_t chunk = 0;  // prefill chunk; 0 = the whole prompt at once
  std::vector<int32_t> table;
  int32_t fed = 0;
  std::vector<int32_t> generated;
  std::vector<std::vector<float>> logits;  // one row per generated token
};

MixSeq NewMixSeq(const std::vector<int32_t>& prompt, int32_t chunk) {
  MixSeq s;
  s.prompt = prompt;
  s.chunk = chunk;
  return s;
}

// Steps every sequence together until each has kMixDecodeSteps tokens.
[[nodiscard]] absl::Status RunMix(Stepper& stepper, std::vector<MixSeq>& seqs, size_t vocab) {
  std::vector<float> logits;
  while (true) {
    std::vector<Slice> batch;
    std::vector<MixSeq*> owners;
    for (MixSeq& s : seqs) {
      if (s.generated.size() >= static_cast<size_t>(kMixDecodeSteps)) continue;
      Slice slice;
      slice.table = &s.table;
      slice.start_pos = s.fed;
      const int32_t prompt_len = static_cast<int32_t>(s.prompt.size());
      if (s.fed < prompt_len) {
        const int32_t n = s.chunk > 0 ? std::min(s.chunk, prompt_len - s.fed) : prompt_len;
        slice.tokens = std::span<const int32_t>(s.prompt.data() + s.fed, static_cast<size_t>(n));
        slice.want_logits = s.fed + n == prompt_len;
        s.fed += n;
      } else {
        slice.tokens = std::span<const int32_t>(&s.generated.back(), 1);
        s.fed += 1;
      }
      batch.push_back(slice);
      owners.push_back(&s);
    }
    if (batch.empty()) return absl::OkStatus();
    if (absl::Status st = stepper.Step(batch, &logits); !st.ok()) return st;
    size_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!batch[i].want_logits) continue;
      if ((row + 1) * vocab > logits.size()) return absl::InternalError("too few logits rows");
      std::vector<float> r(logits.begin() + static_cast<std::ptrdiff_t>(row * vocab),
                           logits.begin() + static_cast<std::ptrdiff_t>((row + 1) * vocab));
      ++row;
      owners[i]->generated.push_back(Argmax(r));
      owners[i]->logits.push_back(std::move(r));
    }
  }
}

double MaxAbsDiff(const std::vector<std::vector<float>>& a,
                  const std::vector<std::vector<float>>& b, size_t steps) {
  double worst = 0;
  for (size_t s = 0; s < steps && s < a.size() && s < b.size(); ++s) {
    for (size_t i = 0; i < a[s].size() && i < b[s].size(); ++i) {
      const double d = std::fabs(static_cast<double>(a[s][i]) - b[s][i]);
      if (!(d <= worst)) worst = d;  // NaN sticks
    }
  }
  return worst;
}

// The largest |logit - reference| over the reference top-5 of the first
// `steps` steps, and whether each is within tolerance(id).
struct Top5Result {
  double worst = 0;
  bool within = true;
};
Top5Result Top5Diff(const std::vector<std::vector<float>>& logits, const RefCase& ref, size_t steps,
                    const std::function<double(int32_t)>& tolerance) {
  Top5Result r;
  for (size_t s = 0; s < steps && s < logits.size() && s < ref.top5.size(); ++s) {
    for (const auto& [id, logit] : ref.top5[s]) {
      if (id < 0 || static_cast<size_t>(id) >= logits[s].size()) return {NAN, false};
      const double d = std::fabs(logits[s][static_cast<size_t>(id)] - logit);
      if (!(d <= r.worst)) r.worst = d;  // NaN sticks
      if (!(d <= tolerance(id))) r.within = false;
    }
  }
  return r;
}

// kTop5Tolerance, plus, where the output matrix (output.weight, else the
// tied token_embd) is F16, the bound on llama.cpp's rounding of the
// activations to F16 in that product (its F16 dot products take F16
// operands; Tandem's backends keep them F32): u * sqrt(n_embd) *
// ||w (.) g||_2 for token id's row w and output_norm g, u = 2^-11
// (tests/engine/model/arch_golden_test.cc derives it). 0.01 to 0.05 more
// for the tiny BPE models' F16 tied outputs.
std::function<double(int32_t)> Top5Tolerance(const gguf::GgufFile& file) {
  const gguf::TensorInfo* out = file.FindTensor("output.weight");
  if (out == nullptr) out = file.FindTensor("token_embd.weight");
  const gguf::TensorInfo* norm = file.FindTensor("output_norm.weight");
  if (out == nullptr || norm == nullptr || out->type != gguf::TensorType::kF16 ||
      out->dims.size() != 2 || norm->dims.size() != 1 || norm->dims[0] != out->dims[0]) {
    return [](int32_t) { return kTop5Tolerance; };
  }
  return [out, norm](int32_t id) {
    const size_t n = static_cast<size_t>(out->dims[0]);
    if (id < 0 || static_cast<uint64_t>(id) >= out->dims[1]) return kTop5Tolerance;
    std::vector<float> w(n), g(n);
    const uint64_t row_bytes = out->n_bytes / out->dims[1];
    model::internal::ConvertToF32(out->type, out->data + static_cast<uint64_t>(id) * row_bytes, n,
                                  w.data());
    model::internal::ConvertToF32(norm->type, norm->data, n, g.data());
    double sq = 0;
    for (size_t i = 0; i < n; ++i) sq += double{w[i]} * g[i] * w[i] * g[i];
    return kTop5Tolerance + 0x1p-11 * std::sqrt(static_cast<double>(n) * sq);
  };
}

// One row of the report.
struct Row {
  std::string model, check, mode, ids, top5, vs_cpu;
  bool pass = false;
};

Row NewRow(const std::string& model, const std::string& check, const std::string& mode) {
  Row r;
  r.model = model;
  r.check = check;
  r.mode = mode;
  return r;
}

std::string Num(double v) { return absl::StrFormat("%.2e", v); }

// References for a model without goldens: three fixed prompts, greedily
// decoded by the CPU.
[[nodiscard]] absl::StatusOr<std::vector<RefCase>> CpuReferences(Stepper& cpu, int32_t vocab) {
  std::vector<RefCase> cases;
  const int32_t lengths[] = {5, 19, 40};
  for (int c = 0; c < 3; ++c) {
    RefCase r;
    r.name = absl::StrCat("prompt", lengths[c]);
    for (int32_t i = 0; i < lengths[c]; ++i) {
      r.prompt.push_back(static_cast<int32_t>((1 + 7919ll * (i + 31 * c)) % vocab));
    }
    absl::StatusOr<std::vector<std::vector<float>>> rows =
        Greedy(cpu, r.prompt, kCpuReferenceSteps, static_cast<size_t>(vocab));
    if (!rows.ok()) return rows.status();
    r.strict = rows->size();
    for (size_t s = 0; s < rows->size(); ++s) {
      r.ids.push_back(Argmax((*rows)[s]));
      r.top5.push_back(Top5((*rows)[s]));
      if (r.strict == rows->size() && Margin(r.top5.back()) < kStrictMargin) r.strict = s;
    }
    cases.push_back(std::move(r));
  }
  return cases;
}

std::string DefaultSharedDir() {
  const char* env = std::getenv("TANDEM_SHARED_DIR");
  return env != nullptr && *env != '\0' ? env : "../shared";
}

#ifdef TANDEM_HAVE_CUDA
// A CUDA stepper for `model` on `device`: F32 accuracy mode or BF16.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Stepper>> MakeCudaStepper(
    const model::LlamaModel& model, const backend::DeviceSpec& device, bool f32, int32_t num_blocks,
    const backend::DeviceQuery& query) {
  backend::BackendOptions o;
  o.device = device;
  o.kv_cache_dtype = f32 ? kv::KvDtype::kF32 : kv::KvDtype::kBF16;
  o.keep_f32_weights = f32;
  o.batch_invariant = true;
  o.block_size = kBlockSize;
  o.num_kv_blocks = num_blocks;
  o.num_kv_blocks_set = true;
  absl::StatusOr<std::unique_ptr<backend::ModelBackend>> b =
      backend::CreateBackend(model, o, query);
  if (!b.ok()) return b.status();
  auto* cuda = dynamic_cast<backend::cuda::CudaBackend*>(b->get());
  if (cuda == nullptr) return absl::InternalError("CreateBackend did not return a CudaBackend");
  return std::unique_ptr<Stepper>(new CudaStepper(std::move(*b), cuda, model.config().vocab_size));
}

#endif  // TANDEM_HAVE_CUDA

// Makes the stepper under test for `model`: F32 accuracy mode (f32) or
// BF16, with room for num_blocks KV blocks.
using StepperFactory = std::function<absl::StatusOr<std::unique_ptr<Stepper>>(
    const model::LlamaModel& model, bool f32, int32_t num_blocks)>;

// Every check of one model; appends rows. Errors: the model, its goldens
// or a backend could not be loaded or started, or a forward failed.
[[nodiscard]] absl::Status CheckModel(const std::string& path, const std::string& shared_dir,
                                      const StepperFactory& make_stepper, std::vector<Row>* rows) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(path);
  if (!file.ok()) return file.status();
  const int32_t threads =
      static_cast<int32_t>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> model =
      model::LlamaModel::Load(**file, threads);
  if (!model.ok()) return model.status();
  const int32_t vocab = (*model)->config().vocab_size;
  const size_t v = static_cast<size_t>(vocab);
  const std::string stem = std::filesystem::path(path).stem().string();
  const std::string golden = absl::StrCat(shared_dir, "/goldens/", stem, "_greedy.json");

  std::vector<RefCase> refs;
  const bool have_golden = std::filesystem::exists(golden);
  if (have_golden) {
    absl::StatusOr<std::vector<RefCase>> g = LoadGoldens(golden);
    if (!g.ok()) return g.status();
    refs = std::move(*g);
  } else {
    CpuStepper probe(**model, 8);  // 40 + 16 tokens: 4 blocks
    absl::StatusOr<std::vector<RefCase>> c = CpuReferences(probe, vocab);
    if (!c.ok()) return c.status();
    refs = std::move(*c);
  }
  // KV blocks: the largest case, or the mix (the first three prompts and
  // the longest one), whichever is more.
  constexpr int32_t kMaxBlocks = 4096;
  int32_t needed = 0, mix_needed = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    const int32_t n = static_cast<int32_t>(refs[i].prompt.size() +
                                           std::max(refs[i].ids.size(), refs[i].top5.size()) +
                                           kMixDecodeSteps + 1);
    needed = std::max(needed, kv::BlocksForTokens(n, kBlockSize));
    if (i < 3) mix_needed += kv::BlocksForTokens(n, kBlockSize);
  }
  mix_needed += needed;  // the chunked (longest) prompt
  const int32_t num_blocks = std::min(kMaxBlocks, std::max(needed, mix_needed));
  // llama.cpp's F16 rounding is in the goldens only, not in CPU references.
  const std::function<double(int32_t)> tolerance =
      have_golden ? Top5Tolerance(**file) : [](int32_t) { return kTop5Tolerance; };
  const std::string& model_name = stem;

  CpuStepper cpu(**model, num_blocks);
  for (const bool f32 : {true, false}) {
    const std::string mode = f32 ? "f32" : "bf16";
    absl::StatusOr<std::unique_ptr<Stepper>> gpu = make_stepper(**model, f32, num_blocks);
    if (!gpu.ok()) {
      return absl::Status(gpu.status().code(),
                          absl::StrCat(stem, " (", mode, "): ", gpu.status().message()));
    }
    for (const RefCase& ref : refs) {
      Row row = NewRow(model_name, ref.name, mode);
      if (f32) {
        // Greedy over the strict prefix on both backends.
        absl::StatusOr<std::vector<std::vector<float>>> g =
            Greedy(**gpu, ref.prompt, ref.strict, v);
        if (!g.ok()) return g.status();
        absl::StatusOr<std::vector<std::vector<float>>> c = Greedy(cpu, ref.prompt, ref.strict, v);
        if (!c.ok()) return c.status();
        size_t same = 0;
        while (same < g->size() && Argmax((*g)[same]) == ref.ids[same]) ++same;
        const Top5Result top5 = Top5Diff(*g, ref, ref.strict, tolerance);
        row.ids = absl::StrCat(same, "/", ref.strict, same == ref.strict ? " yes" : " no");
        row.top5 = Num(top5.worst);
        row.vs_cpu = Num(MaxAbsDiff(*g, *c, ref.strict));
        row.pass = same == ref.strict && top5.within;
      } else {
        // Teacher-forced on the reference ids.
        const size_t n = std::min(ref.ids.size(), ref.top5.size());
        absl::StatusOr<std::vector<std::vector<float>>> g =
            Forced(**gpu, ref.prompt, ref.ids, n, v);
        if (!g.ok()) return g.status();
        absl::StatusOr<std::vector<std::vector<float>>> c = Forced(cpu, ref.prompt, ref.ids, n, v);
        if (!c.ok()) return c.status();
        size_t checked = 0, agree = 0;
        for (size_t s = 0; s < n; ++s) {
          if (Margin(ref.top5[s]) <= kBf16Margin) continue;
          ++checked;
          agree += Argmax((*g)[s]) == ref.ids[s] ? 1 : 0;
        }
        row.ids = absl::StrCat(agree, "/", checked, " forced");
        row.top5 = Num(Top5Diff(*g, ref, n, tolerance).worst);
        row.vs_cpu = Num(MaxAbsDiff(*g, *c, n));
        row.pass = agree == checked;
      }
      rows->push_back(std::move(row));
    }
    // The batched / chunked mix against each sequence alone.
    size_t longest = 0;
    for (size_t i = 1; i < refs.size(); ++i) {
      if (refs[i].prompt.size() > refs[longest].prompt.size()) longest = i;
    }
    std::vector<MixSeq> mix;
    std::vector<int32_t> lengths;
    mix.push_back(NewMixSeq(refs[longest].prompt, kMixChunk));
    for (size_t i = 0; i < refs.size() && i < 3; ++i) mix.push_back(NewMixSeq(refs[i].prompt, 0));
    for (const MixSeq& s : mix) {
      lengths.push_back(static_cast<int32_t>(s.prompt.size()) + kMixDecodeSteps + 1);
    }
    std::vector<std::vector<int32_t>> tables = Tables(lengths);
    if (tables.back().empty() || tables.back().back() >= num_blocks) {
      return absl::InternalError(
          absl::StrCat(stem, ": the mix needs more than ", num_blocks, " KV blocks"));
    }
    for (size_t i = 0; i < mix.size(); ++i) mix[i].table = tables[i];
    size_t rows_same = 0, rows_total = 0;
    std::vector<MixSeq> together = mix;
    if (absl::Status st = RunMix(**gpu, together, v); !st.ok()) return st;
    for (size_t i = 0; i < mix.size(); ++i) {
      std::vector<MixSeq> alone(1);
      alone[0].prompt = mix[i].prompt;
      alone[0].table = tables[0];  // alone: any blocks will do
      if (absl::Status st = RunMix(**gpu, alone, v); !st.ok()) return st;
      const MixSeq& t = together[i];
      for (size_t k = 0; k < alone[0].logits.size(); ++k) {
        ++rows_total;
        if (k < t.logits.size() && t.logits[k].size() == alone[0].logits[k].size() &&
            std::memcmp(t.logits[k].data(), alone[0].logits[k].data(),
                        t.logits[k].size() * sizeof(float)) == 0) {
          ++rows_same;
        }
      }
    }
    Row row =
        NewRow(model_name, absl::StrCat("mix(", mix.size(), " seqs, chunk ", kMixChunk, ")"), mode);
    row.ids = absl::StrCat(rows_same, "/", rows_total, " rows bit-identical");
    row.top5 = "-";
    row.vs_cpu = "-";
    row.pass = rows_same == rows_total && rows_total > 0;
    rows->push_back(std::move(row));
  }
  return absl::OkStatus();
}

// Runs CheckModel on each model and prints the table; returns the exit
// status (0 every check passed, else 1).
int CheckAndReport(const std::vector<std::string>& models, const std::string& shared_dir,
                   const StepperFactory& make_stepper) {
  std::vector<Row> rows;
  int status = 0;
  for (const std::string& m : models) {
    if (absl::Status s = CheckModel(m, shared_dir, make_stepper, &rows); !s.ok()) {
      std::cerr << "tandem selftest: " << m << ": " << s << "\n";
      status = 1;
    }
  }
  std::printf("%-18s %-26s %-5s %-28s %-10s %-10s %s\n", "model", "case", "mode", "ids", "top5|d|",
              "cuda-cpu|d|", "result");
  size_t passed = 0;
  for (const Row& r : rows) {
    std::printf("%-18s %-26s %-5s %-28s %-10s %-10s %s\n", r.model.c_str(), r.check.c_str(),
                r.mode.c_str(), r.ids.c_str(), r.top5.c_str(), r.vs_cpu.c_str(),
                r.pass ? "ok" : "FAIL");
    passed += r.pass ? 1 : 0;
  }
  std::printf(
      "selftest: %zu of %zu checks passed (f32: ids = reference strict prefix and "
      "top-5 within %g; bf16: forced argmax where margin > %g; mix: bit-identical)\n",
      passed, rows.size(), kTop5Tolerance, kBf16Margin);
  std::fflush(stdout);
  if (passed != rows.size() || rows.empty()) status = 1;
  return status;
}

std::vector<std::string> DefaultModels(const std::string& shared_dir) {
  std::vector<std::string> models;
  for (const char* m : {"stories260K", "qwen2-tiny-synth", "llama3-tiny-synth"}) {
    models.push_back(absl::StrCat(shared_dir, "/models/", m, ".gguf"));
  }
  return models;
}

}  // namespace

absl::StatusOr<SelftestOptions> ParseSelftestArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed =
      ParseArgs(args, {{"device"}, {"model", true, true}, {"shared"}});
  if (!parsed.ok()) return parsed.status();
  if (!parsed->positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed->positional()[0], "'"));
  }
  SelftestOptions o;
  const std::string device = parsed->GetString("device", "cuda:0");
  absl::StatusOr<backend::DeviceSpec> spec = backend::ParseDevice(device, "--device");
  if (!spec.ok()) return spec.status();
  if (!spec->is_cuda()) {
    return FlagError("device", absl::StrCat("expected cuda:N, got '", device,
                                            "' (the CPU backend is the reference)"));
  }
  o.device = *spec;
  o.models = parsed->GetAll("model");
  for (const std::string& m : o.models) {
    if (m.empty()) return FlagError("model", "empty path");
  }
  o.shared_dir = parsed->GetString("shared", DefaultSharedDir());
  if (o.shared_dir.empty()) return FlagError("shared", "empty path");
  // Paths given on the command line are checked here, before the GPU is
  // looked for, so that a typo shows on any machine.
  for (const std::string& m : o.models) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(m, ec)) {
      return FlagError("model", absl::StrCat("'", m, "' is not a readable file"));
    }
  }
  if (parsed->Has("shared")) {
    std::error_code ec;
    if (!std::filesystem::is_directory(o.shared_dir, ec)) {
      return FlagError("shared", absl::StrCat("'", o.shared_dir, "' is not a directory"));
    }
  }
  return o;
}

int RunSelftest(const std::vector<std::string>& args) {
  return RunSelftest(args, backend::SystemDeviceQuery());
}

int RunSelftest(const std::vector<std::string>& args, const backend::DeviceQuery& query) {
  absl::StatusOr<SelftestOptions> o = ParseSelftestArgs(args);
  if (!o.ok()) {
    std::cerr << "tandem selftest: " << o.status().message() << "\n" << kUsage;
    return 2;
  }
  std::string why;
  if (!backend::HasCudaBackend()) {
    why = "this build has no CUDA backend (TANDEM_ENABLE_CUDA is OFF)";
  } else if (query.DeviceCount(&why) <= 0) {
    if (why.empty()) why = "no CUDA device";
  } else {
    why.clear();
  }
  if (!why.empty()) {
    std::printf("selftest: no CUDA GPU (%s); nothing to check\n", why.c_str());
    std::fflush(stdout);
    return 77;
  }
  if (absl::Status s = backend::CheckDeviceAvailable(query, o->device, "--device"); !s.ok()) {
    std::cerr << "tandem selftest: " << s.message() << "\n";
    return 1;
  }
#ifndef TANDEM_HAVE_CUDA
  // HasCudaBackend() is false in such a build: handled above.
  return 77;
#else
  const std::vector<std::string> models =
      o->models.empty() ? DefaultModels(o->shared_dir) : o->models;
  absl::StatusOr<backend::GpuInfo> info = query.Info(o->device.index);
  std::printf("selftest: %s (%s, sm_%d); reference: the CPU backend and the goldens in %s\n",
              o->device.ToString().c_str(), info.ok() ? info->name.c_str() : "?",
              info.ok() ? info->compute_capability : 0, o->shared_dir.c_str());
  const backend::DeviceSpec device = o->device;
  return CheckAndReport(models, o->shared_dir,
                        [&](const model::LlamaModel& m, bool f32, int32_t num_blocks) {
                          return MakeCudaStepper(m, device, f32, num_blocks, query);
                        });
#endif
}

int RunSelftestOnCpuForTesting(const std::vector<std::string>& models,
                               const std::string& shared_dir) {
  return CheckAndReport(models.empty() ? DefaultModels(shared_dir) : models, shared_dir,
                        [](const model::LlamaModel& m, bool,
                           int32_t num_blocks) -> absl::StatusOr<std::unique_ptr<Stepper>> {
                          return std::unique_ptr<Stepper>(new CpuStepper(m, num_blocks));
                        });
}

}  // namespace tandem::cli
