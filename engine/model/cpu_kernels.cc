#include "engine/model/cpu_kernels.h"

#include <cmath>

namespace tandem::model::internal {

void MatMulColumns(const float* x, const float* w, size_t rows, size_t in, size_t out,
                   size_t o_begin, size_t o_end, float* y) {
  // Weight row outer: each row of w is read once per call, whatever `rows`.
  for (size_t o = o_begin; o < o_end; ++o) {
    const float* wo = w + o * in;
    for (size_t r = 0; r < rows; ++r) y[r * out + o] = Dot(wo, x + r * in, in);
  }
}

void MatMul(const float* x, const float* w, size_t rows, size_t in, size_t out, float* y,
            ThreadPool* pool, size_t min_work) {
  MaybeParallelFor(pool, out, rows * in * out, min_work, [&](size_t begin, size_t end) {
    MatMulColumns(x, w, rows, in, out, begin, end, y);
  });
}

void RmsNorm(const float* x, const float* weight, size_t rows, size_t n, float eps,
             float* y) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (size_t i = 0; i < n; ++i) yr[i] = (xr[i] * scale) * weight[i];
  }
}

void RopeNorm(float* x, size_t n_heads, size_t head_dim, size_t rope_dim, int pos,
              float freq_base) {
  for (size_t i = 0; 2 * i + 1 < rope_dim; ++i) {
    const double theta =
        pos * std::pow(static_cast<double>(freq_base),
                       -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
    const float c = static_cast<float>(std::cos(theta));
    const float s = static_cast<float>(std::sin(theta));
    for (size_t h = 0; h < n_heads; ++h) {
      float* p = x + h * head_dim + 2 * i;
      const float x0 = p[0], x1 = p[1];
      p[0] = x0 * c - x1 * s;
      p[1] = x0 * s + x1 * c;
    }
  }
}

void SwiGlu(float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}

void AddInPlace(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace tandem::model::internal
