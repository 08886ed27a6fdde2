#include "chunk/chunk_type.h"

#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "memory/dtype.h"

namespace ps {
namespace {

TEST(ChunkType, DTypes) {
  for (DType compute : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(ChunkDType(ChunkType::kParam, compute), compute);
    EXPECT_EQ(ChunkDType(ChunkType::kMaster, compute), DType::kF32);
    EXPECT_EQ(ChunkDType(ChunkType::kMomentum, compute), DType::kF32);
    EXPECT_EQ(ChunkDType(ChunkType::kVariance, compute), DType::kF32);
  }
}

TEST(ChunkType, ModelDataIs14BytesPerParamInHalfPrecisionAnd16InF32) {
  static_assert(ModelDataBytesPerParam(DType::kF16) == 14);
  static_assert(ModelDataBytesPerParam(DType::kBF16) == 14);
  static_assert(ModelDataBytesPerParam(DType::kF32) == 16);
}

TEST(ChunkType, OptimizerStateTypes) {
  EXPECT_FALSE(IsOptimizerState(ChunkType::kParam));
  EXPECT_TRUE(IsOptimizerState(ChunkType::kMaster));
  EXPECT_TRUE(IsOptimizerState(ChunkType::kMomentum));
  EXPECT_TRUE(IsOptimizerState(ChunkType::kVariance));
}

TEST(ChunkType, NamesAndIds) {
  EXPECT_EQ(ChunkTypeName(ChunkType::kParam), "param");
  EXPECT_EQ(ChunkTypeName(ChunkType::kVariance), "variance");
  EXPECT_EQ((ChunkId{ChunkType::kMomentum, 7}).ToString(), "momentum#7");
  std::ostringstream os;
  os << ChunkId{ChunkType::kMaster, 0};
  EXPECT_EQ(os.str(), "master#0");
  absl::flat_hash_set<ChunkId> ids;
  for (ChunkType t : kAllChunkTypes) {
    for (int64_t i = 0; i < 3; ++i) ids.insert(ChunkId{t, i});
  }
  EXPECT_EQ(ids.size(), 12u);
  EXPECT_TRUE((ChunkId{ChunkType::kParam, 5}) < (ChunkId{ChunkType::kMaster, 0}));
}

}  // namespace
}  // namespace ps
