/* dump_test.sh target (C): one thread burns CPU in spin_hot_function while the main thread sleeps
 * argv[1] seconds at a time with sleep(3), again and again until the file argv[2] exists (once when no
 * file is given); prints "ready" when both run, then the shortest sleep. Exits 0 when every sleep
 * slept its full time, 1 when one was cut short (a signal landed on the main thread). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static volatile int stop;
static volatile unsigned long rounds = 1000000; /* volatile: the call is not hoisted out of the loop */

__attribute__((noinline)) unsigned long spin_hot_function(unsigned long n) {
  unsigned long acc = 7;
  for (unsigned long i = 0; i < n; ++i) acc = acc * 6364136223846793005ul + i;
  return acc;
}

static void* spinner(void* arg) {
  (void)arg;
  while (!stop) sink += spin_hot_function(rounds);
  return 0;
}

int main(int argc, char** argv) {
  unsigned seconds = argc > 1 ? (unsigned)atoi(argv[1]) : 5;
  const char* until = argc > 2 ? argv[2] : 0;
  pthread_t t;
  if (pthread_create(&t, 0, spinner, 0) != 0) return 2;
  printf("ready\n");
  fflush(stdout);
  int cut = 0, n = 0;
  double shortest = 1e9;
  do {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    unsigned left = sleep(seconds);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double slept = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    if (slept < shortest) shortest = slept;
    if (left != 0 || slept < seconds - 0.01) cut = 1;
    ++n;
  } while (until && access(until, F_OK) != 0);
  stop = 1;
  pthread_join(t, 0);
  printf("%d sleep(%u) calls, the shortest %.3f s%s\n", n, seconds, shortest, cut ? ", cut short" : "");
  return cut;
}
