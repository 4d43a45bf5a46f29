// CSV export: reads metrics.jsonl once into two in-memory tables of cell text (columns are
// only known once every line has been seen), then renders each with RFC 4180 quoting and
// writes it atomically. Numbers are formatted by nlohmann::json's own shortest round-trip
// printer, which ignores the C locale, so a German locale cannot turn 0.5 into "0,5".
#include "gradguard/apps/csv_export.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradguard/core/fs.h"
#include "gradguard/telemetry/tensorboard.h"

namespace gradguard::report {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kWriteChunk = size_t{1} << 20;  // bytes handed to the file at once

// The text of one cell (objects are flattened by the caller).
std::string cell_text(const Json& value) {
  if (value.is_null()) return "";
  if (value.is_boolean()) return value.get<bool>() ? "1" : "0";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float() && !std::isfinite(value.get<double>())) return "";
  return value.dump();  // numbers, arrays
}

// RFC 4180: quote a cell holding a comma, a double quote, CR or LF; double inner quotes.
void append_csv_cell(std::string* out, const std::string& cell) {
  if (cell.find_first_of(",\"\r\n") == std::string::npos) {
    out->append(cell);
    return;
  }
  out->push_back('"');
  for (char c : cell) {
    if (c == '"') out->push_back('"');
    out->push_back(c);
  }
  out->push_back('"');
}

// Columns in first-seen order and rows of cells; a row shorter than the header is padded
// with empty cells when rendered.
class Table {
 public:
  explicit Table(const std::string& first_column) { column(first_column); }

  size_t add_row() {
    rows_.emplace_back();
    return rows_.size() - 1;
  }
  size_t rows() const { return rows_.size(); }

  void set(size_t row, const std::string& column_name, std::string cell) {
    const size_t col = column(column_name);
    std::vector<std::string>& cells = rows_.at(row);
    if (cells.size() <= col) cells.resize(col + 1);
    cells[col] = std::move(cell);
  }

  // `value` under `name`, objects flattened into "name/key" columns.
  void set_value(size_t row, const std::string& name, const Json& value) {
    if (value.is_object()) {
      for (const auto& [key, inner] : value.items()) set_value(row, name + "/" + key, inner);
    } else {
      set(row, name, cell_text(value));
    }
  }

  // The whole table as CSV text. `extra` (may be empty): one more last column, with
  // `extra_cells` [row] as its cells.
  std::string render(const std::string& extra = "",
                     const std::vector<std::string>& extra_cells = {}) const {
    std::string out;
    auto end_row = [&](size_t row) {
      if (!extra.empty()) {
        out.push_back(',');
        append_csv_cell(&out, row == SIZE_MAX ? extra : extra_cells.at(row));
      }
      out.push_back('\n');
    };
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (c > 0) out.push_back(',');
      append_csv_cell(&out, columns_[c]);
    }
    end_row(SIZE_MAX);
    for (size_t r = 0; r < rows_.size(); ++r) {
      for (size_t c = 0; c < columns_.size(); ++c) {
        if (c > 0) out.push_back(',');
        if (c < rows_[r].size()) append_csv_cell(&out, rows_[r][c]);
      }
      end_row(r);
    }
    return out;
  }

 private:
  size_t column(const std::string& name) {
    const auto [it, inserted] = index_.emplace(name, columns_.size());
    if (inserted) columns_.push_back(name);
    return it->second;
  }

  std::vector<std::string> columns_;               // [column] header
  std::unordered_map<std::string, size_t> index_;  // header -> column
  std::vector<std::vector<std::string>> rows_;     // [row][column] cell text
};

void write_atomic_chunked(const std::string& path, const std::string& text) {
  fs::AtomicFile file(path);
  for (size_t at = 0; at < text.size(); at += kWriteChunk)
    file.write(text.data() + at, std::min(kWriteChunk, text.size() - at));
  file.commit();
}

}  // namespace

CsvExport write_csv(const std::string& metrics_path, const std::string& out_dir) {
  Table steps("step");
  std::vector<std::string> val_cells;      // [steps row] val_loss cell
  std::vector<int64_t> row_steps;          // [steps row] step
  std::map<int64_t, std::string> pending;  // step -> val_loss cell not yet on a row
  Table telemetry("step");
  CsvExport result;

  telemetry::for_each_metrics_line(metrics_path, [&](int64_t, const Json& line) {
    const telemetry::MetricsLineKind kind = telemetry::classify_metrics_line(line);
    const int64_t step = telemetry::metrics_line_step(line);
    if (kind == telemetry::MetricsLineKind::kValidation) {
      pending[step] = cell_text(line["val_loss"]);
    } else if (kind == telemetry::MetricsLineKind::kStep) {
      const size_t row = steps.add_row();
      steps.set(row, "step", std::to_string(step));
      row_steps.push_back(step);
      val_cells.emplace_back();
      for (const auto& [key, value] : line.items()) {
        if (key == "step") continue;
        if (key == "val_loss")
          val_cells[row] = cell_text(value);
        else if (key == "layer_grad_norms" && value.is_object())
          steps.set_value(row, "layer_grad_norm", value);
        else
          steps.set_value(row, key, value);
      }
      const auto it = pending.find(step);
      if (it != pending.end()) {
        val_cells[row] = it->second;
        pending.erase(it);
      }
    } else if (kind == telemetry::MetricsLineKind::kTelemetry) {
      const size_t row = telemetry.add_row();
      telemetry.set(row, "step", std::to_string(step));
      for (const auto& [key, value] : line.items())
        if (key != "step" && key != "event") telemetry.set_value(row, key, value);
    }
  }, [&](int64_t, const std::string& why) { result.skipped.push_back(why); });

  // Validation lines no later step line picked up: the last row of their step, when its
  // cell is free, or a row of their own.
  for (const auto& [step, cell] : pending) {
    size_t row = row_steps.size();
    while (row > 0 && row_steps[row - 1] != step) --row;
    if (row > 0 && val_cells[row - 1].empty()) {
      val_cells[row - 1] = cell;
      continue;
    }
    const size_t added = steps.add_row();
    steps.set(added, "step", std::to_string(step));
    row_steps.push_back(step);
    val_cells.push_back(cell);
  }

  result.steps_path = out_dir + "/steps.csv";
  result.telemetry_path = out_dir + "/telemetry.csv";
  result.step_rows = static_cast<int64_t>(steps.rows());
  result.telemetry_rows = static_cast<int64_t>(telemetry.rows());
  write_atomic_chunked(result.steps_path, steps.render("val_loss", val_cells));
  write_atomic_chunked(result.telemetry_path, telemetry.render());
  return result;
}

}  // namespace gradguard::report
