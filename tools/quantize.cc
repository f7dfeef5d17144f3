// Quantizers after ggml-quants.c's quantize_row_*_ref (see quantize.h).
// Expressions keep ggml's operand order and float types: a reordered sum
// or a double intermediate would change bytes.
#include "tools/quantize.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>
#include <system_error>

namespace tandem::cli {
namespace {

constexpr int kSuperBlock = 256;  // QK_K

// ggml's nearest_int: round to nearest, ties to even (|f| <= 2^22).
int NearestInt(float f) {
  const float v = f + 12582912.0f;  // 1.5 * 2^23: the FPU rounds f to an integer
  return static_cast<int>(std::bit_cast<uint32_t>(v) & 0x007fffffu) - 0x00400000;
}

void StoreHalf(float x, uint8_t* out) {
  const uint16_t h = FloatToHalf(x);
  std::memcpy(out, &h, 2);
}

float LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return gguf::HalfToFloat(h);
}

// ggml's make_qkx2_quants with use_mad = false: levels L[i] in [0, nmax]
// and (returned) scale, *the_min = -min, of the weighted least-squares
// affine fit x ~ scale * L + min, min <= 0 (see QuantizeRowQ4_K); n <= 32.
float MakeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                     float* the_min, float rmin, float rdelta, int nstep) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    *the_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  uint8_t aux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax);
      aux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float lf = static_cast<float>(l);
      sum_l += w * lf;
      sum_l2 += w * lf * lf;
      sum_xl += w * lf * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * aux[i] + this_min - x[i];
        cur_error += weights[i] * (diff * diff);
      }
      if (cur_error < best_error) {
        std::copy(aux, aux + n, L);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// ggml's make_qx_quants with rmse_type 1 and no importance weights: signed
// levels L[i] = l + nmax, l in [-nmax, nmax - 1], and the returned scale
// (see QuantizeRowQ6_K).
float MakeQxQuants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {  // GROUP_MAX_EPS
    std::fill(L, L + n, int8_t{0});
    return 0.0f;
  }
  // Levels and least-squares sums (weights x^2) for one inverse scale.
  auto fit = [&](float iscale, float* sumlx, float* suml2, bool store) {
    *sumlx = 0;
    *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      if (store) L[i] = static_cast<int8_t>(l + nmax);
      const float w = x[i] * x[i];
      const float lf = static_cast<float>(l);
      *sumlx += w * x[i] * lf;
      *suml2 += w * lf * lf;
    }
  };
  float sumlx, suml2;
  fit(static_cast<float>(-nmax) / max, &sumlx, &suml2, true);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    fit(iscale, &sumlx, &suml2, false);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      fit(iscale, &sumlx, &suml2, true);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// The shared part of Q4_K and Q5_K for one super-block: writes d, dmin and
// scales[12] (the first 16 bytes of both layouts) at `header` and the
// levels L[256] in [0, nmax].
void QuantizeSuperBlockK(const float* x, int nmax, float rmin, int nstep, uint8_t* header,
                         uint8_t* L) {
  constexpr int kSub = 32;
  float scales[kSuperBlock / kSub];
  float mins[kSuperBlock / kSub];
  float max_scale = 0;  // minus the min, scales are positive
  float max_min = 0;
  for (int j = 0; j < kSuperBlock / kSub; ++j) {
    const float* xs = x + kSub * j;
    float sum_x2 = 0;
    for (int l = 0; l < kSub; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / kSub);
    float weights[kSub];
    for (int l = 0; l < kSub; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = MakeQkx2Quants(kSub, nmax, xs, weights, L + kSub * j, &mins[j], rmin, 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  uint8_t* sc = header + 4;
  std::fill(sc, sc + 12, uint8_t{0});
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    // ggml stores nearest_int into a uint8_t, then caps it at 63.
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_min * mins[j])));
    if (j < 4) {
      sc[j] = ls[j];
      sc[j + 4] = lm[j];
    } else {  // low 4 bits in sc[j + 4], top 2 bits over sc[j - 4] / sc[j]
      sc[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      sc[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      sc[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
  StoreHalf(max_scale / 63.0f, header);
  StoreHalf(max_min / 63.0f, header + 2);
  const float d_all = LoadHalf(header);
  const float dmin_all = LoadHalf(header + 2);
  for (int j = 0; j < 8; ++j) {
    const float d = d_all * ls[j];
    if (d == 0) continue;
    const float dm = dmin_all * lm[j];
    for (int i = 0; i < kSub; ++i) {
      L[kSub * j + i] =
          static_cast<uint8_t>(std::clamp(NearestInt((x[kSub * j + i] + dm) / d), 0, nmax));
    }
  }
}

// Q4_K (bits 4) or Q5_K (bits 5): QuantizeSuperBlockK, then the levels'
// low nibbles in qs and (Q5_K) their fifth bits in qh.
void QuantizeRowKAffine(int bits, const float* x, uint64_t n, uint8_t* out) {
  const bool q5 = bits == 5;
  const size_t block_bytes = q5 ? 176 : 144;
  for (uint64_t b = 0; b < n / kSuperBlock; ++b, x += kSuperBlock, out += block_bytes) {
    uint8_t L[kSuperBlock];
    if (q5) {
      QuantizeSuperBlockK(x, 31, -0.5f, 15, out, L);
    } else {
      QuantizeSuperBlockK(x, 15, -1.0f, 20, out, L);
    }
    uint8_t* qh = out + 16;  // Q5_K only
    uint8_t* qs = out + (q5 ? 48 : 16);
    if (q5) std::fill(qh, qh + 32, uint8_t{0});
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = L[64 * c + l];
        const uint8_t hi = L[64 * c + 32 + l];
        qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        if (q5) qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

}  // namespace

void QuantizeRowQ8_0(const float* x, uint64_t n, uint8_t* out) {
  for (uint64_t b = 0; b < n / 32; ++b, x += 32, out += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(d, out);
    for (int j = 0; j < 32; ++j) {
      out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
    }
  }
}

void QuantizeRowQ4_0(const float* x, uint64_t n, uint8_t* out) {
  for (uint64_t b = 0; b < n / 32; ++b, x += 32, out += 18) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(d, out);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      out[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeRowQ4_K(const float* x, uint64_t n, uint8_t* out) { QuantizeRowKAffine(4, x, n, out); }

void QuantizeRowQ5_K(const float* x, uint64_t n, uint8_t* out) { QuantizeRowKAffine(5, x, n, out); }

void QuantizeRowQ6_K(const float* x, uint64_t n, uint8_t* out) {
  for (uint64_t b = 0; b < n / kSuperBlock; ++b, x += kSuperBlock, out += 210) {
    uint8_t* ql = out;
    uint8_t* qh = out + 128;
    int8_t* block_scales = reinterpret_cast<int8_t*>(out + 192);
    int8_t L[kSuperBlock];
    float scales[16];
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = MakeQxQuants(16, 32, x + 16 * ib, L + 16 * ib);
      if (std::fabs(scales[ib]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < 1e-15f) {  // GROUP_MAX_EPS: an all-zero block
      std::fill(out, out + 210, uint8_t{0});
      continue;
    }
    const float iscale = -128.0f / max_scale;
    StoreHalf(1 / iscale, out + 208);
    for (int ib = 0; ib < 16; ++ib) {
      block_scales[ib] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[ib])));
    }
    const float d_all = LoadHalf(out + 208);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * block_scales[j];
      if (d == 0) continue;
      for (int i = 0; i < 16; ++i) {
        L[16 * j + i] =
            static_cast<int8_t>(std::clamp(NearestInt(x[16 * j + i] / d), -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const int8_t* q = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[64 * h + l] = static_cast<uint8_t>((q[l] & 0xF) | ((q[l + 64] & 0xF) << 4));
        ql[64 * h + l + 32] = static_cast<uint8_t>((q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4));
        qh[32 * h + l] = static_cast<uint8_t>((q[l] >> 4) | ((q[l + 32] >> 4) << 2) |
                                              ((q[l + 64] >> 4) << 4) | ((q[l + 96] >> 4) << 6));
      }
    }
  }
}

uint16_t FloatToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);  // NaN
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

void ConvertFromF32(gguf::TensorType type, const float* x, uint64_t n, uint8_t* out) {
  switch (type) {
    case gguf::TensorType::kBF16:
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t b = FloatToBf16(x[i]);
        std::memcpy(out + 2 * i, &b, 2);
      }
      return;
    case gguf::TensorType::kF16:
      for (uint64_t i = 0; i < n; ++i) StoreHalf(x[i], out + 2 * i);
      return;
    case gguf::TensorType::kQ8_0:
      return QuantizeRowQ8_0(x, n, out);
    case gguf::TensorType::kQ4_0:
      return QuantizeRowQ4_0(x, n, out);
    case gguf::TensorType::kQ4_K:
      return QuantizeRowQ4_K(x, n, out);
    case gguf::TensorType::kQ5_K:
      return QuantizeRowQ5_K(x, n, out);
    case gguf::TensorType::kQ6_K:
      return QuantizeRowQ6_K(x, n, out);
    default:
      std::memcpy(out, x, n * sizeof(float));
  }
}

bool UseMoreBits(int32_t layer, int32_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

gguf::TensorType MixTensorType(gguf::TensorType base, QuantMix mix, std::string_view name,
                               int32_t n_layer, bool has_output) {
  if (mix == QuantMix::kPure) return base;
  if (name == "output.weight" || (!has_output && name == "token_embd.weight")) {
    return gguf::TensorType::kQ6_K;
  }
  // "blk.<i>.attn_v.weight" / "blk.<i>.ffn_down.weight"
  constexpr std::string_view kPrefix = "blk.";
  if (!name.starts_with(kPrefix)) return base;
  name.remove_prefix(kPrefix.size());
  int32_t layer = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), layer);
  const size_t dot = static_cast<size_t>(end - name.data());
  if (ec != std::errc() || dot == 0 || dot >= name.size() || name[dot] != '.') return base;
  const std::string_view what = name.substr(dot + 1);
  if ((what == "attn_v.weight" || what == "ffn_down.weight") && UseMoreBits(layer, n_layer)) {
    return gguf::TensorType::kQ6_K;
  }
  return base;
}

uint32_t LlamaFileType(gguf::TensorType base, QuantMix mix) {
  if (mix == QuantMix::kKQuantM) {
    if (base == gguf::TensorType::kQ4_K) return 15;  // MOSTLY_Q4_K_M
    if (base == gguf::TensorType::kQ5_K) return 17;  // MOSTLY_Q5_K_M
    return 0;
  }
  switch (base) {
    case gguf::TensorType::kF16:
      return 1;  // MOSTLY_F16
    case gguf::TensorType::kBF16:
      return 32;  // MOSTLY_BF16
    case gguf::TensorType::kQ4_0:
      return 2;  // MOSTLY_Q4_0
    case gguf::TensorType::kQ8_0:
      return 7;  // MOSTLY_Q8_0
    case gguf::TensorType::kQ4_K:
      return 14;  // MOSTLY_Q4_K_S
    case gguf::TensorType::kQ5_K:
      return 16;  // MOSTLY_Q5_K_S
    case gguf::TensorType::kQ6_K:
      return 18;  // MOSTLY_Q6_K
    default:
      return 0;  // ALL_F32
  }
}

}  // namespace tandem::cli
