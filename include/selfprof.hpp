// selfprof: a CPU profiler a Linux program embeds in itself. Include this one header.
// Context: any thread (see each part's header for where its functions may run).
//
// Header-only by default. With SELFPROF_COMPILED_LIB=1 (the compiled library) this header declares the
// API only; the inline utilities (the folded-text reader, the symbolizer, the writers) are then
// included from their own headers where needed.
#pragma once

#include "selfprof/config.hpp"
#include "selfprof/frames.hpp"
#include "selfprof/jit.hpp"
#include "selfprof/options.hpp"
#include "selfprof/profile.hpp"
#include "selfprof/profiler.hpp"
#include "selfprof/stats.hpp"
#include "selfprof/status.hpp"
#include "selfprof/version.hpp"

#if SELFPROF_DETAIL_WITH_IMPLEMENTATION
#include "selfprof/output/diff.hpp"
#include "selfprof/output/folded_parse.hpp"
#include "selfprof/symbols/symbolizer.hpp"
#endif
