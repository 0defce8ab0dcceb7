// The subcommands of the selfprof tool: one entry point each, sharing the help and error conventions.
// Context: setup only (the command-line tool).
#pragma once

#include <string>

namespace selfprof_cli {

// Each returns the process exit status: 0 success, 1 input or output error, 2 usage error.
int run_collapse(int argc, char** argv);
int run_flamegraph(int argc, char** argv);
int run_diff(int argc, char** argv);
int run_top(int argc, char** argv);
int run_pprof(int argc, char** argv);
int run_record(int argc, char** argv);
int run_dump(int argc, char** argv);

// "selfprof <cmd>: <message>" on stderr; returns `code`.
int fail(const char* cmd, const std::string& message, int code = 1);

}  // namespace selfprof_cli
