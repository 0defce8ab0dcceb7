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
  // `code`: the errno behind the failure when one is (callers decide on it, never on the text), else 0.
  static status error(std::string message, int code = 0) {
    status s;
    s.failed_ = true;
    s.message_ = std::move(message);
    s.code_ = code;
    return s;
  }
  explicit operator bool() const { return !failed_; }
  bool is_ok() const { return !failed_; }
  const std::string& message() const { return message_; }
  int code() const { return code_; }

 private:
  bool failed_ = false;
  int code_ = 0;
  std::string message_;
};

}  // namespace selfprof
