// The selfprof demo: a small program with a clear hot path that profiles itself, then prints where its
// time went and writes a flame graph (SVG) and a folded profile.
//
//   ./example_demo [output-directory]
//
// The work: "render" a few frames of an image on two threads. Blurring takes most of the time, hashing
// the result some, and parsing a tiny scene description a little.
#include <selfprof.hpp>
#include <selfprof/output/top.hpp>  // the top-list writer, printed below

#include <pthread.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace demo {

__attribute__((noinline)) float blur_pixel(const std::vector<float>& img, int w, int h, int x, int y) {
  float sum = 0;
  for (int dy = -3; dy <= 3; ++dy)
    for (int dx = -3; dx <= 3; ++dx) {
      int xx = std::min(std::max(x + dx, 0), w - 1), yy = std::min(std::max(y + dy, 0), h - 1);
      sum += img[static_cast<std::size_t>(yy * w + xx)];
    }
  return sum / 49.0f;
}

__attribute__((noinline)) void blur(std::vector<float>& img, int w, int h) {
  std::vector<float> out(img.size());
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) out[static_cast<std::size_t>(y * w + x)] = blur_pixel(img, w, h, x, y);
  img.swap(out);
}

__attribute__((noinline)) unsigned long hash_image(const std::vector<float>& img) {
  unsigned long h = 1469598103934665603ul;
  for (int round = 0; round < 6; ++round)
    for (float v : img) h = (h ^ static_cast<unsigned long>(v * 1000)) * 1099511628211ul;
  return h;
}

__attribute__((noinline)) int parse_scene(const std::string& text) {
  int objects = 0;
  for (int round = 0; round < 2000; ++round)
    for (char c : text) objects += c == '{';
  return objects;
}

__attribute__((noinline)) unsigned long render_frames(int frames) {
  const int w = 320, h = 200;
  unsigned long check = 0;
  for (int f = 0; f < frames; ++f) {
    std::vector<float> img(static_cast<std::size_t>(w * h));
    for (std::size_t i = 0; i < img.size(); ++i) img[i] = std::sin(static_cast<float>(i + f));
    check += static_cast<unsigned long>(parse_scene("scene { sphere { r 1 } cube { s 2 } light { } }"));
    blur(img, w, h);
    check += hash_image(img);
  }
  return check;
}

}  // namespace demo

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  selfprof::status started = SELFPROF_START();  // 99 Hz unless SELFPROF_HZ says otherwise
  if (!started) return 1;
  selfprof::stats st = selfprof::get_stats();
  std::printf("selfprof %s: sampling at %g Hz with %s\n  why: %s\n", SELFPROF_VERSION_STRING, st.hz,
              st.source_detail.c_str(), st.source_reason.c_str());
  for (const auto& r : st.refused) std::printf("  refused %s\n", r.c_str());

  unsigned long check = 0;
  std::thread worker([&] {
    pthread_setname_np(pthread_self(), "render-worker");
    check += demo::render_frames(160);
  });
  unsigned long mine = demo::render_frames(160);
  worker.join();

  selfprof::stop();
  st = selfprof::get_stats();
  std::printf("collected %llu samples from %zu threads (%llu dropped, %llu truncated)\n",
              static_cast<unsigned long long>(st.samples), st.threads_seen,
              static_cast<unsigned long long>(st.dropped_full),
              static_cast<unsigned long long>(st.truncated));

  selfprof::profile p = selfprof::snapshot();
  selfprof::top_options top;
  top.limit = 8;
  std::printf("\n%s\n", selfprof::write_top(p, top).c_str());

  const std::string folded = dir + "/demo.folded", svg = dir + "/demo.svg";
  selfprof::status written = selfprof::dump(folded + "," + svg);
  if (!written) {
    std::fprintf(stderr, "%s\n", written.message().c_str());
    return 1;
  }
  std::printf("folded profile: %s\nflame graph:    %s  (open it in a browser)\n", folded.c_str(),
              svg.c_str());
  return (check + mine) == 42 ? 2 : 0;  // keep the work observable
}
