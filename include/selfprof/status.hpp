// Errors as values: a small status type with a message, used across the public API instead of exceptions.
// Context: any thread (not the signal handler: it allocates).
#pragma once

#include <string>
#include <utility>

namespace selfprof {

class status {
 public:
  status() = default;
  static status ok() { return status(); }
  static status error(std::string message) {
    status s;
    s.failed_ = true;
    s.message_ = std::move(message);
    return s;
  }
  explicit operator bool() const { return !failed_; }
  bool is_ok() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  bool failed_ = false;
  std::string message_;
};

}  // namespace selfprof
