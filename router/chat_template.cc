#include "router/chat_template.h"

#include <array>
#include <variant>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::router {
namespace {

struct FormatName {
  ChatFormat format;
  absl::string_view name;
};

// Enum order; ChatFormatName() and AllChatFormats() read it.
constexpr std::array<FormatName, 12> kFormats = {{
    {ChatFormat::kChatMl, "chatml"},
    {ChatFormat::kQwen3, "qwen3"},
    {ChatFormat::kLlama3, "llama3"},
    {ChatFormat::kLlama2, "llama2"},
    {ChatFormat::kLlama2Sys, "llama2-sys"},
    {ChatFormat::kLlama2SysBos, "llama2-sys-bos"},
    {ChatFormat::kLlama2SysStrip, "llama2-sys-strip"},
    {ChatFormat::kMistralV1, "mistral-v1"},
    {ChatFormat::kMistralV3, "mistral-v3"},
    {ChatFormat::kMistralV3Tekken, "mistral-v3-tekken"},
    {ChatFormat::kMistralV7, "mistral-v7"},
    {ChatFormat::kMistralV7Tekken, "mistral-v7-tekken"},
}};

// Every enumerator, in order, exactly once.
constexpr bool FormatsInEnumOrder() {
  for (size_t i = 0; i < kFormats.size(); ++i) {
    if (kFormats[i].format != static_cast<ChatFormat>(i)) return false;
  }
  return kFormats.size() == static_cast<size_t>(ChatFormat::kMistralV7Tekken) + 1;
}
static_assert(FormatsInEnumOrder(), "kFormats must list ChatFormat in enum order");

constexpr absl::string_view kOverrideKey = "chat_template";
// How much of an unrecognised template an error message quotes.
constexpr size_t kQuotedTemplateBytes = 60;

std::string KnownNames() {
  std::vector<absl::string_view> names;
  for (const FormatName& f : kFormats) names.push_back(f.name);
  return absl::StrJoin(names, ", ");
}

// The roles a template sees after "developer" is read as "system".
enum class Role { kSystem, kUser, kAssistant };

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kSystem:
      return "system";
    case Role::kUser:
      return "user";
    case Role::kAssistant:
      return "assistant";
  }
  return "";
}

struct Turn {
  Role role;
  absl::string_view content;
};

// ASCII whitespace, as llama.cpp's trim (isspace in the C locale).
constexpr absl::string_view kSpace = " \t\n\v\f\r";

absl::string_view Trim(absl::string_view s) {
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == absl::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

// Python's str.lstrip('\n') / rstrip('\n') / strip('\n').
absl::string_view LStripNewlines(absl::string_view s) {
  const size_t begin = s.find_first_not_of('\n');
  return begin == absl::string_view::npos ? absl::string_view() : s.substr(begin);
}
absl::string_view RStripNewlines(absl::string_view s) {
  const size_t end = s.find_last_not_of('\n');
  return end == absl::string_view::npos ? absl::string_view() : s.substr(0, end + 1);
}
absl::string_view StripNewlines(absl::string_view s) { return RStripNewlines(LStripNewlines(s)); }

void RenderChatMl(absl::Span<const Turn> turns, bool add_generation_prompt, std::string* out) {
  for (const Turn& t : turns) {
    absl::StrAppend(out, "<|im_start|>", RoleName(t.role), "\n", t.content, "<|im_end|>\n");
  }
  if (add_generation_prompt) absl::StrAppend(out, "<|im_start|>assistant\n");
}

// Qwen3's template (file comment of chat_template.h), no tools.
void RenderQwen3(absl::Span<const Turn> turns, bool add_generation_prompt, std::string* out) {
  const size_t n = turns.size();
  size_t last_query = n - 1;
  for (size_t i = n; i-- > 0;) {
    const absl::string_view c = turns[i].content;
    const bool tool_response =
        absl::StartsWith(c, "<tool_response>") && absl::EndsWith(c, "</tool_response>");
    if (turns[i].role == Role::kUser && !tool_response) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Turn& t = turns[i];
    if (t.role != Role::kAssistant) {
      absl::StrAppend(out, "<|im_start|>", RoleName(t.role), "\n", t.content, "<|im_end|>\n");
      continue;
    }
    absl::string_view answer = t.content;
    absl::string_view reasoning;
    if (const size_t first_end = t.content.find("</think>"); first_end != absl::string_view::npos) {
      const size_t last_end = t.content.rfind("</think>");
      answer = LStripNewlines(t.content.substr(last_end + absl::string_view("</think>").size()));
      absl::string_view before = RStripNewlines(t.content.substr(0, first_end));
      if (const size_t open = before.rfind("<think>"); open != absl::string_view::npos) {
        before = before.substr(open + absl::string_view("<think>").size());
      }
      reasoning = LStripNewlines(before);
    }
    absl::StrAppend(out, "<|im_start|>assistant\n");
    if (i > last_query && (i == n - 1 || !reasoning.empty())) {
      absl::StrAppend(out, "<think>\n", StripNewlines(reasoning), "\n</think>\n\n",
                      LStripNewlines(answer));
    } else {
      absl::StrAppend(out, answer);
    }
    absl::StrAppend(out, "<|im_end|>\n");
  }
  if (add_generation_prompt) absl::StrAppend(out, "<|im_start|>assistant\n");
}

void RenderLlama3(absl::Span<const Turn> turns, bool add_generation_prompt, std::string* out) {
  for (const Turn& t : turns) {
    absl::StrAppend(out, "<|start_header_id|>", RoleName(t.role), "<|end_header_id|>\n\n",
                    Trim(t.content), "<|eot_id|>");
  }
  if (add_generation_prompt) {
    absl::StrAppend(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
  }
}

void RenderLlama2(ChatFormat format, absl::Span<const Turn> turns, std::string* out) {
  const bool system_tags = format != ChatFormat::kLlama2;
  const bool bos_in_history = format == ChatFormat::kLlama2SysBos;
  const bool strip = format == ChatFormat::kLlama2SysStrip;
  // The first [INST] has no <s>: that BOS is the tokenizer's.
  bool inside_turn = true;
  absl::StrAppend(out, "[INST] ");
  for (const Turn& t : turns) {
    const absl::string_view content = strip ? Trim(t.content) : t.content;
    if (!inside_turn) {
      inside_turn = true;
      absl::StrAppend(out, bos_in_history ? "<s>[INST] " : "[INST] ");
    }
    switch (t.role) {
      case Role::kSystem:
        if (system_tags) {
          absl::StrAppend(out, "<<SYS>>\n", content, "\n<</SYS>>\n\n");
        } else {
          absl::StrAppend(out, content, "\n");  // no system slot: it joins the user turn
        }
        break;
      case Role::kUser:
        absl::StrAppend(out, content, " [/INST]");
        break;
      case Role::kAssistant:
        absl::StrAppend(out, content, "</s>");
        inside_turn = false;
        break;
    }
  }
}

// Mistral's v1, v3 and v3-tekken: the system text opens the next [INST].
void RenderMistralV1V3(ChatFormat format, absl::Span<const Turn> turns, std::string* out) {
  const absl::string_view lead = format == ChatFormat::kMistralV1 ? " " : "";
  const absl::string_view trail = format == ChatFormat::kMistralV3Tekken ? "" : " ";
  const bool trim_assistant = format == ChatFormat::kMistralV3;
  bool inside_turn = false;
  for (const Turn& t : turns) {
    if (!inside_turn) {
      absl::StrAppend(out, lead, "[INST]", trail);
      inside_turn = true;
    }
    switch (t.role) {
      case Role::kSystem:
        absl::StrAppend(out, t.content, "\n\n");
        break;
      case Role::kUser:
        absl::StrAppend(out, t.content, lead, "[/INST]");
        break;
      case Role::kAssistant:
        absl::StrAppend(out, trail, trim_assistant ? Trim(t.content) : t.content, "</s>");
        inside_turn = false;
        break;
    }
  }
}

void RenderMistralV7(ChatFormat format, absl::Span<const Turn> turns, std::string* out) {
  const absl::string_view space = format == ChatFormat::kMistralV7 ? " " : "";
  for (const Turn& t : turns) {
    switch (t.role) {
      case Role::kSystem:
        absl::StrAppend(out, "[SYSTEM_PROMPT]", space, t.content, "[/SYSTEM_PROMPT]");
        break;
      case Role::kUser:
        absl::StrAppend(out, "[INST]", space, t.content, "[/INST]");
        break;
      case Role::kAssistant:
        absl::StrAppend(out, space, t.content, "</s>");
        break;
    }
  }
}

}  // namespace

absl::string_view ChatFormatName(ChatFormat format) {
  return kFormats[static_cast<size_t>(format)].name;  // in enum order (static_assert above)
}

absl::Span<const ChatFormat> AllChatFormats() {
  static constexpr std::array<ChatFormat, kFormats.size()> kAll = [] {
    std::array<ChatFormat, kFormats.size()> a{};
    for (size_t i = 0; i < kFormats.size(); ++i) a[i] = kFormats[i].format;
    return a;
  }();
  return kAll;
}

std::optional<ChatFormat> ChatFormatFromName(absl::string_view name) {
  for (const FormatName& f : kFormats) {
    if (f.name == name) return f.format;
  }
  return std::nullopt;
}

std::optional<ChatFormat> DetectChatFormat(absl::string_view text) {
  if (std::optional<ChatFormat> named = ChatFormatFromName(text)) return named;
  auto has = [text](absl::string_view marker) { return absl::StrContains(text, marker); };
  if (has("<|im_start|>")) {
    // Phi-4 and SmolVLM use <|im_start|> but are not ChatML.
    if (has("<|im_sep|>") || has("<end_of_utterance>")) return std::nullopt;
    if (has("<think>") && has("</think>") && has("last_query_index")) return ChatFormat::kQwen3;
    return ChatFormat::kChatMl;
  }
  if (absl::StartsWith(text, "mistral") || has("[INST]")) {
    if (has("[SYSTEM_PROMPT]")) return ChatFormat::kMistralV7;
    if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      if (has(" [INST]")) return ChatFormat::kMistralV1;
      if (has("\"[INST]\"")) return ChatFormat::kMistralV3Tekken;
      return ChatFormat::kMistralV3;
    }
    if (has("content.strip()")) return ChatFormat::kLlama2SysStrip;
    if (has("bos_token + '[INST]")) return ChatFormat::kLlama2SysBos;
    if (has("<<SYS>>")) return ChatFormat::kLlama2Sys;
    return ChatFormat::kLlama2;
  }
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatFormat::kLlama3;
  return std::nullopt;
}

absl::StatusOr<std::string> RenderChat(ChatFormat format, absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt) {
  if (messages.empty()) return absl::InvalidArgumentError("messages: must not be empty");
  std::vector<Turn> turns;
  turns.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    Role r;
    if (role == "system" || role == "developer") {
      r = Role::kSystem;
    } else if (role == "user") {
      r = Role::kUser;
    } else if (role == "assistant") {
      r = Role::kAssistant;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role: must be system, developer, user or assistant, ",
                       "got '", absl::CHexEscape(role), "'"));
    }
    turns.push_back({r, messages[i].content});
  }
  std::string out;
  switch (format) {
    case ChatFormat::kChatMl:
      RenderChatMl(turns, add_generation_prompt, &out);
      break;
    case ChatFormat::kQwen3:
      RenderQwen3(turns, add_generation_prompt, &out);
      break;
    case ChatFormat::kLlama3:
      RenderLlama3(turns, add_generation_prompt, &out);
      break;
    case ChatFormat::kLlama2:
    case ChatFormat::kLlama2Sys:
    case ChatFormat::kLlama2SysBos:
    case ChatFormat::kLlama2SysStrip:
      RenderLlama2(format, turns, &out);
      break;
    case ChatFormat::kMistralV1:
    case ChatFormat::kMistralV3:
    case ChatFormat::kMistralV3Tekken:
      RenderMistralV1V3(format, turns, &out);
      break;
    case ChatFormat::kMistralV7:
    case ChatFormat::kMistralV7Tekken:
      RenderMistralV7(format, turns, &out);
      break;
  }
  return out;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Resolve(std::optional<absl::string_view> template_text,
                                                   absl::string_view override_name) {
  if (!override_name.empty()) {
    std::optional<ChatFormat> format = ChatFormatFromName(override_name);
    if (!format.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(kOverrideKey, ": unknown format '",
                                                     absl::CHexEscape(override_name),
                                                     "' (known: ", KnownNames(), ")"));
    }
    return ChatTemplate(format, absl::OkStatus());
  }
  const std::string hint =
      absl::StrCat("; set ", kOverrideKey, ": in the cluster config to one of ", KnownNames());
  if (!template_text.has_value() || template_text->empty()) {
    return ChatTemplate(
        std::nullopt,
        absl::FailedPreconditionError(absl::StrCat(
            "messages: the model has no chat template (tokenizer.chat_template)", hint)));
  }
  if (std::optional<ChatFormat> format = DetectChatFormat(*template_text)) {
    return ChatTemplate(format, absl::OkStatus());
  }
  // C-escaped, so a cut through a UTF-8 sequence stays valid ASCII.
  const absl::string_view head = template_text->substr(0, kQuotedTemplateBytes);
  return ChatTemplate(
      std::nullopt,
      absl::FailedPreconditionError(absl::StrCat(
          "messages: the model's chat template (tokenizer.chat_template) is not one Tandem "
          "renders: '",
          absl::CHexEscape(head), template_text->size() > head.size() ? "...'" : "'", hint)));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const gguf::GgufFile& file,
                                                    absl::string_view override_name) {
  constexpr char kKey[] = "tokenizer.chat_template";
  const gguf::MetadataValue* value = file.Find(kKey);
  if (value == nullptr) return Resolve(std::nullopt, override_name);
  const std::string* text = std::get_if<std::string>(value);
  if (text == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", kKey, ": expected a string"));
  }
  return Resolve(*text, override_name);
}

absl::string_view ChatTemplate::format_name() const {
  return format_.has_value() ? ChatFormatName(*format_) : absl::string_view();
}

absl::StatusOr<std::string> ChatTemplate::Apply(absl::Span<const ChatMessage> messages,
                                                bool add_generation_prompt) const {
  if (!format_.has_value()) return status_;
  return RenderChat(*format_, messages, add_generation_prompt);
}

}  // namespace tandem::router
