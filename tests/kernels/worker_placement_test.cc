// Tests of WorkerPlacement (kernels/cpu/worker_placement.h): a registered thread's mask loses
// the given CPU and gets it back at its next NoteRun; a CPU outside the mask, a mask of one CPU
// and an already narrowed mask are left alone; a thread that never ran is unknown to it.
// Skipped where this process may run on one CPU only.
#include "kernels/cpu/worker_placement.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <functional>
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

int FirstCpu(const cpu_set_t& mask) {
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) return c;
  return -1;
}

// A thread that runs `body(tid)` between two steps the test drives: Step() lets it go on to
// its next step and waits until it gets there.
class Worker {
 public:
  explicit Worker(std::function<void(Worker&)> body)
      : thread_([this, body = std::move(body)] { body(*this); }) {}
  ~Worker() { thread_.join(); }
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
  EXPECT_EQ(placement.MoveOffCpu(cpu), 0) << "an already narrowed mask is left alone";
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
  int other = -1;
  for (int c = only + 1; c < CPU_SETSIZE && other < 0; ++c)
    if (CPU_ISSET(c, &process)) other = c;
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

TEST(WorkerPlacementTest, KnowsOnlyThreadsThatRan) {
  WorkerPlacement placement;
  EXPECT_EQ(placement.workers(), 0u);
  EXPECT_EQ(placement.MoveOffCpu(sched_getcpu()), 0);
  const cpu_set_t mine = MaskOf(0);
  const cpu_set_t after = MaskOf(0);
  EXPECT_TRUE(CPU_EQUAL(&mine, &after));
}

}  // namespace
}  // namespace zinf::kernels
