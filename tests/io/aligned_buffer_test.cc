#include "io/aligned_buffer.h"

#include <cstdint>
#include <cstring>

#include <gtest/gtest.h>

namespace zinf::io {
namespace {

TEST(AlignedBufferTest, AlignedZeroedAndMovable) {
  for (size_t align : {512u, 4096u, 65536u, 1u << 21}) {
    auto b = AlignedBuffer::Allocate(100000, align);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % align, 0u);
    EXPECT_EQ(b->size(), 100000u);
    EXPECT_EQ(b->data()[99999], 0);
    std::memset(b->data(), 1, b->size());
    AlignedBuffer moved = std::move(b).value();
    EXPECT_EQ(moved.data()[5], 1);
  }
}

TEST(AlignedBufferTest, RefusesBadArguments) {
  EXPECT_FALSE(AlignedBuffer::Allocate(0).ok());
  EXPECT_FALSE(AlignedBuffer::Allocate(4096, 3000).ok());
}

}  // namespace
}  // namespace zinf::io
