#include "gpt/plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "gpt/metrics.h"
#include "tdist/error.h"

namespace gpt {
namespace {

constexpr double kWidth = 720, kHeight = 420;
constexpr double kLeft = 70, kRight = 20, kTop = 40, kBottom = 50;

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks.
double nice_step(double range, int target) {
  if (range <= 0) return 1.0;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm < 1.5 ? 1.0 : norm < 3.5 ? 2.0 : norm < 7.5 ? 5.0 : 10.0) * mag;
}

std::string fmt(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string render_svg(const std::vector<Series>& series, const std::string& title,
                       const std::string& x_label, const std::string& y_label) {
  double x_min = 1e300, x_max = -1e300, y_min = 1e300, y_max = -1e300;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x_min = std::min(x_min, x), x_max = std::max(x_max, x);
      y_min = std::min(y_min, y), y_max = std::max(y_max, y);
    }
  }
  if (x_min > x_max) x_min = 0, x_max = 1, y_min = 0, y_max = 1;  // no data
  if (x_max == x_min) x_max = x_min + 1;
  if (y_max == y_min) y_max = y_min + 1;
  const double y_step = nice_step(y_max - y_min, 6);
  y_min = std::floor(y_min / y_step) * y_step;
  y_max = std::ceil(y_max / y_step) * y_step;
  const double x_step = nice_step(x_max - x_min, 8);

  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto sx = [&](double x) { return kLeft + (x - x_min) / (x_max - x_min) * pw; };
  auto sy = [&](double y) { return kTop + (1.0 - (y - y_min) / (y_max - y_min)) * ph; };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << kWidth / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">"
      << escape(title) << "</text>\n";
  // Grid and tick labels.
  for (double y = y_min; y <= y_max + y_step / 2; y += y_step) {
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + pw << "\" y1=\"" << sy(y) << "\" y2=\""
        << sy(y) << "\" stroke=\"#e0e0e0\"/>\n";
    svg << "<text x=\"" << kLeft - 6 << "\" y=\"" << sy(y) + 4 << "\" text-anchor=\"end\">"
        << fmt(std::round(y / y_step) * y_step) << "</text>\n";
  }
  for (double x = std::ceil(x_min / x_step) * x_step; x <= x_max; x += x_step) {
    svg << "<line x1=\"" << sx(x) << "\" x2=\"" << sx(x) << "\" y1=\"" << kTop << "\" y2=\""
        << kTop + ph << "\" stroke=\"#f0f0f0\"/>\n";
    svg << "<text x=\"" << sx(x) << "\" y=\"" << kTop + ph + 16 << "\" text-anchor=\"middle\">"
        << fmt(x) << "</text>\n";
  }
  svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#444\"/>\n";
  svg << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kHeight - 10 << "\" text-anchor=\"middle\">"
      << escape(x_label) << "</text>\n";
  svg << "<text transform=\"translate(16," << kTop + ph / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(y_label) << "</text>\n";
  // Curves (a series with one point is drawn as a dot) and the legend.
  double legend_y = kTop + 16;
  for (const auto& s : series) {
    std::ostringstream path;
    bool first = true;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      path << (first ? "M" : " L") << sx(x) << "," << sy(y);
      first = false;
      if (s.points.size() <= 40) {
        svg << "<circle cx=\"" << sx(x) << "\" cy=\"" << sy(y) << "\" r=\"3\" fill=\"" << s.color
            << "\"/>\n";
      }
    }
    if (!first) {
      svg << "<path d=\"" << path.str() << "\" fill=\"none\" stroke=\"" << s.color
          << "\" stroke-width=\"1.6\"/>\n";
    }
    svg << "<line x1=\"" << kLeft + pw - 150 << "\" x2=\"" << kLeft + pw - 128 << "\" y1=\""
        << legend_y - 4 << "\" y2=\"" << legend_y - 4 << "\" stroke=\"" << s.color
        << "\" stroke-width=\"3\"/>\n";
    svg << "<text x=\"" << kLeft + pw - 122 << "\" y=\"" << legend_y << "\">" << escape(s.name)
        << "</text>\n";
    legend_y += 18;
  }
  svg << "</svg>\n";
  return svg.str();
}

void write_loss_plot(const std::string& metrics_path, const std::string& svg_path,
                     const std::string& title) {
  Series train{"train loss", "#1f77b4", {}};
  Series val{"validation loss", "#d62728", {}};
  for (const auto& r : read_metrics(metrics_path)) {
    if (!r.contains("step") || !r.contains("loss") || !r.contains("kind")) continue;
    auto point = std::make_pair(r["step"].get<double>(), r["loss"].get<double>());
    if (r["kind"] == "train") train.points.push_back(point);
    if (r["kind"] == "val") val.points.push_back(point);
  }
  // A resumed run appends to the same file: keep the last value logged for each step.
  for (auto* s : {&train, &val}) {
    std::stable_sort(s->points.begin(), s->points.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::pair<double, double>> unique;
    for (const auto& p : s->points) {
      if (!unique.empty() && unique.back().first == p.first)
        unique.back() = p;
      else
        unique.push_back(p);
    }
    s->points = std::move(unique);
  }
  std::ofstream out(svg_path);
  if (!out) TDIST_THROW(tdist::Error, "plot: cannot write '" + svg_path + "'");
  out << render_svg({train, val}, title);
}

}  // namespace gpt
