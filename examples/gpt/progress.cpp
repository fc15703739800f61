#include "gpt/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>

namespace gpt {

ProgressBar::ProgressBar(std::ostream& out, bool tty, int64_t plain_every)
    : out_(out), tty_(tty), plain_every_(plain_every < 1 ? 1 : plain_every) {}

bool ProgressBar::stdout_is_tty() {
  const char* term = std::getenv("TERM");
  return isatty(STDOUT_FILENO) != 0 && !(term != nullptr && std::strcmp(term, "dumb") == 0);
}

std::string ProgressBar::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60));
  return buf;
}

std::string ProgressBar::format_bytes(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1fG", b / (1024.0 * 1024 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.0fM", b / (1024.0 * 1024));
  return buf;
}

std::string ProgressBar::format_rate(double per_s) {
  char buf[32];
  if (per_s >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", per_s / 1e6);
  else if (per_s >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", per_s);
  return buf;
}

std::string ProgressBar::status_text(const ProgressState& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "loss %.4f | lr %.2e | %s tok/s | ETA %s", s.loss, s.lr,
                format_rate(s.tokens_per_s).c_str(), format_duration(s.eta_s).c_str());
  std::string text = buf;
  if (!s.rank_memory_bytes.empty()) {
    text += " | mem";
    for (size_t r = 0; r < s.rank_memory_bytes.size(); ++r) {
      text += (r == 0 ? " " : "/") + format_bytes(s.rank_memory_bytes[r]);
    }
  }
  return text;
}

void ProgressBar::update(const ProgressState& state) {
  last_ = state;
  if (tty_) {
    redraw();
    return;
  }
  if (state.step % plain_every_ == 0 || state.step == state.total || state.step == 1) {
    out_ << "step " << state.step << "/" << state.total << " | " << status_text(state) << "\n";
    out_.flush();
  }
}

void ProgressBar::redraw() {
  constexpr int kBarWidth = 24;
  const double frac = last_.total > 0 ? static_cast<double>(last_.step) / last_.total : 0.0;
  const int filled = static_cast<int>(frac * kBarWidth);
  std::string bar(kBarWidth, ' ');
  for (int i = 0; i < kBarWidth; ++i) bar[i] = i < filled ? '#' : '.';
  char head[96];
  std::snprintf(head, sizeof head, "step %lld/%lld [%s] %3.0f%% | ",
                static_cast<long long>(last_.step), static_cast<long long>(last_.total),
                bar.c_str(), frac * 100.0);
  out_ << "\r\033[K" << head << status_text(last_);
  out_.flush();
  drawn_ = true;
}

void ProgressBar::message(const std::string& line) {
  if (tty_ && drawn_) out_ << "\r\033[K";
  out_ << line << "\n";
  if (tty_ && drawn_) redraw();
  out_.flush();
}

void ProgressBar::finish() {
  if (tty_ && drawn_) out_ << "\n";
  drawn_ = false;
  out_.flush();
}

}  // namespace gpt
