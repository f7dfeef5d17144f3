#include "engine/scheduler/step_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/scheduler/scheduler.h"

namespace tandem::scheduler {

void StepShape::AddChunk(int32_t start, int32_t count) {
  if (count <= 0) return;
  if (count == 1) {
    ++decode_seqs;
    decode_context += start + 1;
    return;
  }
  prefill_tokens += count;
  prefill_pairs += ChunkPairs(start, count);
}

StepShape ShapeOf(const StepPlan& plan) {
  StepShape shape;
  for (const ScheduledChunk& chunk : plan.chunks) shape.AddChunk(chunk.start, chunk.count);
  return shape;
}

StepModel::Vector StepModel::Features(const StepShape& shape) {
  return {1.0, static_cast<double>(shape.prefill_tokens), shape.prefill_pairs / 1000.0,
          static_cast<double>(shape.decode_seqs),
          static_cast<double>(shape.decode_context) / 1000.0};
}

double StepModel::PredictMs(const StepShape& shape) const {
  const Vector x = Features(shape);
  return std::inner_product(x.begin(), x.end(), theta_.begin(), 0.0);
}

void StepModel::Observe(const StepShape& shape, double ms, bool anchor) {
  if (!std::isfinite(ms) || ms < 0) return;
  if (!anchor && samples_ > 0) {
    const double error = std::abs(PredictMs(shape) - ms);
    mean_abs_error_ms_ = samples_ == 1
                             ? error
                             : (1 - kErrorSmoothing) * mean_abs_error_ms_ + kErrorSmoothing * error;
  }
  const Vector x = Features(shape);
  Matrix& a = anchor ? anchor_xtx_ : xtx_;
  Vector& b = anchor ? anchor_xty_ : xty_;
  if (!anchor) {
    for (Vector& row : xtx_) {
      for (double& v : row) v *= kForgetting;
    }
    for (double& v : xty_) v *= kForgetting;
  }
  for (int i = 0; i < kFeatures; ++i) {
    for (int j = 0; j < kFeatures; ++j) a[i][j] += x[i] * x[j];
    b[i] += x[i] * ms;
  }
  ++samples_;
  Refit();
}

namespace {

// Solves a x = b restricted to the features in `free` (the others are 0)
// by Gaussian elimination with partial pivoting; a feature whose pivot
// vanishes (never excited) gets 0.
std::array<double, StepModel::kFeatures> SolveFree(
    const std::array<std::array<double, StepModel::kFeatures>, StepModel::kFeatures>& a,
    const std::array<double, StepModel::kFeatures>& b,
    const std::array<bool, StepModel::kFeatures>& free) {
  constexpr int n = StepModel::kFeatures;
  int idx[n];
  int m = 0;
  for (int i = 0; i < n; ++i) {
    if (free[i]) idx[m++] = i;
  }
  double mat[n][n + 1];
  double scale = 0;
  for (int r = 0; r < m; ++r) scale = std::max(scale, a[idx[r]][idx[r]]);
  // A small ridge keeps the system solvable when features are collinear
  // or unseen; relative to the largest diagonal so units do not matter.
  const double ridge = 1e-9 * scale + 1e-12;
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < m; ++c) mat[r][c] = a[idx[r]][idx[c]] + (r == c ? ridge : 0.0);
    mat[r][m] = b[idx[r]];
  }
  for (int col = 0; col < m; ++col) {
    int pivot = col;
    for (int r = col + 1; r < m; ++r) {
      if (std::abs(mat[r][col]) > std::abs(mat[pivot][col])) pivot = r;
    }
    for (int c = 0; c <= m; ++c) std::swap(mat[col][c], mat[pivot][c]);
    if (std::abs(mat[col][col]) < 1e-300) continue;
    for (int r = 0; r < m; ++r) {
      if (r == col) continue;
      const double f = mat[r][col] / mat[col][col];
      for (int c = col; c <= m; ++c) mat[r][c] -= f * mat[col][c];
    }
  }
  std::array<double, n> x{};
  for (int r = 0; r < m; ++r) {
    x[idx[r]] = std::abs(mat[r][r]) < 1e-300 ? 0.0 : mat[r][m] / mat[r][r];
  }
  return x;
}

}  // namespace

void StepModel::Refit() {
  Matrix a;
  Vector b;
  for (int i = 0; i < kFeatures; ++i) {
    for (int j = 0; j < kFeatures; ++j) a[i][j] = xtx_[i][j] + anchor_xtx_[i][j];
    b[i] = xty_[i] + anchor_xty_[i];
  }
  // Active set (Lawson-Hanson, simplified): drop the most negative
  // coefficient and refit until all are >= 0.
  std::array<bool, kFeatures> free;
  free.fill(true);
  Vector theta = SolveFree(a, b, free);
  for (int round = 0; round < kFeatures; ++round) {
    int worst = -1;
    for (int i = 0; i < kFeatures; ++i) {
      if (free[i] && theta[i] < 0 && (worst < 0 || theta[i] < theta[worst])) worst = i;
    }
    if (worst < 0) break;
    free[worst] = false;
    theta = SolveFree(a, b, free);
  }
  for (double& t : theta) t = std::max(t, 0.0);
  theta_ = theta;
  coefficients_ = StepCoefficients{theta[0], theta[1], theta[2], theta[3], theta[4]};
}

void StepModel::ObserveTransfer(const std::string& peer, uint64_t bytes, double seconds) {
  if (bytes == 0 || !(seconds > 0)) return;
  const double rate = static_cast<double>(bytes) / seconds;
  auto [it, inserted] = link_bytes_per_s_.emplace(peer, rate);
  if (!inserted) it->second = (1 - kLinkSmoothing) * it->second + kLinkSmoothing * rate;
}

std::optional<double> StepModel::LinkBytesPerSecond(const std::string& peer) const {
  if (auto it = link_bytes_per_s_.find(peer); it != link_bytes_per_s_.end()) return it->second;
  if (link_bytes_per_s_.empty()) return std::nullopt;
  double sum = 0;
  for (const auto& [name, rate] : link_bytes_per_s_) sum += rate;
  return sum / static_cast<double>(link_bytes_per_s_.size());
}

StepModelSnapshot StepModel::Snapshot(int32_t reference_chunk_tokens) const {
  StepModelSnapshot s;
  s.samples = samples_;
  s.coefficients = coefficients_;
  s.mean_abs_error_ms = mean_abs_error_ms_;
  s.kv_link_bytes_per_s = link_bytes_per_s_;
  StepShape prefill;
  prefill.AddChunk(0, std::max(reference_chunk_tokens, 2));
  const double prefill_ms = PredictMs(prefill);
  if (prefill_ms > 0) s.prefill_tokens_per_s = prefill.prefill_tokens * 1000.0 / prefill_ms;
  StepShape decode;
  decode.AddChunk(511, 1);
  s.decode_step_ms = PredictMs(decode);
  return s;
}

}  // namespace tandem::scheduler
