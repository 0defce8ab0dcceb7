/* record_test.sh target (C): burns CPU in hot_c_function, prints a line, exits with the status given
 * as argv[1] (so the test can check that `selfprof record` passes both through unchanged). */
#include <stdio.h>
#include <stdlib.h>

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long hot_c_function(unsigned long n) {
  unsigned long acc = 7;
  for (unsigned long i = 0; i < n; ++i) acc = acc * 6364136223846793005ul + i;
  return acc;
}

int main(int argc, char** argv) {
  int code = argc > 1 ? atoi(argv[1]) : 0;
  unsigned long n = argc > 2 ? strtoul(argv[2], 0, 10) : 400000000ul;
  sink = hot_c_function(n);
  printf("hot.c done %d\n", code);
  return code;
}
