// The merged call tree behind a flame graph: stacks merged by frame name, laid out in sample space, pruned
// to a minimum width.
// Context: any thread (pure data structure; built on the dump path).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "selfprof/output/text.hpp"
#include "selfprof/profile.hpp"

namespace selfprof {
namespace detail {

constexpr std::uint32_t no_node = 0xffffffffu;

// Name of a frame as the picture shows it, with flamegraph.pl's annotation suffix for its kind.
// A name that already carries a `_[x]` suffix (read back from a folded file) keeps it as it is.
inline std::string annotated_frame_name(const frame& f) {
  std::string n = f.name.empty() ? std::string("[unknown]") : f.name;
  auto has_suffix = [&n] {
    return n.size() >= 4 && n[n.size() - 4] == '_' && n[n.size() - 3] == '[' && n.back() == ']' &&
           (n[n.size() - 2] == 'k' || n[n.size() - 2] == 'w' || n[n.size() - 2] == 'i' ||
            n[n.size() - 2] == 'j');
  };
  if (has_suffix()) return n;
  switch (f.kind) {
    case frame_kind::kernel:
      n += "_[k]";
      break;
    case frame_kind::jit:
      n += "_[j]";
      break;
    case frame_kind::inlined:
      n += "_[i]";
      break;
    default:
      break;
  }
  return n;
}

// The name without a trailing `_[k]`, `_[w]`, `_[i]` or `_[j]` (label and tooltip drop it).
inline std::string_view strip_annotation(std::string_view n) {
  if (n.size() >= 4 && n[n.size() - 4] == '_' && n[n.size() - 3] == '[' && n.back() == ']') {
    char k = n[n.size() - 2];
    if (k == 'k' || k == 'w' || k == 'i' || k == 'j') return n.substr(0, n.size() - 4);
  }
  return n;
}

// Which annotation a name carries: 'k', 'w', 'i', 'j', or 0.
inline char annotation_of(std::string_view n) {
  return strip_annotation(n).size() == n.size() ? 0 : n[n.size() - 2];
}

struct flame_node {
  std::uint32_t name = 0;  // index into flame_tree::names()
  std::uint32_t parent = no_node;
  std::uint32_t first_child = no_node;
  std::uint32_t last_child = no_node;
  std::uint32_t next_sibling = no_node;
  std::uint64_t width = 0;              // inclusive value of the layout channel
  std::uint64_t before = 0, after = 0;  // inclusive values (diff: baseline and new; else both equal)
  std::uint64_t self_before = 0, self_after = 0;  // exclusive values
};

// One frame placed for drawing, in emission order (parents before children).
struct laid_frame {
  std::uint32_t node = no_node;    // tree node, or no_node for an aggregate of elided frames
  std::uint32_t parent = no_node;  // index into the laid vector (no_node for the root)
  std::uint32_t depth = 0;         // 0 = root
  std::uint64_t x = 0, width = 0;  // sample space
  std::uint64_t before = 0, after = 0, self_before = 0, self_after = 0;
  std::uint32_t elided = 0;  // for aggregates: how many frames (with their subtrees) it stands for
};

// Stacks are collected first, then merged in one pass: sorted by name (or kept in order for a flame
// chart) so that equal prefixes are adjacent, and merged by walking each stack's common prefix with
// the previous one. No per-node hash lookups: this is the hot path for 100,000-stack profiles.
class flame_tree {
 public:
  flame_tree() {
    names_.emplace_back("all");
    nodes_.emplace_back();
  }

  // Interns a frame name (annotated) and returns its id.
  std::uint32_t intern(std::string name) {
    auto [it, fresh] = name_ids_.try_emplace(name, names_.size());
    if (fresh) names_.push_back(std::move(name));
    return static_cast<std::uint32_t>(it->second);
  }

  // Queues one stack (root first) with its values; build() merges the queue into the tree.
  void add(const std::uint32_t* ids, std::size_t n, std::uint64_t before, std::uint64_t after,
           std::uint64_t width) {
    pending p;
    p.offset = path_ids_.size();
    p.length = n;
    p.before = before;
    p.after = after;
    p.width = width;
    path_ids_.insert(path_ids_.end(), ids, ids + n);
    pending_.push_back(p);
  }

  // Merges the queued stacks. `sorted`: siblings ordered by name bytes and all equal prefixes merged;
  // else (flame chart) stacks keep their order and only adjacent equal prefixes merge.
  void build(bool sorted) {
    std::vector<std::uint32_t> key(names_.size());  // what paths are compared by
    if (sorted) {
      std::vector<std::uint32_t> by_name = identity_order(names_.size());
      sort_indices(
          by_name,
          [](const void* tree, std::uint32_t a, std::uint32_t b) {
            const auto& names = static_cast<const flame_tree*>(tree)->names_;
            return names[a] < names[b];
          },
          this);
      for (std::uint32_t r = 0; r < by_name.size(); ++r) key[by_name[r]] = r;
    } else {
      for (std::uint32_t i = 0; i < key.size(); ++i) key[i] = i;
    }
    std::vector<std::uint32_t> order = identity_order(pending_.size());
    if (sorted) {
      for (auto& id : path_ids_) id = key[id];  // compare ranks, then map back below
      sort_indices(order, path_less, this);
      std::vector<std::uint32_t> unrank(key.size());
      for (std::uint32_t i = 0; i < key.size(); ++i) unrank[key[i]] = i;
      for (auto& id : path_ids_) id = unrank[id];
    }
    std::vector<std::uint32_t> path_nodes{0};  // path_nodes[d] = node at depth d of the previous stack
    const std::uint32_t* prev = nullptr;
    std::size_t prev_len = 0;
    for (std::uint32_t idx : order) {
      const pending& p = pending_[idx];
      const std::uint32_t* ids = path_ids_.data() + p.offset;
      std::size_t common = 0;
      while (common < p.length && common < prev_len && ids[common] == prev[common]) ++common;
      path_nodes.resize(common + 1);
      for (std::size_t d = common; d < p.length; ++d) path_nodes.push_back(new_child(path_nodes[d], ids[d]));
      for (std::size_t d = 0; d <= p.length; ++d) {  // sums saturate: counts from files can be huge
        flame_node& n = nodes_[path_nodes[d]];
        add_saturating(n.before, p.before);
        add_saturating(n.after, p.after);
        add_saturating(n.width, p.width);
      }
      flame_node& leaf = nodes_[path_nodes[p.length]];
      add_saturating(leaf.self_before, p.before);
      add_saturating(leaf.self_after, p.after);
      prev = ids;
      prev_len = p.length;
    }
    pending_.clear();
    path_ids_.clear();
  }

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<flame_node>& nodes() const { return nodes_; }
  std::uint64_t total_width() const { return nodes_[0].width; }

  // Places every frame at least `min_width` wide (sample units); the narrower children of a node
  // are merged into one aggregate frame placed after its other children, kept if it is itself at
  // least `min_width` wide. Siblings keep the order build() gave them.
  std::vector<laid_frame> layout(double min_width) const {
    std::vector<laid_frame> out;
    laid_frame root;
    root.node = 0;
    fill_values(root, nodes_[0]);
    root.width = nodes_[0].width;
    out.push_back(root);
    std::vector<std::uint32_t> stack{0};  // indices into `out` whose children are still to place
    while (!stack.empty()) {
      const std::uint32_t parent_laid = stack.back();
      stack.pop_back();
      const std::uint32_t depth = out[parent_laid].depth + 1;
      std::uint64_t x = out[parent_laid].x;
      laid_frame agg;
      agg.parent = parent_laid;
      agg.depth = depth;
      const std::size_t first_new = out.size();
      for (auto c = nodes_[out[parent_laid].node].first_child; c != no_node; c = nodes_[c].next_sibling) {
        const flame_node& n = nodes_[c];
        if (n.width == 0 && n.before == 0 && n.after == 0) continue;
        if (n.width == 0 || static_cast<double>(n.width) < min_width) {
          add_saturating(agg.width, n.width);
          add_saturating(agg.before, n.before);
          add_saturating(agg.after, n.after);
          ++agg.elided;
          continue;
        }
        laid_frame f;
        f.node = c;
        f.parent = parent_laid;
        f.depth = depth;
        f.x = x;
        f.width = n.width;
        fill_values(f, n);
        x += n.width;
        out.push_back(f);
      }
      if (agg.elided > 0 && agg.width > 0 && static_cast<double>(agg.width) >= min_width) {
        agg.x = x;
        out.push_back(agg);
      }
      for (std::size_t i = out.size(); i-- > first_new;)
        if (out[i].node != no_node) stack.push_back(static_cast<std::uint32_t>(i));
    }
    return out;
  }

 private:
  struct pending {
    std::size_t offset = 0, length = 0;
    std::uint64_t before = 0, after = 0, width = 0;
  };

  // Orders queued stacks by their paths (ranks of names), equal paths by queue order (a stable sort).
  static bool path_less(const void* tree, std::uint32_t a, std::uint32_t b) {
    const flame_tree& t = *static_cast<const flame_tree*>(tree);
    const pending& x = t.pending_[a];
    const pending& y = t.pending_[b];
    const std::uint32_t* p = t.path_ids_.data();
    const std::size_t n = x.length < y.length ? x.length : y.length;
    for (std::size_t i = 0; i < n; ++i)
      if (p[x.offset + i] != p[y.offset + i]) return p[x.offset + i] < p[y.offset + i];
    if (x.length != y.length) return x.length < y.length;
    return a < b;
  }

  static void fill_values(laid_frame& f, const flame_node& n) {
    f.before = n.before;
    f.after = n.after;
    f.self_before = n.self_before;
    f.self_after = n.self_after;
  }

  std::uint32_t new_child(std::uint32_t parent, std::uint32_t name) {
    auto id = static_cast<std::uint32_t>(nodes_.size());
    flame_node n;
    n.name = name;
    n.parent = parent;
    nodes_.push_back(n);
    flame_node& p = nodes_[parent];
    if (p.last_child == no_node)
      p.first_child = id;
    else
      nodes_[p.last_child].next_sibling = id;
    p.last_child = id;
    return id;
  }

  std::vector<std::string> names_;
  std::unordered_map<std::string, std::size_t> name_ids_;  // the writers' one string-keyed map type
  std::vector<flame_node> nodes_;
  std::vector<pending> pending_;
  std::vector<std::uint32_t> path_ids_;
};

// Options that shape the tree (not its drawing).
struct flame_build_options {
  bool reverse = false;      // leaf becomes the root: merge from the leaf end
  bool flamechart = false;   // keep the profile's stack order; only adjacent identical prefixes merge
  bool mark_wakers = false;  // chain palette: frames after a `--` frame get `_[w]`
};

// Adds every stack of `p` to `tree` with the given channel (0: before, 1: after, 2: both).
// `width_of` maps (before, after) of one stack to its layout width.
template <class WidthOf>
void add_profile(flame_tree& tree, const profile& p, int channel, const flame_build_options& o,
                 WidthOf width_of) {
  std::vector<std::uint32_t> frame_ids(p.frames.size(), no_node);
  std::vector<std::uint32_t> path;
  for (const stack& s : p.stacks) {
    if (s.count == 0) continue;
    path.clear();
    bool after_separator = false;
    for (std::uint32_t fi : s.frames) {
      if (fi >= p.frames.size()) continue;  // a bad index names nothing: skip the frame, keep the stack
      std::uint32_t id;
      if (o.mark_wakers && after_separator && p.frames[fi].name != "--") {
        std::string n = annotated_frame_name(p.frames[fi]);
        if (annotation_of(n) == 0) n += "_[w]";
        id = tree.intern(std::move(n));
      } else {
        if (frame_ids[fi] == no_node) frame_ids[fi] = tree.intern(annotated_frame_name(p.frames[fi]));
        id = frame_ids[fi];
      }
      if (o.mark_wakers && p.frames[fi].name == "--") after_separator = true;
      path.push_back(id);
    }
    if (o.reverse) std::reverse(path.begin(), path.end());
    std::uint64_t before = channel == 1 ? 0 : s.count;
    std::uint64_t after = channel == 0 ? 0 : s.count;
    tree.add(path.data(), path.size(), before, after, width_of(before, after));
  }
  tree.build(!o.flamechart);
}

}  // namespace detail
}  // namespace selfprof
