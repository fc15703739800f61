// The data-only Object format: round trips and strict rejection of malformed bytes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tdist/comm/object.h"
#include "tdist/error.h"

namespace tdist {
namespace {

Object sample() {
  Object::Dict inner{{"lr", 0.125}, {"name", "layer.3"}, {"none", Object()}};
  Object::List list{Object(true),
                    Object(int64_t{-7}),
                    Object(2.5),
                    Object("x"),
                    Object(torch::arange(6, torch::kFloat32).view({2, 3})),
                    Object(inner)};
  return Object(Object::Dict{{"list", Object(list)},
                             {"bf16", Object(torch::ones({3}, torch::kBFloat16))},
                             {"flags", Object(torch::tensor({true, false, true}))},
                             {"empty", Object(torch::empty({0, 4}, torch::kInt64))},
                             {"step", Object(int64_t{1} << 40)}});
}

TEST(ObjectFormat, RoundTripsEveryKind) {
  Object value = sample();
  auto bytes = serialize_object(value);
  Object back = deserialize_object(bytes);
  EXPECT_TRUE(back == value);
  EXPECT_EQ(back.at("step").as_int(), int64_t{1} << 40);
  EXPECT_EQ(back.at("list").as_list()[3].as_string(), "x");
  EXPECT_TRUE(back.at("list").as_list()[4].as_tensor().equal(
      torch::arange(6, torch::kFloat32).view({2, 3})));
  EXPECT_EQ(back.at("bf16").as_tensor().scalar_type(), torch::kBFloat16);
}

TEST(ObjectFormat, NonContiguousTensorsAreSentAsTheirValues) {
  at::Tensor t = torch::arange(12, torch::kInt32).view({3, 4}).t();
  Object back = deserialize_object(serialize_object(Object(t)));
  EXPECT_TRUE(back.as_tensor().equal(t));
}

TEST(ObjectFormat, AccessorsNameTheKind) {
  Object v("text");
  try {
    v.as_int();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("expected int but it holds string"), std::string::npos);
  }
}

TEST(ObjectFormat, EveryTruncationIsRejected) {
  auto bytes = serialize_object(sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THROW(deserialize_object(bytes.data(), n), InvalidArgument) << "length " << n;
  }
}

TEST(ObjectFormat, CorruptHeadersTagsAndLengthsAreRejected) {
  auto good = serialize_object(Object(Object::List{Object("abc"), Object(1)}));
  auto expect_error = [](std::vector<uint8_t> b, const std::string& fragment) {
    try {
      deserialize_object(b);
      ADD_FAILURE() << "accepted corrupt input (" << fragment << ")";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  auto b = good;
  b[0] = 'X';
  expect_error(b, "magic");
  b = good;
  b[4] = 9;
  expect_error(b, "version");
  b = good;
  b[5] = 42;
  expect_error(b, "unknown tag");
  b = good;
  b.push_back(0);
  expect_error(b, "trailing");
  b = good;
  for (int i = 0; i < 8; ++i) b[6 + i] = 0xff;  // list length 2^64-1
  expect_error(b, "exceeds");
  // A pickle stream is not accepted as an object.
  expect_error({0x80, 0x04, 0x95, 0x10, 0x00, 0x00, 0x00, 0x00, 0x8c, 0x05}, "magic");
}

TEST(ObjectFormat, TensorByteCountMustMatchShape) {
  auto bytes = serialize_object(Object(torch::ones({2}, torch::kFloat32)));
  // Header(5) tag(1) dtype(1) ndim(1) dim(8) -> nbytes at offset 16.
  bytes[16] = 4;
  EXPECT_THROW(deserialize_object(bytes), InvalidArgument);
}

TEST(ObjectFormat, DeepNestingIsRejectedNotOverflowed) {
  std::vector<uint8_t> b{'T', 'D', 'O', 'B', 1};
  for (int i = 0; i < 100000; ++i) {
    b.push_back(6);  // list of one element
    for (int k = 0; k < 8; ++k) b.push_back(k == 0 ? 1 : 0);
  }
  b.push_back(0);
  EXPECT_THROW(deserialize_object(b), InvalidArgument);
}

}  // namespace
}  // namespace tdist
