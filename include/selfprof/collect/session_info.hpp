// What a profiling session chose and remarked: the tick source in use (it can change while sampling, when
// the contention upgrade switches it), why, what was refused, and notes, each marked for whether it
// belongs in the profiles written (the decision is a flag, never a match on the text).
// Context: any thread except the signal handler; every method takes the object's lock.
#pragma once

#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "selfprof/options.hpp"

namespace selfprof {
namespace detail {

struct source_info {
  source_kind kind = source_kind::none;
  std::string detail;  // what was opened
  std::string reason;  // why it was chosen
  double effective_hz = 0;
  bool kernel_time = true;  // its samples include time spent in the kernel
};

class session_info {
 public:
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = source_info{};
    refused_.clear();
    notes_.clear();
  }
  void set_source(const source_info& s) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = s;
  }
  source_info source() {
    std::lock_guard<std::mutex> lock(mu_);
    return source_;
  }
  void set_refused(std::vector<std::string> r) {
    std::lock_guard<std::mutex> lock(mu_);
    refused_ = std::move(r);
  }
  std::vector<std::string> refused() {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_;
  }
  // `in_profile`: also said in every profile this session writes (its notes, the SVG's subtitle).
  void note(std::string text, bool in_profile = false) {
    std::lock_guard<std::mutex> lock(mu_);
    notes_.push_back(note_entry{std::move(text), in_profile});
  }
  void notes(std::vector<std::string>& all, std::vector<std::string>* profile_only = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const note_entry& n : notes_) {
      all.push_back(n.text);
      if (profile_only && n.in_profile) profile_only->push_back(n.text);
    }
  }
  void abandon_after_fork() {
    new (&mu_) std::mutex();
    source_ = source_info{};
    refused_.clear();
    notes_.clear();
  }

 private:
  struct note_entry {
    std::string text;
    bool in_profile;
  };
  std::mutex mu_;
  source_info source_;
  std::vector<std::string> refused_;
  std::vector<note_entry> notes_;
};

}  // namespace detail
}  // namespace selfprof
