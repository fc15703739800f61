// Unit tests of the GPT example's parts: tokenizer, schedule, model, sampler, generation,
// plot and progress formatting.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gpt/corpus.h"
#include "gpt/generate.h"
#include "gpt/model.h"
#include "gpt/plot.h"
#include "gpt/progress.h"
#include "gpt/schedule.h"
#include "gpt/tokenizer.h"
#include "gpt/trace.h"
#include "tdist/error.h"

namespace {

gpt::ModelConfig tiny_model() {
  gpt::ModelConfig c;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

TEST(GptTokenizer, RoundTripsEveryByte) {
  gpt::ByteTokenizer tok;
  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  text += "In the beginning God created the heaven and the earth.\n";
  auto ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[65], 65);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.vocab_size(), 256);
}

TEST(GptTokenizer, RejectsOutOfRangeIds) {
  gpt::ByteTokenizer tok;
  EXPECT_THROW(tok.decode({65, 256}), tdist::InvalidArgument);
  EXPECT_THROW(tok.decode({-1}), tdist::InvalidArgument);
}

TEST(GptSchedule, WarmupThenCosineToMin) {
  gpt::LrSchedule s{/*max_lr=*/1.0, /*min_lr=*/0.1, /*warmup_steps=*/10, /*total_steps=*/110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);                // cosine starts at the peak
  EXPECT_NEAR(s.at(60), (1.0 + 0.1) / 2, 1e-12);  // halfway down
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.1);
  for (int64_t i = 11; i < 110; ++i) EXPECT_LE(s.at(i), s.at(i - 1)) << i;
}

TEST(GptSchedule, NoWarmupStartsAtPeak) {
  gpt::LrSchedule s{2.0, 0.0, 0, 10};
  EXPECT_DOUBLE_EQ(s.at(0), 2.0);
  EXPECT_NEAR(s.at(5), 1.0, 1e-12);
}

TEST(GptSchedule, ValidateNamesTheFlag) {
  gpt::LrSchedule s{1.0, 2.0, 10, 100};
  try {
    s.validate();
    FAIL() << "min_lr > max_lr accepted";
  } catch (const tdist::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--min-lr"), std::string::npos) << e.what();
  }
  s = {1.0, 0.1, 200, 100};
  EXPECT_THROW(s.validate(), tdist::InvalidArgument);
}

TEST(GptModel, ShapesAndParameterCount) {
  for (bool tied : {true, false}) {
    auto config = tiny_model();
    config.tie_weights = tied;
    torch::manual_seed(0);
    gpt::GPT model(config);
    int64_t count = 0;
    for (const auto& p : model->parameters()) count += p.numel();
    EXPECT_EQ(count, config.num_parameters()) << "tied=" << tied;
    auto logits = model->forward(torch::randint(0, 256, {3, 16}, torch::kLong));
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 16, 256}));
  }
}

TEST(GptModel, IsCausal) {
  torch::manual_seed(0);
  gpt::GPT model(tiny_model());
  model->eval();
  torch::NoGradGuard no_grad;
  auto idx = torch::randint(0, 256, {1, 12}, torch::kLong);
  auto changed = idx.clone();
  changed[0][8] = (changed[0][8].item<int64_t>() + 1) % 256;
  auto a = model->forward(idx), b = model->forward(changed);
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::allclose(a.index({Slice(), Slice(0, 8)}), b.index({Slice(), Slice(0, 8)})));
  EXPECT_FALSE(torch::allclose(a.index({Slice(), Slice(8, 12)}), b.index({Slice(), Slice(8, 12)})));
}

TEST(GptModel, RejectsBadConfig) {
  auto config = tiny_model();
  config.n_embd = 17;
  EXPECT_THROW(config.validate(), tdist::InvalidArgument);
  EXPECT_THROW(gpt::GPT{config}, tdist::InvalidArgument);
  torch::manual_seed(0);
  gpt::GPT model(tiny_model());
  EXPECT_THROW(model->forward(torch::zeros({1, 17}, torch::kLong)), tdist::InvalidArgument);
}

TEST(GptSampler, RanksSplitTheWorldOneBatch) {
  auto tokens = torch::arange(5000, torch::kLong);
  const int64_t block = 8, batch = 3;
  gpt::BatchSampler whole(tokens, block, batch * 2, 0, 1, 7);
  gpt::BatchSampler r0(tokens, block, batch, 0, 2, 7), r1(tokens, block, batch, 1, 2, 7);
  auto w = whole.get(5, 0), a = r0.get(5, 0), b = r1.get(5, 0);
  EXPECT_EQ(a.x.sizes(), (std::vector<int64_t>{batch, block}));
  // rank r holds rows r, r + 2, r + 4 of the world-1 batch
  for (int64_t i = 0; i < batch; ++i) {
    EXPECT_TRUE(torch::equal(a.x[i], w.x[2 * i]));
    EXPECT_TRUE(torch::equal(b.x[i], w.x[2 * i + 1]));
  }
  EXPECT_TRUE(torch::equal(a.y.select(1, 0), a.x.select(1, 1)));  // targets shifted by one
  EXPECT_TRUE(torch::equal(r0.get(5, 0).x, a.x));                 // deterministic
  EXPECT_FALSE(torch::equal(r0.get(6, 0).x, a.x));                // new step, new windows
  // grad_accum 2: micro-step m holds rows m * batch .. of the same global batch
  gpt::BatchSampler accum(tokens, block, batch, 0, 1, 7, /*grad_accum=*/2);
  for (int64_t i = 0; i < batch; ++i) {
    EXPECT_TRUE(torch::equal(accum.get(5, 0).x[i], w.x[i]));
    EXPECT_TRUE(torch::equal(accum.get(5, 1).x[i], w.x[batch + i]));
  }
  EXPECT_THROW(accum.get(5, 2), tdist::InvalidArgument);
}

TEST(GptCorpus, SplitsTrainAndValidation) {
  std::string text(10000, 'a');
  auto corpus = gpt::Corpus::from_text(text, 0.1, 16);
  EXPECT_EQ(corpus.train().numel() + corpus.val().numel(), 10000);
  EXPECT_EQ(corpus.val().numel(), 1000);
  EXPECT_THROW(gpt::Corpus::from_text("short", 0.1, 16), tdist::InvalidArgument);
  EXPECT_THROW(gpt::Corpus("/nonexistent/corpus.txt", 0.1, 16), tdist::InvalidArgument);
}

TEST(GptGenerate, DeterministicForAFixedSeed) {
  torch::manual_seed(0);
  gpt::GPT model(tiny_model());
  gpt::SampleOptions options;
  options.max_new_tokens = 40;  // longer than block_size: exercises the cropping
  options.temperature = 1.0;
  options.top_k = 0;
  options.seed = 42;
  auto a = gpt::generate(model, "And God", options);
  auto b = gpt::generate(model, "And God", options);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(a, b);
  options.seed = 43;
  EXPECT_NE(gpt::generate(model, "And God", options), a);
  EXPECT_TRUE(model->is_training());  // restored
}

TEST(GptGenerate, TopKOneIsGreedy) {
  torch::manual_seed(0);
  gpt::GPT model(tiny_model());
  gpt::SampleOptions options;
  options.max_new_tokens = 10;
  options.top_k = 1;
  options.seed = 1;
  auto a = gpt::generate(model, "x", options);
  options.seed = 2;
  EXPECT_EQ(gpt::generate(model, "x", options), a);
  options.temperature = 0.0;
  EXPECT_THROW(gpt::generate(model, "x", options), tdist::InvalidArgument);
}

TEST(GptPlot, RendersCurvesAndLegend) {
  gpt::Series train{"train loss", "#1f77b4", {{1, 5.5}, {2, 4.0}, {3, 3.1}}};
  gpt::Series val{"validation loss", "#d62728", {{0, 5.6}, {3, 3.3}}};
  auto svg = gpt::render_svg({train, val}, "title <&>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("<path d=\"M"), std::string::npos);
  EXPECT_NE(svg.find("validation loss"), std::string::npos);
  EXPECT_NE(svg.find("title &lt;&amp;&gt;"), std::string::npos);
  EXPECT_NO_THROW(gpt::render_svg({}, "empty"));
}

TEST(GptProgress, PlainLinesWithoutTerminal) {
  std::ostringstream out;
  gpt::ProgressBar bar(out, /*tty=*/false, /*plain_every=*/5);
  for (int64_t s = 1; s <= 12; ++s) {
    gpt::ProgressState state;
    state.step = s;
    state.total = 12;
    state.loss = 2.5;
    state.tokens_per_s = 12345;
    state.eta_s = 75;
    state.rank_memory_bytes = {200 << 20, 190 << 20};
    bar.update(state);
  }
  bar.finish();
  const std::string text = out.str();
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\033'), std::string::npos);
  EXPECT_NE(text.find("step 1/12"), std::string::npos);
  EXPECT_NE(text.find("step 5/12"), std::string::npos);
  EXPECT_NE(text.find("step 12/12"), std::string::npos);
  EXPECT_EQ(text.find("step 7/12"), std::string::npos);
  EXPECT_NE(text.find("12.3k tok/s"), std::string::npos);
  EXPECT_NE(text.find("mem 200M/190M"), std::string::npos);
  EXPECT_NE(text.find("ETA 1m15s"), std::string::npos);
}

TEST(GptProgress, TerminalRedrawsInPlace) {
  std::ostringstream out;
  gpt::ProgressBar bar(out, /*tty=*/true, 1);
  gpt::ProgressState state;
  state.step = 3;
  state.total = 6;
  bar.update(state);
  bar.message("step 3: validation loss 2.0");
  bar.finish();
  EXPECT_NE(out.str().find("\r\033[K"), std::string::npos);
  EXPECT_NE(out.str().find("[############............]  50%"), std::string::npos);
  EXPECT_NE(out.str().find("validation loss 2.0\n"), std::string::npos);
}

TEST(GptTrace, WritesChromeTraceEvents) {
  gpt::Tracer tracer(3);
  { gpt::TraceSpan span(tracer, "forward"); }
  tracer.add_span("all_gather", "comm", 10, 30, 1);
  EXPECT_EQ(tracer.size(), 2u);
  auto path = std::string(::testing::TempDir()) + "/gpt_trace_test.json";
  tracer.write(path);
  std::ifstream in(path);
  auto json = nlohmann::json::parse(in);
  int spans = 0;
  for (const auto& e : json["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans;
      EXPECT_EQ(e["pid"], 3);
    }
  }
  EXPECT_EQ(spans, 2);
  gpt::Tracer off(0, /*enabled=*/false);
  off.add_span("x", "y", 0, 1);
  EXPECT_EQ(off.size(), 0u);
}

}  // namespace
