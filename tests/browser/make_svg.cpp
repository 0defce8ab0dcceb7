// Writes the demo flame graph used by the browser test and the README picture: a synthetic game
// engine profile with thread roots, kernel frames, inlined frames and names that need escaping.
// Usage: make_svg OUT.svg [fixed]   ("fixed" draws at a fixed 1200 px instead of fluid width)
#include <selfprof/output/svg.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct demo {
  selfprof::profile p;
  std::uint32_t frame(const std::string& name, selfprof::frame_kind k = selfprof::frame_kind::native) {
    for (std::uint32_t i = 0; i < p.frames.size(); ++i)
      if (p.frames[i].name == name && p.frames[i].kind == k) return i;
    selfprof::frame f;
    f.name = name;
    f.kind = k;
    p.frames.push_back(f);
    return static_cast<std::uint32_t>(p.frames.size() - 1);
  }
  void add(std::initializer_list<std::uint32_t> frames, std::uint64_t count) {
    selfprof::stack s;
    s.frames = frames;
    s.count = count;
    p.stacks.push_back(s);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT.svg [fixed]\n", argv[0]);
    return 2;
  }
  using K = selfprof::frame_kind;
  demo d;
  const auto root = d.frame("[main tid=4242]", K::marker), rroot = d.frame("[render tid=4243]", K::marker);
  const auto main_ = d.frame("main"), run = d.frame("engine::Engine::run()");
  const auto frame_ = d.frame("engine::Engine::frame(double)");
  const auto update = d.frame("engine::World::update(float)");
  const auto step = d.frame("physics::Solver::step(float)"),
             broad = d.frame("physics::BroadPhase::collide()");
  const auto narrow = d.frame("physics::Solver::solve_contacts(std::vector<Contact>&)");
  const auto integ = d.frame("physics::integrate(Body&, float)", K::inlined);
  const auto ai = d.frame("ai::Planner::think(Agent const&)"),
             path = d.frame("ai::astar<Grid, \"manhattan\">(Node*, Node*)");
  const auto heap = d.frame("std::priority_queue<Node*>::push"), malloc_ = d.frame("malloc");
  const auto anim = d.frame("anim::Skeleton::pose()"), lerp = d.frame("glm::mix<vec4>", K::inlined);
  const auto audio = d.frame("audio::Mixer::mix(float*, int)");
  const auto submit = d.frame("render::Renderer::submit()"), cull = d.frame("render::Frustum::cull(Scene&)");
  const auto draw = d.frame("render::Renderer::draw_frame()"), gl = d.frame("glDrawElements"),
             ioctl = d.frame("ioctl"), sys = d.frame("entry_SYSCALL_64", K::kernel),
             drm = d.frame("drm_ioctl", K::kernel), fut = d.frame("futex_wait", K::kernel),
             wait = d.frame("std::condition_variable::wait"), swap = d.frame("render::Swapchain::present()");
  const auto shader = d.frame("jit::shader_0x7f3a<tex&light>", K::jit);
  const auto cafe = d.frame("caf\xC3\xA9::r\xC3\xA9sum\xC3\xA9()");
  d.add({root, main_, run, frame_, update, step, broad}, 1800);
  d.add({root, main_, run, frame_, update, step, narrow}, 2600);
  d.add({root, main_, run, frame_, update, step, narrow, integ}, 900);
  d.add({root, main_, run, frame_, update, step}, 300);
  d.add({root, main_, run, frame_, update, ai, path}, 1500);
  d.add({root, main_, run, frame_, update, ai, path, heap}, 700);
  d.add({root, main_, run, frame_, update, ai, path, heap, malloc_}, 250);
  d.add({root, main_, run, frame_, update, anim, lerp}, 1100);
  d.add({root, main_, run, frame_, update, anim}, 400);
  d.add({root, main_, run, frame_, update, cafe}, 120);
  d.add({root, main_, run, frame_, audio}, 650);
  d.add({root, main_, run, frame_, submit, cull}, 800);
  d.add({root, main_, run, frame_, submit}, 200);
  d.add({root, main_, run, frame_, submit, wait, sys, fut}, 350);
  d.add({rroot, draw, gl, ioctl, sys, drm}, 1400);
  d.add({rroot, draw, gl}, 600);
  d.add({rroot, draw, shader}, 900);
  d.add({rroot, draw, swap, ioctl, sys, drm}, 500);
  d.add({rroot, draw, step}, 60);  // the same function on another thread: same colour, own frame
  // A long tail of tiny stacks: merged into "[N elided frames]" aggregates.
  for (int i = 0; i < 40; ++i)
    d.add({root, main_, run, frame_, update, d.frame("script::callback_" + std::to_string(i))}, 1);
  std::uint64_t total = 0;
  for (const auto& s : d.p.stacks) total += s.count;
  d.p.info.mode = selfprof::profile_mode::cpu;
  d.p.info.source = "perf";
  d.p.info.hz = 999;
  d.p.info.duration_s = total / 999.0 / 2;
  d.p.info.samples = total;
  d.p.info.dropped = 12;
  d.p.threads = {{4242, "main"}, {4243, "render"}};

  selfprof::svg_options o;
  o.title = "selfprof demo: game engine frame loop";
  o.subtitle = "CPU profile of two threads";
  if (argc > 2 && std::strcmp(argv[2], "fixed") == 0) o.fluid = false;
  std::string svg = selfprof::detail::write_svg(d.p, o);
  std::FILE* f = std::fopen(argv[1], "wb");
  if (!f || std::fwrite(svg.data(), 1, svg.size(), f) != svg.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "make_svg: cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
