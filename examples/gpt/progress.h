#pragma once

// The rank-0 progress display. On a terminal: one line redrawn in place
//   step 120/300 [#########.........]  40% | loss 2.134 | 9.8k tok/s | ETA 1m12s | mem 180M 176M
// Elsewhere (a pipe, a log file, CI): one plain line every `plain_every` steps, no escapes.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace gpt {

struct ProgressState {
  int64_t step = 0;  ///< steps completed
  int64_t total = 0;
  double loss = 0.0;
  double lr = 0.0;
  double tokens_per_s = 0.0;
  double eta_s = 0.0;
  std::vector<int64_t> rank_memory_bytes;  ///< resident memory of each rank
};

class ProgressBar {
 public:
  /// tty: draw in place; otherwise print a plain line every plain_every steps (and the last).
  ProgressBar(std::ostream& out, bool tty, int64_t plain_every);
  /// True when stdout is a terminal and TERM is not "dumb".
  static bool stdout_is_tty();

  void update(const ProgressState& state);
  /// Prints a line above the bar (e.g. a validation result) without breaking it.
  void message(const std::string& line);
  /// Ends the bar's line.
  void finish();

  static std::string format_duration(double seconds);  // "1m12s", "45s", "2h03m"
  static std::string format_bytes(int64_t bytes);      // "180M", "1.2G"
  static std::string format_rate(double per_s);        // "9.8k"
  /// The text of one status line (without bar), shared by both modes.
  static std::string status_text(const ProgressState& state);

 private:
  void redraw();
  std::ostream& out_;
  bool tty_;
  int64_t plain_every_;
  bool drawn_ = false;
  ProgressState last_;
};

}  // namespace gpt
