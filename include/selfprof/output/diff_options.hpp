// The options of the differential writers (output/diff.hpp), alone: what the public API needs to declare
// selfprof::diff() without parsing the SVG writer behind it.
// Context: any thread (plain values).
#pragma once

#include <cstdint>

namespace selfprof {

// Which count sets a frame's width in the differential SVG.
enum class diff_width : std::uint8_t {
  larger,  // max(before, after) per stack (default): stacks that vanished stay visible
  after,   // the new profile, as flamegraph.pl draws difffolded output
  before,  // the baseline
};

struct diff_options {
  bool normalize = false;  // difffolded -n: scale "before" counts by total_after/total_before (truncated)
  bool strip_hex = false;  // difffolded -s: every 0x[0-9a-fA-F]+ becomes 0x... before matching stacks
  bool negate = false;     // flamegraph.pl --negate: swap the hues and the sign shown
  bool inclusive = false;  // colour by each frame's inclusive change instead of its self change
  diff_width widths = diff_width::larger;
};

}  // namespace selfprof
