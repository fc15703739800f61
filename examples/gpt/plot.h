#pragma once

// A self-contained SVG line chart of the loss curves (no plotting library needed).

#include <string>
#include <utility>
#include <vector>

namespace gpt {

struct Series {
  std::string name;
  std::string color;                              // any SVG colour, e.g. "#1f77b4"
  std::vector<std::pair<double, double>> points;  // (step, loss)
};

/// Renders the series on shared axes with ticks, labels and a legend.
std::string render_svg(const std::vector<Series>& series, const std::string& title,
                       const std::string& x_label = "step", const std::string& y_label = "loss");

/// Reads metrics.jsonl and writes the train / validation loss curves to svg_path.
void write_loss_plot(const std::string& metrics_path, const std::string& svg_path,
                     const std::string& title);

}  // namespace gpt
