// io::Engine when the kernel refuses a submit (io_uring_enter, io_submit) or a Prepare: through
// the real Engine over a FaultInjectingBackend wrapping a real backend. No request is ever
// lost: a hard refusal fails exactly the requests whose pieces the kernel did not take (their
// pieces never run), a transient one is retried with backoff, without the engine's lock, for a
// bounded time, and a refused Prepare reports its own error through Wait. Every test that could
// hang on a lost request runs its blocking part under a deadline.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "io/fault_backend.h"
#include "tests/io/io_test_env.h"

namespace zinf::io {
namespace {

using namespace std::chrono_literals;
using testing_env::WithinDeadline;
using zinf::testing::FillRandom;
using zinf::testing::TempDir;

constexpr uint64_t kBytes = 8 << 20;
constexpr uint64_t kBlock = 256 << 10;
constexpr auto kDeadline = 60s;

SubmitFault Refuse(int err) { return {SubmitFault::kErrno, 0, err}; }
SubmitFault Take(unsigned n) { return {SubmitFault::kTake, n, 0}; }

// A submit rule a test scripts as it goes: the next calls follow `steps`, later ones `then`.
class SubmitScript {
 public:
  void Set(std::deque<SubmitFault> steps, SubmitFault then = {}) {
    std::lock_guard lock(mu_);
    steps_ = std::move(steps);
    then_ = then;
  }
  SubmitRule Rule() {
    return [this](unsigned) {
      std::lock_guard lock(mu_);
      if (steps_.empty()) return then_;
      SubmitFault f = steps_.front();
      steps_.pop_front();
      return f;
    };
  }

 private:
  std::mutex mu_;
  std::deque<SubmitFault> steps_;
  SubmitFault then_;
};

class SubmitFaultTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    auto swap = SwapFile::Create({.dirs = {dir_.path()}, .size = kBytes});
    ASSERT_TRUE(swap.ok()) << swap.status().ToString();
    swap_ = std::move(swap).value();
    path_ = swap_->members()[0]->path();
    buf_ = std::move(AlignedBuffer::Allocate(kBytes, swap_->mem_align())).value();
    starter_ = std::move(AlignedBuffer::Allocate(kBlock, swap_->mem_align())).value();
    old_.resize(kBytes);
    fresh_.resize(kBytes);
    FillRandom(old_.data(), kBytes, 5);
    FillRandom(fresh_.data(), kBytes, 6);
    MakeEngine(10000);
  }

  void MakeEngine(unsigned submit_timeout_ms) {
    engine_.reset();
    auto raw = testing_env::MakeRawBackend(GetParam(), 8);
    if (!raw.ok()) GTEST_SKIP() << "engine refused here: " << raw.status().ToString();
    auto fb = std::make_unique<FaultInjectingBackend>(std::move(raw).value(), nullptr);
    faults_ = fb.get();
    ASSERT_TRUE(faults_->set_submit_rule(script_.Rule()));
    engine_ = Engine::WithBackend(std::move(fb), {.block_size = kBlock,
                                                  .queue_depth = 8,
                                                  .max_retries = 50,
                                                  .submit_timeout_ms = submit_timeout_ms});
    file_ = *engine_->AddFile(swap_->Layout());
  }

  // The whole file holds old_ (written with no fault).
  void WriteOld() {
    std::memcpy(buf_.data(), old_.data(), kBytes);
    ASSERT_TRUE(engine_->Write(file_, 0, buf_.data(), kBytes).ok());
  }

  // What the file holds now, read with no fault.
  std::vector<uint8_t> ReadBack() {
    script_.Set({});
    EXPECT_TRUE(faults_->set_submit_rule(script_.Rule()));
    faults_->set_rule(nullptr);
    std::memset(buf_.data(), 0, kBytes);
    Status s = engine_->Read(file_, 0, buf_.data(), kBytes);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return std::vector<uint8_t>(buf_.data(), buf_.data() + kBytes);
  }

  bool Same(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, uint64_t off,
            uint64_t len) {
    return std::memcmp(a.data() + off, b.data() + off, len) == 0;
  }

  // After any failure the engine must still work: a fresh round trip with no fault.
  void ExpectStillWorks() {
    script_.Set({});
    EXPECT_TRUE(faults_->set_submit_rule(script_.Rule()));
    faults_->set_rule(nullptr);
    FillRandom(buf_.data(), kBlock, 99);
    std::vector<uint8_t> want(buf_.data(), buf_.data() + kBlock);
    const uint64_t off = kBytes - kBlock;
    ASSERT_TRUE(engine_->Write(file_, off, buf_.data(), kBlock).ok());
    std::memset(buf_.data(), 0, kBlock);
    ASSERT_TRUE(engine_->Read(file_, off, buf_.data(), kBlock).ok());
    EXPECT_EQ(0, std::memcmp(buf_.data(), want.data(), kBlock));
    EXPECT_EQ(engine_->requests_in_flight(), 0u);
  }

  // Whether a refused submit withdraws the pieces not taken (uring, posix); libaio's io_submit
  // instead refuses its first iocb, which completes with the error, and goes on.
  bool Withdraws() const { return GetParam() != EngineKind::kAio; }

  TempDir dir_;
  SubmitScript script_;
  FaultInjectingBackend* faults_ = nullptr;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<SwapFile> swap_;
  std::string path_;
  FileId file_ = 0;
  AlignedBuffer buf_;
  AlignedBuffer starter_;  // what the starter request of a batch reads into
  std::vector<uint8_t> old_, fresh_;
};

// Regression: a failed submit was logged and forgotten; its pieces stayed counted in flight and
// Wait blocked forever in the kernel waiting for completions of SQEs never submitted.
TEST_P(SubmitFaultTest, AHardSubmitFailureFailsTheTicketInsteadOfHanging) {
  script_.Set({}, Refuse(EIO));
  std::memcpy(buf_.data(), fresh_.data(), 4 * kBlock);
  Status s;
  WithinDeadline(kDeadline, "Wait after a refused submit", [&] {
    auto t = engine_->Submit({OpKind::kWrite, file_, 0, buf_.data(), 4 * kBlock});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    s = engine_->Wait(*t);
  });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.errno_value(), EIO) << s.ToString();
  EXPECT_NE(s.message().find(path_), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset "), std::string::npos) << s.message();
  // aio: io_submit's error refuses its first iocb, which completes with it (nothing to withdraw).
  if (Withdraws()) {
    EXPECT_NE(s.message().find("never handed to the kernel"), std::string::npos) << s.message();
    EXPECT_EQ(engine_->stats().withdrawn_pieces, 4u);
  }
  EXPECT_GT(faults_->counts().submit_hard, 0u);
  EXPECT_EQ(engine_->stats().failed_requests, 1u);
  ExpectStillWorks();
}

TEST_P(SubmitFaultTest, AHardSubmitFailureRunsTheCallbackWithTheError) {
  script_.Set({}, Refuse(EIO));
  int calls = 0;
  Status got;
  WithinDeadline(kDeadline, "Drain after a refused submit", [&] {
    ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, kBlock, buf_.data(), 2 * kBlock},
                                [&](const Status& st) {
                                  calls++;
                                  got = st;
                                })
                    .ok());
    Status d = engine_->Drain();
    EXPECT_TRUE(d.ok()) << d.ToString();
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(got.errno_value(), EIO) << got.ToString();
  EXPECT_NE(got.message().find(path_), std::string::npos) << got.message();
  ExpectStillWorks();
}

TEST_P(SubmitFaultTest, TransientRefusalsAreRetriedToACompleteResult) {
  // EAGAIN, EBUSY, EINTR, EAGAIN, then a call that takes one piece of four, one more EAGAIN.
  script_.Set({Refuse(EAGAIN), Refuse(EBUSY), Refuse(EINTR), Refuse(EAGAIN), Take(1),
               Refuse(EAGAIN)});
  std::memcpy(buf_.data(), fresh_.data(), 4 * kBlock);
  Status s;
  WithinDeadline(kDeadline, "a write through transient refusals", [&] {
    s = engine_->Write(file_, 0, buf_.data(), 4 * kBlock);
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EngineStats st = engine_->stats();
  FaultCounts c = faults_->counts();
  EXPECT_EQ(c.submit_transient, 5u);
  EXPECT_EQ(c.submit_partial, 1u);
  EXPECT_EQ(st.submit_retries, 5u);
  EXPECT_EQ(st.withdrawn_pieces, 0u);
  EXPECT_EQ(st.failed_requests, 0u);
  std::vector<uint8_t> back = ReadBack();
  EXPECT_TRUE(Same(back, fresh_, 0, 4 * kBlock));
}

// Regression: UringBackend::Flush retried EAGAIN/EBUSY/EINTR in a tight loop with the engine's
// mutex held, so nothing else (a stats() call, another Submit, the reaping that frees the
// kernel's completion queue) could run until the kernel relented.
TEST_P(SubmitFaultTest, BackingOffDoesNotHoldTheEngineLock) {
  std::atomic<bool> refuse{true};
  ASSERT_TRUE(faults_->set_submit_rule([&](unsigned) {
    return refuse ? Refuse(EAGAIN) : SubmitFault{};
  }));
  std::memcpy(buf_.data(), fresh_.data(), kBlock);
  Status first;
  std::thread writer([&] { first = engine_->Write(file_, 0, buf_.data(), kBlock); });
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (faults_->counts().submit_transient < 5 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GE(faults_->counts().submit_transient, 5u) << "the writer never reached the backoff";
  // While the writer backs off, the lock is free most of the time: these return promptly.
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(engine_->requests_in_flight(), 1u);
  auto ticket = engine_->Submit({OpKind::kRead, file_, 2 * kBlock, buf_.data() + kBlock, kBlock});
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 2s) << "the engine's lock was held while backing off";
  refuse = false;
  Status second;
  WithinDeadline(kDeadline, "requests after the refusals end", [&] {
    writer.join();
    second = engine_->Wait(*ticket);
  });
  EXPECT_TRUE(first.ok()) << first.ToString();
  EXPECT_TRUE(second.ok()) << second.ToString();
  EXPECT_GE(engine_->stats().submit_retries, 5u);
}

TEST_P(SubmitFaultTest, TransientRefusalPastTheLimitFailsTheRequestsInBoundedTime) {
  MakeEngine(300);
  script_.Set({}, Refuse(EBUSY));
  Status ticket_status, cb_status;
  int calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  WithinDeadline(kDeadline, "requests refused with EBUSY forever", [&] {
    auto t = engine_->Submit({OpKind::kWrite, file_, 0, buf_.data(), 4 * kBlock});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, 4 * kBlock, buf_.data() + 4 * kBlock,
                                 kBlock},
                                [&](const Status& st) {
                                  calls++;
                                  cb_status = st;
                                })
                    .ok());
    ticket_status = engine_->Wait(*t);
    EXPECT_TRUE(engine_->Drain().ok());
  });
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 300ms);
  EXPECT_EQ(ticket_status.errno_value(), EBUSY) << ticket_status.ToString();
  EXPECT_NE(ticket_status.message().find("limit 300 ms"), std::string::npos)
      << ticket_status.message();
  EXPECT_NE(ticket_status.message().find(path_), std::string::npos) << ticket_status.message();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(cb_status.errno_value(), EBUSY) << cb_status.ToString();
  EXPECT_EQ(engine_->stats().withdrawn_pieces, 5u);
  EXPECT_GT(engine_->stats().submit_retries, 3u);
  ExpectStillWorks();
}

// Regression: a request whose Prepare failed at once was moved out of the live table before
// anyone waited, and Wait answered "unknown ticket" instead of the error.
TEST_P(SubmitFaultTest, ARefusedPrepareIsReportedByWaitWithItsOwnError) {
  faults_->set_rule([](const Piece& p) {
    return p.offset == kBlock ? Fault{Fault::kRefuse, ENOMEM, 0} : Fault{};
  });
  Status one, many, cb;
  int calls = 0;
  WithinDeadline(kDeadline, "Wait after a refused Prepare", [&] {
    auto t = engine_->Submit({OpKind::kRead, file_, kBlock, buf_.data(), kBlock});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    one = engine_->Wait(*t);
    // The second of four pieces is refused; the others run and complete first.
    auto u = engine_->Submit({OpKind::kRead, file_, 0, buf_.data(), 4 * kBlock});
    ASSERT_TRUE(u.ok()) << u.status().ToString();
    many = engine_->Wait(*u);
    ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, kBlock, buf_.data(), kBlock},
                                [&](const Status& st) {
                                  calls++;
                                  cb = st;
                                })
                    .ok());
    EXPECT_TRUE(engine_->Drain().ok());
  });
  for (const Status* s : {&one, &many, &cb}) {
    EXPECT_EQ(s->code(), StatusCode::kResourceExhausted) << s->ToString();
    EXPECT_EQ(s->errno_value(), ENOMEM) << s->ToString();
    EXPECT_NE(s->message().find("refused by the fault injector"), std::string::npos)
        << s->message();
    EXPECT_NE(s->message().find(path_), std::string::npos) << s->message();
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(faults_->counts().refused, 3u);
  ExpectStillWorks();
}

// A batch of four requests submitted from a callback goes to the kernel in one call; the
// kernel takes one piece, then the call fails for good. The request taken completes normally;
// the others fail, and what they would have written never reaches the file. (libaio's
// io_submit refuses only its first iocb, which completes with the error; the rest go on.)
TEST_P(SubmitFaultTest, APartlySubmittedBatchFailsOnlyTheRequestsNotTaken) {
  WriteOld();
  std::memcpy(buf_.data(), fresh_.data(), kBytes);
  std::vector<Status> got(4);
  std::vector<int> calls(3, 0);
  Ticket ticket = 0;
  auto record = [&](int i) {
    return [&, i](const Status& st) {
      calls[i]++;
      got[i] = st;
    };
  };
  WithinDeadline(kDeadline, "a partly submitted batch", [&] {
    // The starter's callback submits the batch; the engine flushes it after the callbacks.
    ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, 7 * kBlock, starter_.data(), kBlock},
                                [&](const Status& st) {
                                  ASSERT_TRUE(st.ok()) << st.ToString();
                                  script_.Set({Take(1), Refuse(EIO)});
                                  for (int i = 0; i < 3; ++i) {
                                    uint64_t off = i * kBlock;
                                    ASSERT_TRUE(engine_->Submit({OpKind::kWrite, file_, off,
                                                                 buf_.data() + off, kBlock},
                                                                record(i))
                                                    .ok());
                                  }
                                  auto t = engine_->Submit({OpKind::kWrite, file_, 3 * kBlock,
                                                            buf_.data() + 3 * kBlock, kBlock});
                                  ASSERT_TRUE(t.ok()) << t.status().ToString();
                                  ticket = *t;
                                })
                    .ok());
    EXPECT_TRUE(engine_->Drain().ok());
    got[3] = engine_->Wait(ticket);
  });
  EXPECT_EQ(calls, (std::vector<int>{1, 1, 1}));
  // uring, posix: requests 1..3 withdrawn. aio: request 1 refused, 2 and 3 submitted after it.
  const std::vector<bool> fails = Withdraws() ? std::vector<bool>{false, true, true, true}
                                              : std::vector<bool>{false, true, false, false};
  std::vector<uint8_t> back = ReadBack();
  for (int i = 0; i < 4; ++i) {
    if (!fails[i]) {
      EXPECT_TRUE(got[i].ok()) << "request " << i << ": " << got[i].ToString();
      EXPECT_TRUE(Same(back, fresh_, i * kBlock, kBlock)) << "request " << i << " not written";
      continue;
    }
    EXPECT_EQ(got[i].errno_value(), EIO) << "request " << i << ": " << got[i].ToString();
    EXPECT_TRUE(Same(back, old_, i * kBlock, kBlock)) << "request " << i << " failed but ran";
    if (Withdraws()) {
      EXPECT_NE(got[i].message().find("never handed to the kernel"), std::string::npos)
          << got[i].message();
    }
  }
  EXPECT_EQ(engine_->stats().withdrawn_pieces, Withdraws() ? 3u : 0u);
  ExpectStillWorks();
}

// One request of four pieces: the kernel takes two, then refuses. The request fails, but only
// once the two taken are done (they are on the file when Wait returns).
TEST_P(SubmitFaultTest, ARequestWithSomePiecesTakenFailsAfterThoseComplete) {
  WriteOld();
  std::memcpy(buf_.data(), fresh_.data(), 4 * kBlock);
  script_.Set({Take(2), Refuse(EIO)});
  Status s;
  WithinDeadline(kDeadline, "a partly submitted request", [&] {
    s = engine_->Write(file_, 0, buf_.data(), 4 * kBlock);
  });
  EXPECT_EQ(s.errno_value(), EIO) << s.ToString();
  EXPECT_EQ(engine_->requests_in_flight(), 0u);
  std::vector<uint8_t> back = ReadBack();
  EXPECT_TRUE(Same(back, fresh_, 0, 2 * kBlock));
  EXPECT_TRUE(Same(back, old_, 2 * kBlock, kBlock)) << "a withdrawn or refused piece ran";
  if (Withdraws()) {
    EXPECT_EQ(engine_->stats().withdrawn_pieces, 2u);
    EXPECT_TRUE(Same(back, old_, 3 * kBlock, kBlock)) << "a withdrawn piece ran anyway";
  }
  ExpectStillWorks();
}

// Random submit faults of every kind under a stream of single-piece writes: every request is
// reported exactly once, OK ones are on the file, failed ones never reached it.
TEST_P(SubmitFaultTest, RandomSubmitFaultsNeverLoseARequest) {
  WriteOld();
  std::memcpy(buf_.data(), fresh_.data(), kBytes);
  constexpr int kRequests = kBytes / kBlock;
  std::vector<Status> got(kRequests);
  std::vector<int> calls(kRequests, 0);
  WithinDeadline(kDeadline, "requests under random submit faults", [&] {
    // Submitted from a callback, in one batch; the queue depth (8) cuts it into several flushes.
    ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, 0, starter_.data(), kBlock},
                                [&](const Status& st) {
                                  ASSERT_TRUE(st.ok()) << st.ToString();
                                  // Nothing is in flight here: the rule may change.
                                  ASSERT_TRUE(faults_->set_submit_rule(
                                      RandomSubmitFaults({.p_submit_eagain = 0.15,
                                                          .p_submit_ebusy = 0.1,
                                                          .p_submit_eio = 0.15,
                                                          .p_submit_partial = 0.3,
                                                          .seed = 3})));
                                  for (int i = 0; i < kRequests; ++i) {
                                    uint64_t off = static_cast<uint64_t>(i) * kBlock;
                                    ASSERT_TRUE(engine_->Submit({OpKind::kWrite, file_, off,
                                                                 buf_.data() + off, kBlock},
                                                                [&, i](const Status& st) {
                                                                  calls[i]++;
                                                                  got[i] = st;
                                                                })
                                                    .ok());
                                  }
                                })
                    .ok());
    EXPECT_TRUE(engine_->Drain().ok());
  });
  const std::vector<uint8_t>& written = fresh_;
  FaultCounts c = faults_->counts();
  EXPECT_GT(c.submit_transient, 0u);
  EXPECT_GT(c.submit_hard, 0u);
  EXPECT_GT(c.submit_partial, 0u);
  std::vector<uint8_t> back = ReadBack();
  int ok = 0, failed = 0;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(calls[i], 1) << "request " << i;
    uint64_t off = static_cast<uint64_t>(i) * kBlock;
    if (got[i].ok()) {
      ok++;
      EXPECT_TRUE(Same(back, written, off, kBlock)) << "request " << i << " OK but not written";
    } else {
      failed++;
      EXPECT_EQ(got[i].errno_value(), EIO) << got[i].ToString();
      EXPECT_TRUE(Same(back, old_, off, kBlock)) << "request " << i << " failed but ran";
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(failed, 0);
  EXPECT_EQ(engine_->stats().failed_requests, static_cast<uint64_t>(failed));
  ExpectStillWorks();
}

INSTANTIATE_TEST_SUITE_P(AllEngines, SubmitFaultTest,
                         ::testing::ValuesIn(testing_env::AllKinds()), testing_env::KindName);

}  // namespace
}  // namespace zinf::io
