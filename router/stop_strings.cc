#include "router/stop_strings.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::router {

// Aho-Corasick automaton (Aho & Corasick 1975) with sparse goto edges and
// failure links. Node 0 is the root (the empty string); node n stands for
// the string spelled from the root to it.
struct StopStringMatcher::Automaton {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // goto edges
    int32_t fail = 0;                               // longest proper suffix that is also a node
    int32_t depth = 0;                              // length of the node's string
    // The stop string ending here that starts earliest: the longest stop
    // that is a suffix of the node's string (lowest index among equal
    // strings); -1 when none.
    int32_t out = -1;
  };

  std::vector<std::string> stops;
  std::vector<Node> nodes;

  int32_t Child(int32_t node, uint8_t byte) const {
    for (const auto& [b, child] : nodes[static_cast<size_t>(node)].next) {
      if (b == byte) return child;
    }
    return -1;
  }

  // The node after reading `byte` in `node`: follows failure links until an
  // edge exists (the root absorbs every byte without one).
  int32_t Step(int32_t node, uint8_t byte) const {
    while (true) {
      const int32_t child = Child(node, byte);
      if (child >= 0) return child;
      if (node == 0) return 0;
      node = nodes[static_cast<size_t>(node)].fail;
    }
  }

  explicit Automaton(std::vector<std::string> stop_list) : stops(std::move(stop_list)) {
    nodes.emplace_back();
    for (size_t i = 0; i < stops.size(); ++i) {
      int32_t node = 0;
      for (const char c : stops[i]) {
        const uint8_t byte = static_cast<uint8_t>(c);
        int32_t child = Child(node, byte);
        if (child < 0) {
          child = static_cast<int32_t>(nodes.size());
          Node n;
          n.depth = nodes[static_cast<size_t>(node)].depth + 1;
          nodes.push_back(std::move(n));
          nodes[static_cast<size_t>(node)].next.emplace_back(byte, child);
        }
        node = child;
      }
      // node == 0 only for an empty string, which is ignored.
      if (node != 0 && nodes[static_cast<size_t>(node)].out < 0) {
        nodes[static_cast<size_t>(node)].out = static_cast<int32_t>(i);
      }
    }
    // Breadth-first: a node's failure target is shallower, so it is final
    // before the node is reached.
    std::deque<int32_t> queue;
    for (const auto& [byte, child] : nodes[0].next) queue.push_back(child);
    while (!queue.empty()) {
      const int32_t node = queue.front();
      queue.pop_front();
      for (const auto& [byte, child] : nodes[static_cast<size_t>(node)].next) {
        Node& c = nodes[static_cast<size_t>(child)];
        c.fail = Step(nodes[static_cast<size_t>(node)].fail, byte);
        // A stop ending at the child itself is longer than any that is a
        // proper suffix; those are all suffixes of the failure node.
        if (c.out < 0) c.out = nodes[static_cast<size_t>(c.fail)].out;
        queue.push_back(child);
      }
    }
  }
};

StopStringMatcher::StopStringMatcher(const std::vector<std::string>& stops,
                                     bool include_stop_str_in_output)
    : automaton_(std::make_shared<const Automaton>(stops)), include_(include_stop_str_in_output) {}

const std::vector<std::string>& StopStringMatcher::stops() const { return automaton_->stops; }

StopPush StopStringMatcher::Push(std::string_view new_text, bool check) {
  StopPush result;
  if (stopped()) return result;
  if (!check) {
    result.text = std::move(held_);
    result.text.append(new_text);
    held_.clear();
    state_ = 0;
    return result;
  }
  const Automaton& a = *automaton_;
  for (size_t i = 0; i < new_text.size(); ++i) {
    state_ = a.Step(state_, static_cast<uint8_t>(new_text[i]));
    const int32_t out = a.nodes[static_cast<size_t>(state_)].out;
    if (out < 0) continue;
    stop_index_ = out;
    result.stop_index = out;
    if (include_) {
      // Everything before this push was released; the match ends here.
      result.text.assign(new_text.substr(0, i + 1));
    } else {
      // The match started inside held_ + new_text[0, i]: held_ is the whole
      // unreleased text and holds every possible start (see held()).
      const size_t end = held_.size() + i + 1;
      const size_t start = end - a.stops[static_cast<size_t>(out)].size();
      result.text = std::move(held_);
      result.text.append(new_text.substr(0, i + 1));
      result.text.resize(start);
    }
    held_.clear();
    return result;
  }
  if (include_) {
    result.text.assign(new_text);
    return result;
  }
  // No match: keep back the node's string, the longest suffix that is a
  // proper prefix of a stop (a full stop would have matched).
  std::string pending = std::move(held_);
  pending.append(new_text);
  const size_t keep = static_cast<size_t>(a.nodes[static_cast<size_t>(state_)].depth);
  held_ = pending.substr(pending.size() - keep);
  pending.resize(pending.size() - keep);
  result.text = std::move(pending);
  return result;
}

std::string StopStringMatcher::Flush() {
  std::string rest = std::move(held_);
  held_.clear();
  state_ = 0;
  return rest;
}

absl::Status ValidateStopStrings(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop: at most ", kMaxStopStrings, " strings, got ", stops.size()));
  }
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty() || stops[i].size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop[", i, "]: must be 1 to ", kMaxStopStringBytes, " bytes, got ", stops[i].size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::router
