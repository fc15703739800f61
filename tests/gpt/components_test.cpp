// Unit tests of the trainer's parts: schedule, the packed data loader and
// token files, the model spec, plot and progress formatting.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gpt/dataset.h"
#include "gpt/model_spec.h"
#include "gpt/plot.h"
#include "gpt/progress.h"
#include "gpt/schedule.h"
#include "gpt/trace.h"
#include "tdist/error.h"

namespace {

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

std::set<std::vector<int64_t>> rows_of(const torch::Tensor& x) {
  std::set<std::vector<int64_t>> rows;
  for (int64_t i = 0; i < x.size(0); ++i) {
    auto row = x[i].contiguous();
    rows.insert(
        std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()));
  }
  return rows;
}

// The sequences step `position` consumes over all ranks and micro-steps.
std::set<std::vector<int64_t>> global_batch(const torch::Tensor& tokens, int world, int64_t accum,
                                            int64_t position, int64_t batch) {
  std::set<std::vector<int64_t>> all;
  for (int r = 0; r < world; ++r) {
    gpt::PackedLoader loader(tokens, 8, batch, r, world, accum, 7, /*shuffle=*/true);
    for (int64_t m = 0; m < accum; ++m) {
      auto rows = rows_of(loader.get(position, m).x);
      for (const auto& row : rows)
        EXPECT_TRUE(all.insert(row).second) << "rank " << r << " repeats a row";
    }
  }
  return all;
}

TEST(GptPackedLoader, RanksReadDisjointSharesOfOneGlobalBatch) {
  auto tokens = torch::arange(5001, torch::kLong);
  // 12 sequences a step whether 1 rank x 12, 2 x 6, 3 x 4 or 3 ranks x 2 micro-steps x 2
  auto one = global_batch(tokens, 1, 1, 24, 12);
  EXPECT_EQ(one.size(), 12u);
  EXPECT_EQ(global_batch(tokens, 2, 1, 24, 6), one);
  EXPECT_EQ(global_batch(tokens, 3, 1, 24, 4), one);
  EXPECT_EQ(global_batch(tokens, 3, 2, 24, 2), one);
  EXPECT_NE(global_batch(tokens, 1, 1, 36, 12), one);  // the next step reads other sequences
}

TEST(GptPackedLoader, TargetsAreInputsShiftedByOne) {
  auto tokens = torch::arange(1001, torch::kLong);
  gpt::PackedLoader loader(tokens, 8, 4, 0, 1, 1, 3, true);
  auto b = loader.get(0, 0);
  EXPECT_EQ(b.x.sizes(), (std::vector<int64_t>{4, 8}));
  EXPECT_TRUE(torch::equal(b.y, b.x + 1));  // arange: the next token is id + 1
  // packed sequences start at multiples of block_size
  EXPECT_TRUE(torch::equal(b.x.select(1, 0).remainder(8), torch::zeros({4}, torch::kLong)));
  EXPECT_TRUE(torch::equal(loader.get(0, 0).x, b.x));  // deterministic
}

TEST(GptPackedLoader, EachEpochVisitsEverySequenceOnceInANewOrder) {
  auto tokens = torch::arange(8 * 10 + 1, torch::kLong);
  gpt::PackedLoader loader(tokens, 8, 5, 0, 1, 1, 11, true);
  ASSERT_EQ(loader.num_sequences(), 10);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t pos : {0, 5}) {
    auto x = loader.get(pos, 0).x.select(1, 0);
    for (int64_t i = 0; i < 5; ++i) epoch0.push_back(x[i].item<int64_t>());
  }
  for (int64_t pos : {10, 15}) {
    auto x = loader.get(pos, 0).x.select(1, 0);
    for (int64_t i = 0; i < 5; ++i) epoch1.push_back(x[i].item<int64_t>());
  }
  auto sorted0 = epoch0, sorted1 = epoch1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < 10; ++i) starts.push_back(8 * i);
  EXPECT_EQ(sorted0, starts);
  EXPECT_EQ(sorted1, starts);
  EXPECT_NE(epoch0, epoch1);
  gpt::PackedLoader in_order(tokens, 8, 5, 0, 1, 1, 11, /*shuffle=*/false);
  EXPECT_TRUE(
      torch::equal(in_order.get(0, 0).x.select(1, 0), torch::arange(0, 40, 8, torch::kLong)));
}

TEST(GptPackedLoader, RefusesTooFewTokensAndBadMicroSteps) {
  try {
    gpt::PackedLoader(torch::arange(8, torch::kLong), 8, 1, 0, 1, 1, 0, true);
    FAIL() << "8 tokens accepted for block_size 8";
  } catch (const tdist::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--block-size"), std::string::npos) << e.what();
  }
  gpt::PackedLoader loader(torch::arange(100, torch::kLong), 8, 1, 0, 1, 2, 0, true);
  EXPECT_THROW(loader.get(0, 2), tdist::InvalidArgument);
}

std::string write_file(const std::string& name, const std::string& bytes) {
  auto path = std::string(::testing::TempDir()) + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(GptTokenFile, ReadsBothWidthsLittleEndian) {
  const std::string u16("\x01\x00\x02\x01\xff\x00", 6);
  auto ids = gpt::read_token_file(write_file("t.bin", u16), gpt::DataFormat::kUint16, 300);
  EXPECT_TRUE(torch::equal(ids, torch::tensor({1, 258, 255}, torch::kLong)));
  const std::string u32("\x05\x00\x00\x00\x00\x00\x01\x00", 8);
  ids = gpt::read_token_file(write_file("t.u32", u32), gpt::DataFormat::kUint32, 70000);
  EXPECT_TRUE(torch::equal(ids, torch::tensor({5, 65536}, torch::kLong)));
  EXPECT_EQ(gpt::format_of("a/train.bin", gpt::DataFormat::kAuto), gpt::DataFormat::kUint16);
  EXPECT_EQ(gpt::format_of("a/train.u32", gpt::DataFormat::kAuto), gpt::DataFormat::kUint32);
  EXPECT_EQ(gpt::format_of("a/train.txt", gpt::DataFormat::kAuto), gpt::DataFormat::kText);
  EXPECT_EQ(gpt::format_of("a/train.txt", gpt::DataFormat::kUint32), gpt::DataFormat::kUint32);
  EXPECT_THROW(gpt::parse_data_format("int8"), tdist::InvalidArgument);
}

TEST(GptTokenFile, NamesTheFileAndTheProblem) {
  auto odd = write_file("odd.bin", std::string("\x01\x00\x02", 3));
  try {
    gpt::read_token_file(odd, gpt::DataFormat::kUint16, 300);
    FAIL() << "3 bytes read as uint16";
  } catch (const tdist::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("odd.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 bytes"), std::string::npos) << e.what();
  }
  auto big = write_file("big.bin", std::string("\x01\x00\x2c\x01", 4));  // 1, 300
  try {
    gpt::read_token_file(big, gpt::DataFormat::kUint16, 300);
    FAIL() << "id 300 accepted for a vocabulary of 300";
  } catch (const tdist::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("token 1 is 300"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpt::read_token_file("/nonexistent.bin", gpt::DataFormat::kUint16, 10),
               tdist::InvalidArgument);
}

TEST(GptTokenCache, NameFollowsTheContents) {
  auto text = write_file("doc.txt", "In the beginning");
  auto tok = write_file("tok.json", "{}");
  const auto dir = std::string(::testing::TempDir());
  auto a = gpt::token_cache_path(dir, text, tok, 1);
  EXPECT_EQ(gpt::token_cache_path(dir, text, tok, 1), a);
  EXPECT_NE(gpt::token_cache_path(dir, text, tok, 2), a);
  EXPECT_NE(gpt::token_cache_path(dir, text, tok, std::nullopt), a);
  write_file("doc.txt", "In the beginning.");
  EXPECT_NE(gpt::token_cache_path(dir, text, tok, 1), a);
  EXPECT_EQ(std::filesystem::path(a).extension(), ".u32");
}

TEST(GptModelSpec, FlagsBecomeTheFamilysConfig) {
  gpt::ModelSpec spec;
  spec.family = "llama";
  spec.n_layer = 2;
  spec.n_head = 4;
  spec.n_kv_head = 2;
  spec.n_embd = 64;
  spec.block_size = 32;
  auto config = spec.resolve(500, 0, 1);
  EXPECT_EQ(config.vocab_size, 500);
  EXPECT_EQ(config.num_hidden_layers, 2);
  EXPECT_EQ(config.num_key_value_heads, 2);
  EXPECT_EQ(config.max_position_embeddings, 32);
  EXPECT_EQ(spec.to_hf_json(500, 0, 1)["model_type"], "llama");
  spec.family = "gpt2";
  spec.n_kv_head = 0;
  EXPECT_EQ(spec.to_hf_json(500, 0, 1)["model_type"], "gpt2");
  EXPECT_NO_THROW(spec.resolve(500, 0, 1));
  spec.family = "bert";
  try {
    spec.validate();
    FAIL() << "family bert accepted";
  } catch (const tdist::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--family"), std::string::npos) << e.what();
  }
  spec.family = "llama";
  spec.n_kv_head = 3;  // 4 heads do not split into 3 groups
  EXPECT_THROW(spec.validate(), tdist::InvalidArgument);
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
