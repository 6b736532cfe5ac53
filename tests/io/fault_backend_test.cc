// Faults under the Engine: short transfers, EAGAIN, EINTR are retried to a complete, byte-exact
// result; EIO and ENOSPC fail the request with a status naming file, offset, length and errno;
// never a silent success.
#include "io/fault_backend.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <gtest/gtest.h>

#include "tests/io/io_test_env.h"

namespace zinf::io {
namespace {

using zinf::testing::FillRandom;
using zinf::testing::TempDir;

constexpr uint64_t kBytes = 8 << 20;

class FaultTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    auto raw = testing_env::MakeRawBackend(GetParam(), 8);
    if (!raw.ok()) GTEST_SKIP() << "engine refused here: " << raw.status().ToString();
    auto fb = std::make_unique<FaultInjectingBackend>(std::move(raw).value(), nullptr);
    faults_ = fb.get();
    engine_ = Engine::WithBackend(std::move(fb),
                                  {.block_size = 256 << 10, .queue_depth = 8, .max_retries = 50});
    auto swap = SwapFile::Create({.dirs = {dir_.path()}, .size = kBytes});
    ASSERT_TRUE(swap.ok()) << swap.status().ToString();
    swap_ = std::move(swap).value();
    file_ = *engine_->AddFile(swap_->Layout());
    buf_ = std::move(AlignedBuffer::Allocate(kBytes, swap_->mem_align())).value();
    want_.resize(kBytes);
    FillRandom(want_.data(), kBytes, 5);
  }

  Status WriteWant() {
    std::memcpy(buf_.data(), want_.data(), kBytes);
    return engine_->Write(file_, 0, buf_.data(), kBytes);
  }

  TempDir dir_;
  FaultInjectingBackend* faults_ = nullptr;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<SwapFile> swap_;
  FileId file_ = 0;
  AlignedBuffer buf_;
  std::vector<uint8_t> want_;
};

TEST_P(FaultTest, ShortTransfersAndRetriesGiveTheCompleteResult) {
  faults_->set_rule(RandomFaults({.p_short = 0.3, .p_eagain = 0.15, .p_eintr = 0.1,
                                  .align = swap_->offset_align(), .seed = 11, .only = std::nullopt}));
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(WriteWant().ok());
    std::memset(buf_.data(), 0, kBytes);
    Status s = engine_->Read(file_, 0, buf_.data(), kBytes);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(0, std::memcmp(buf_.data(), want_.data(), kBytes)) << "round " << round;
  }
  FaultCounts c = faults_->counts();
  EngineStats st = engine_->stats();
  // The test is only meaningful if faults really happened and were handled.
  EXPECT_GT(c.shorts, 5u);
  EXPECT_GT(c.eagain, 2u);
  EXPECT_GT(c.eintr, 1u);
  EXPECT_EQ(st.short_transfers, c.shorts);
  EXPECT_EQ(st.retries, c.eagain + c.eintr);
  EXPECT_EQ(st.failed_requests, 0u);
}

TEST_P(FaultTest, EioOnWriteFailsTheRequestAndNamesIt) {
  ASSERT_TRUE(WriteWant().ok());
  const uint64_t bad_offset = 3 * (256 << 10);
  faults_->set_rule([&](const Piece& p) -> Fault {
    if (p.op == OpKind::kWrite && p.offset == bad_offset) return {Fault::kErrno, EIO, 0};
    return {};
  });
  std::vector<uint8_t> fresh(kBytes);
  FillRandom(fresh.data(), kBytes, 6);
  std::memcpy(buf_.data(), fresh.data(), kBytes);
  Status s = engine_->Write(file_, 0, buf_.data(), kBytes);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.errno_value(), EIO);
  EXPECT_NE(s.message().find(swap_->members()[0]->path()), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset " + std::to_string(bad_offset)), std::string::npos);
  EXPECT_NE(s.message().find("length 262144"), std::string::npos);
  EXPECT_EQ(engine_->requests_in_flight(), 0u);
  // The failed piece really was not written: the old bytes are still there.
  faults_->set_rule(nullptr);
  std::memset(buf_.data(), 0, kBytes);
  ASSERT_TRUE(engine_->Read(file_, 0, buf_.data(), kBytes).ok());
  EXPECT_EQ(0, std::memcmp(buf_.data() + bad_offset, want_.data() + bad_offset, 256 << 10));
}

TEST_P(FaultTest, EnospcFailsWithResourceExhausted) {
  faults_->set_rule([](const Piece& p) -> Fault {
    return p.op == OpKind::kWrite ? Fault{Fault::kErrno, ENOSPC, 0} : Fault{};
  });
  Status s = WriteWant();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.errno_value(), ENOSPC);
}

TEST_P(FaultTest, EndlessEagainGivesUpInsteadOfHanging) {
  faults_->set_rule([](const Piece&) { return Fault{Fault::kErrno, EAGAIN, 0}; });
  Status s = engine_->Read(file_, 0, buf_.data(), 256 << 10);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.errno_value(), EAGAIN);
  EXPECT_EQ(faults_->counts().eagain, 51u);  // the first try and 50 retries
}

TEST_P(FaultTest, ErrorInOnePieceOfManyFailsTheWholeRequestOnce) {
  ASSERT_TRUE(WriteWant().ok());
  int calls = 0;
  Status got;
  faults_->set_rule([](const Piece& p) -> Fault {
    return p.offset == (5u << 20) ? Fault{Fault::kErrno, EIO, 0} : Fault{};
  });
  ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, 0, buf_.data(), kBytes},
                              [&](const Status& s) { calls++; got = s; }).ok());
  ASSERT_TRUE(engine_->Drain().ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(got.errno_value(), EIO);
}

TEST_P(FaultTest, TruncatedFileReadsAsOutOfRangeNotSuccess) {
  ASSERT_TRUE(WriteWant().ok());
  ASSERT_EQ(ftruncate(swap_->members()[0]->fd(), kBytes / 2), 0);
  Status s = engine_->Read(file_, 0, buf_.data(), kBytes);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("end of file"), std::string::npos) << s.message();
}

INSTANTIATE_TEST_SUITE_P(AllEngines, FaultTest, ::testing::ValuesIn(testing_env::AllKinds()),
                         testing_env::KindName);

}  // namespace
}  // namespace zinf::io
