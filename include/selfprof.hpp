// selfprof: a header-only CPU profiler a Linux program embeds in itself. Include this one header.
// Context: any thread (see each part's header for where its functions may run).
#pragma once

#include "selfprof/config.hpp"
#include "selfprof/frames.hpp"
#include "selfprof/jit.hpp"
#include "selfprof/options.hpp"
#include "selfprof/output/diff.hpp"
#include "selfprof/output/folded_parse.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/profiler.hpp"
#include "selfprof/status.hpp"
#include "selfprof/symbols/symbolizer.hpp"
#include "selfprof/version.hpp"
