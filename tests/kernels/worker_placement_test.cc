// Tests of WorkerPlacement (kernels/cpu/worker_placement.h): a registered thread's mask loses
// the given CPU and gets it back at its next NoteRun; a second move bars the new CPU from the
// saved mask; a CPU outside the mask, a mask of one CPU and a worker already barred from that
// CPU are left alone; neither the calling thread nor a thread that never ran is moved.
// Skipped where this process may run on one CPU only.
#include "kernels/cpu/worker_placement.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

namespace zinf::kernels {
namespace {

cpu_set_t MaskOf(pid_t tid) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(sched_getaffinity(tid, sizeof(mask), &mask), 0);
  return mask;
}

// The first CPU of `mask` after `after` (-1: from the start), or -1 when there is none.
int NextCpu(const cpu_set_t& mask, int after) {
  for (int c = after + 1; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) return c;
  return -1;
}

int FirstCpu(const cpu_set_t& mask) { return NextCpu(mask, -1); }

// A thread that runs `body(tid)` between two steps the test drives: Step() lets it go on to
// its next step and waits until it gets there.
class Worker {
 public:
  explicit Worker(std::function<void(Worker&)> body)
      : thread_([this, body = std::move(body)] { body(*this); }) {}
  // Lets the thread past every step (a test that stopped early must not hang here).
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      go_ = std::numeric_limits<int>::max();
      cv_.notify_all();
    }
    thread_.join();
  }
  // Called by the thread: announces a step done and waits for the test's go.
  void Reached() {
    std::unique_lock<std::mutex> lock(mu_);
    if (tid_ == 0) tid_ = static_cast<pid_t>(syscall(SYS_gettid));
    ++reached_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return go_ >= reached_; });
  }
  // Called by the test: waits for step `n`, then lets the thread past it.
  pid_t WaitFor(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return reached_ >= n; });
    return tid_;
  }
  void Go() {
    std::lock_guard<std::mutex> lock(mu_);
    ++go_;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int reached_ = 0, go_ = 0;  // GUARDED_BY(mu_)
  pid_t tid_ = 0;             // GUARDED_BY(mu_)
  std::thread thread_;
};

TEST(WorkerPlacementTest, NarrowsTheMaskUntilTheNextRun) {
  const cpu_set_t process = MaskOf(0);
  if (CPU_COUNT(&process) < 2) GTEST_SKIP() << "this process may run on one CPU only";
  WorkerPlacement placement;
  Worker worker([&](Worker& w) {
    placement.NoteRun();  // registers
    w.Reached();
    placement.NoteRun();  // restores the mask
    w.Reached();
  });
  const pid_t tid = worker.WaitFor(1);
  EXPECT_EQ(placement.workers(), 1u);
  const cpu_set_t before = MaskOf(tid);
  const int cpu = FirstCpu(before);
  ASSERT_GE(cpu, 0);

  EXPECT_EQ(placement.MoveOffCpu(cpu), 1);
  EXPECT_EQ(placement.moves(), 1u);
  cpu_set_t expected = before;
  CPU_CLR(cpu, &expected);
  const cpu_set_t narrowed = MaskOf(tid);
  EXPECT_TRUE(CPU_EQUAL(&narrowed, &expected));
  EXPECT_EQ(placement.MoveOffCpu(cpu), 0) << "a worker already barred from this CPU";
  EXPECT_EQ(placement.moves(), 1u);

  worker.Go();
  worker.WaitFor(2);
  const cpu_set_t after = MaskOf(tid);
  EXPECT_TRUE(CPU_EQUAL(&after, &before));
  worker.Go();
}

TEST(WorkerPlacementTest, LeavesAloneWhatItMayNotNarrow) {
  const cpu_set_t process = MaskOf(0);
  if (CPU_COUNT(&process) < 2) GTEST_SKIP() << "this process may run on one CPU only";
  const int only = FirstCpu(process);
  const int other = NextCpu(process, only);
  ASSERT_GE(other, 0);
  WorkerPlacement placement;
  Worker worker([&](Worker& w) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(only, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) ADD_FAILURE() << "sched_setaffinity";
    placement.NoteRun();
    w.Reached();
  });
  const pid_t tid = worker.WaitFor(1);
  EXPECT_EQ(placement.MoveOffCpu(only), 0) << "its only CPU";
  EXPECT_EQ(placement.MoveOffCpu(other), 0) << "a CPU its mask does not allow";
  EXPECT_EQ(placement.MoveOffCpu(-1), 0);
  EXPECT_EQ(placement.MoveOffCpu(CPU_SETSIZE), 0);
  EXPECT_EQ(placement.moves(), 0u);
  const cpu_set_t mask = MaskOf(tid);
  EXPECT_EQ(CPU_COUNT(&mask), 1);
  EXPECT_TRUE(CPU_ISSET(only, &mask));
  worker.Go();
}

TEST(WorkerPlacementTest, BarsAnotherCpuFromTheSavedMask) {
  const cpu_set_t process = MaskOf(0);
  if (CPU_COUNT(&process) < 2) GTEST_SKIP() << "this process may run on one CPU only";
  WorkerPlacement placement;
  Worker worker([&](Worker& w) {
    placement.NoteRun();
    w.Reached();
    placement.NoteRun();
    w.Reached();
  });
  const pid_t tid = worker.WaitFor(1);
  const cpu_set_t before = MaskOf(tid);
  const int first = FirstCpu(before);
  const int second = NextCpu(before, first);
  ASSERT_GE(second, 0);
  EXPECT_EQ(placement.MoveOffCpu(first), 1);
  // Barred from `first`, then from `second` instead: the saved mask less `second`, so it may
  // run on `first` again (where its caller no longer is).
  EXPECT_EQ(placement.MoveOffCpu(second), 1);
  EXPECT_EQ(placement.moves(), 2u);
  cpu_set_t expected = before;
  CPU_CLR(second, &expected);
  const cpu_set_t narrowed = MaskOf(tid);
  EXPECT_TRUE(CPU_EQUAL(&narrowed, &expected));
  worker.Go();
  worker.WaitFor(2);
  const cpu_set_t after = MaskOf(tid);
  EXPECT_TRUE(CPU_EQUAL(&after, &before)) << "the mask before the first move comes back";
  worker.Go();
}

TEST(WorkerPlacementTest, NeverMovesTheCallerOrAThreadThatNeverRan) {
  const cpu_set_t process = MaskOf(0);
  if (CPU_COUNT(&process) < 2) GTEST_SKIP() << "this process may run on one CPU only";
  WorkerPlacement placement;
  // A thread that has not run (this one) is unknown: nothing to move.
  EXPECT_EQ(placement.workers(), 0u);
  EXPECT_EQ(placement.MoveOffCpu(FirstCpu(process)), 0);
  // A registered thread that calls MoveOffCpu bars the others, never itself.
  int moved_by_itself = -1;
  cpu_set_t own_before{}, own_after{};
  Worker worker([&](Worker& w) {
    placement.NoteRun();
    own_before = MaskOf(0);
    moved_by_itself = placement.MoveOffCpu(FirstCpu(own_before));
    own_after = MaskOf(0);
    w.Reached();
  });
  worker.WaitFor(1);
  EXPECT_EQ(moved_by_itself, 0);
  EXPECT_TRUE(CPU_EQUAL(&own_before, &own_after));
  const cpu_set_t mine = MaskOf(0);
  EXPECT_TRUE(CPU_EQUAL(&mine, &process)) << "the test's own thread never registered";
  worker.Go();
}

}  // namespace
}  // namespace zinf::kernels
