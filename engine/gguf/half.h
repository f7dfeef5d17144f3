// IEEE 754 binary16 ("half"), GGUF's F16 type and the scale type of ggml's
// quantized blocks (GGUF spec, "GGML types"; ggml's GGML_FP16_TO_FP32 /
// GGML_FP32_TO_FP16). Shared by the engine (reading weights) and the tools
// (writing them). Threads: pure functions.
#ifndef TANDEM_ENGINE_GGUF_HALF_H_
#define TANDEM_ENGINE_GGUF_HALF_H_

#include <cstdint>

namespace tandem::gguf {

// binary16 bits `h` -> binary32, exact (every half is a float: subnormals,
// infinities and NaN payloads included).
float HalfToFloat(uint16_t h);

// binary32 -> binary16 bits, rounding to nearest even (overflow to
// infinity, subnormals kept, NaN stays NaN).
uint16_t FloatToHalf(float x);

}  // namespace tandem::gguf

#endif  // TANDEM_ENGINE_GGUF_HALF_H_
