#include "apps/monitor/report.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "apps/monitor/server.h"

namespace strata::monitor {

namespace {

Error bad_run(const std::string& source, const std::string& what) {
  return make_error(ErrorKind::invalid_argument,
                    fmt::format("{}: {} (expected the --metrics file of `strata train`)", source, what));
}

// JSON inside <script>: no "<" may appear, or "</script>" in a string would end the element.
std::string script_safe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

Result<nlohmann::ordered_json> history_from_run_json(const nlohmann::ordered_json& json, const std::string& source) {
  if (!json.is_object()) return bad_run(source, "not a JSON object");
  auto steps = json.find("steps");
  if (steps == json.end() || !steps->is_array()) return bad_run(source, "no 'steps' list");
  if (steps->empty()) return bad_run(source, "'steps' is empty: the run trained no step");
  for (size_t i = 0; i < steps->size(); ++i) {
    const auto& step = (*steps)[i];
    if (!step.is_object()) return bad_run(source, fmt::format("steps[{}] is not an object", i));
    for (const char* key : {"step", "loss", "seconds"})
      if (!step.contains(key) || !step[key].is_number())
        return bad_run(source, fmt::format("steps[{}] has no numeric '{}'", i, key));
  }
  const nlohmann::ordered_json summary = json.value("summary", nlohmann::ordered_json::object());
  if (!summary.is_object()) return bad_run(source, "'summary' is not an object");
  nlohmann::ordered_json run;
  run["config"] = json.value("config", std::string());
  run["state"] = "finished";
  run["first_step"] = summary.value("first_step", uint64_t{0});
  run["total_steps"] = summary.value("last_step", (*steps).back()["step"].get<uint64_t>());
  run["committed_step"] = run["total_steps"];
  run["tokens_per_step"] = json.value("tokens_per_step", uint64_t{0});
  run["predicted_step_seconds"] = summary.value("predicted_step_seconds", 0.0);
  if (json.contains("budgets") && json["budgets"].is_object()) run["budgets"] = json["budgets"];
  run["summary"] = summary;
  return nlohmann::ordered_json{{"run", std::move(run)}, {"steps", *steps}};
}

Status write_report(const std::string& run_json_path, const std::string& out_path) {
  std::ifstream in(run_json_path);
  if (!in)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: cannot read it ({})", run_json_path, std::strerror(errno)));
  nlohmann::ordered_json json = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return bad_run(run_json_path, "not valid JSON");
  STRATA_ASSIGN_OR_RETURN(nlohmann::ordered_json history, history_from_run_json(json, run_json_path));

  std::string page = report_template();
  // The title sits in <head>, the data in the last <script>: replace the first title mark and
  // the last data mark, so neither value can be mistaken for the other's placeholder.
  const std::string title = fmt::format("strata run report — {}", history["run"]["config"].get<std::string>());
  if (size_t at = page.find("@STRATA_TITLE@"); at != std::string::npos)
    page.replace(at, std::string_view("@STRATA_TITLE@").size(), html_escape(title));
  if (size_t at = page.rfind("@STRATA_DATA@"); at != std::string::npos)
    page.replace(at, std::string_view("@STRATA_DATA@").size(), script_safe(history.dump()));
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  out << page;
  out.close();
  if (!out) return make_errno_error(errno, "write report", out_path);
  return Status();
}

}  // namespace strata::monitor
