// UTF-8 helpers and GPT-2's byte <-> unicode map, shared by the SPM and
// byte-level BPE tokenizers. Internal to engine/tokenizer/.
//
// Owns: nothing (pure functions over static tables).
// Threads: thread-safe; the tables are built once, on first use.
#ifndef TANDEM_ENGINE_TOKENIZER_UNICODE_H_
#define TANDEM_ENGINE_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tokenizer::internal {

// Length of the UTF-8 sequence that starts with `lead`, from its high
// nibble: 1 for ASCII, continuation and invalid bytes, 2/3/4 for lead bytes
// (llama.cpp's unicode_len_utf8; the caller clips it to the text).
size_t Utf8Len(uint8_t lead);

// GPT-2's bytes_to_unicode (openai/gpt-2 encoder.py, llama.cpp's
// unicode_byte_to_utf8): the bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand
// for themselves (as code points), the other 68 bytes map in order to U+0100,
// U+0101, ... Returns the UTF-8 of the stand-in code point of `byte`.
std::string_view ByteToUnicode(uint8_t byte);

// Appends the stand-ins of every byte of `bytes` to `out` (llama.cpp's
// unicode_byte_encoding_process for one word).
void AppendByteEncoded(std::string_view bytes, std::string* out);

// Inverse of ByteToUnicode for a byte-level BPE token's text (llama.cpp's
// llama_decode_text): each code point becomes its byte. A code point that is
// no stand-in (or a malformed UTF-8 sequence, taken byte by byte) becomes
// "[UNK_BYTE_0x<hex of its UTF-8>" + text + "]", as llama.cpp renders it.
std::string DecodeByteLevel(std::string_view text);

}  // namespace tandem::tokenizer::internal

#endif  // TANDEM_ENGINE_TOKENIZER_UNICODE_H_
