// Test helpers shared by the jit_*_test.cpp files: a private temporary directory, file I/O, a fake pid.
// Context: tests only.
#pragma once

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace jit_test {

// A fresh directory under /tmp, removed (with the files directly in it) at the end of the scope.
struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/selfprof-jit-test-XXXXXX";
    char* p = ::mkdtemp(tmpl);
    path = p ? p : "";
  }
  ~temp_dir() {
    if (path.empty()) return;
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") ::unlink((path + "/" + n).c_str());
      }
      ::closedir(d);
    }
    ::rmdir(path.c_str());
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A pid no live process has here (pid_max is at most 2^22), so file names never collide with real ones.
inline long fake_pid() { return 4200000 + static_cast<long>(::getpid() % 100000); }

}  // namespace jit_test
