// strata/apps/monitor/report.h — `strata report`: a finished run's charts as one HTML file.
//
// Contract: reads the `--metrics` JSON of `strata train` (RUN.json), checks that it is one
// (a `steps` list of objects with numeric step, loss and seconds), and writes one
// self-contained HTML file — the dashboard's chart code and the run's history inlined, no
// external script, style, font or request — readable offline in any browser. A missing or
// malformed RUN.json is invalid_argument naming the file and what is wrong (exit 2); a
// failed write names the output path. Writes nothing but `out_path`.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace strata::monitor {

// RUN.json (already parsed) → the charts' history shape {"run": {...}, "steps": [...]}.
[[nodiscard]] Result<nlohmann::ordered_json> history_from_run_json(const nlohmann::ordered_json& run,
                                                                   const std::string& source);

[[nodiscard]] Status write_report(const std::string& run_json_path, const std::string& out_path);

}  // namespace strata::monitor
