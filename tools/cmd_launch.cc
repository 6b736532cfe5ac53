// `zinf launch --nproc N [--nnodes M --node-rank K] [--master-addr A] [--master-port P] -- CMD
// ARGS...`: starts N ranks of CMD on this node with torchrun's environment (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; plus ZINF_RUN_ID), as torchrun does
// (Debian's torchrun does not start). Each line a rank prints is passed on prefixed with
// "[rank R] " (stdout to stdout, stderr to stderr). SIGINT, SIGTERM and SIGHUP are forwarded to
// every rank (each one received). When a rank fails (a non-zero exit or a signal) the others are
// sent SIGTERM, then SIGKILL after --grace seconds, and launch exits 1 naming the rank, how it
// ended and the last line it printed. After a forwarded signal the ranks end as they choose:
// launch exits 128 + the signal if one did not exit 0. Exit 0 when every rank exits 0; 2 on bad
// usage.
// Multi-node: the same command on every node with --nnodes, its own --node-rank, the same
// --master-addr (node 0's address), --master-port and --run-id.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tools/commands.h"

namespace zinf::tools {
namespace {

struct LaunchArgs {
  int nproc = 1, nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string run_id;
  double grace = 5.0;
  std::vector<std::string> command;
};

volatile sig_atomic_t g_signal = 0;   // the last signal received
volatile sig_atomic_t g_signals = 0;  // how many were received
void OnSignal(int sig) {
  g_signal = sig;
  g_signals = g_signals + 1;
}

struct Rank {
  int rank = 0, local = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  std::string out_part, err_part;  // an unfinished line
  std::string last_line;           // the last non-empty line printed (either stream)
  bool exited = false;
  int status = 0;
};

std::string HowEnded(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    return fmt::format("was killed by signal {} ({})", s, strsignal(s));
  }
  return "ended";
}

// Passes complete lines of `chunk` on, prefixed; keeps the rest in `part`.
void Relay(Rank& r, std::string& part, const char* chunk, size_t n, FILE* to) {
  part.append(chunk, n);
  size_t start = 0;
  for (size_t nl; (nl = part.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string line = part.substr(start, nl - start);
    fmt::print(to, "[rank {}] {}\n", r.rank, line);
    if (line.find_first_not_of(" \t\r") != std::string::npos) r.last_line = line;
  }
  part.erase(0, start);
  std::fflush(to);
}

void FlushPart(Rank& r, std::string& part, FILE* to) {
  if (part.empty()) return;
  part.push_back('\n');
  Relay(r, part, "", 0, to);
}

pid_t Spawn(const LaunchArgs& a, Rank& r, const std::string& run_id) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return -1;
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return -1;
  }
  // Signals stay blocked across the fork: one arriving before the child resets its handlers
  // would run the launcher's handler in the child and be lost.
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::setenv("RANK", std::to_string(r.rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(a.nproc * a.nnodes).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(r.local).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(a.nproc).c_str(), 1);
    ::setenv("GROUP_RANK", std::to_string(a.node_rank).c_str(), 1);
    ::setenv("MASTER_ADDR", a.master_addr.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(a.master_port).c_str(), 1);
    ::setenv("ZINF_RUN_ID", run_id.c_str(), 1);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<char*> argv;
    for (const auto& s : a.command) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    fmt::print(stderr, "zinf launch: cannot run '{}': {}\n", a.command[0], std::strerror(errno));
    ::_exit(127);
  }
  sigprocmask(SIG_SETMASK, &old, nullptr);
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    return -1;
  }
  r.out_fd = out[0];
  r.err_fd = err[0];
  return pid;
}

// --run-id, else node 0's address on several nodes, else a random one.
std::string RunIdOf(const LaunchArgs& a) {
  std::string run_id = a.run_id;
  if (run_id.empty()) {
    if (a.nnodes > 1) {
      run_id = fmt::format("{}:{}", a.master_addr, a.master_port);
    } else {
      std::random_device rd;
      run_id = fmt::format("{:08x}{:08x}", rd(), rd());
    }
  }
  return run_id;
}

// Starts every rank of this node; on a failure, kills those started and returns false.
bool SpawnAll(const LaunchArgs& a, std::vector<Rank>& ranks, const std::string& run_id) {
  for (int i = 0; i < a.nproc; ++i) {
    Rank& r = ranks[size_t(i)];
    r.local = i;
    r.rank = a.node_rank * a.nproc + i;
    r.pid = Spawn(a, r, run_id);
    if (r.pid < 0) {
      fmt::print(stderr, "zinf launch: cannot start rank {}: {}\n", r.rank, std::strerror(errno));
      for (auto& o : ranks) {
        if (o.pid <= 0) continue;
        ::kill(o.pid, SIGKILL);
        ::waitpid(o.pid, nullptr, 0);
      }
      return false;
    }
  }
  return true;
}

// Relays what the ranks printed (waiting up to 100 ms for it), closing the pipes that ended.
void RelayOutput(std::vector<Rank>& ranks) {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, bool>> who;  // (rank index, is stderr)
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].out_fd >= 0) {
      fds.push_back({ranks[i].out_fd, POLLIN, 0});
      who.push_back({i, false});
    }
    if (ranks[i].err_fd >= 0) {
      fds.push_back({ranks[i].err_fd, POLLIN, 0});
      who.push_back({i, true});
    }
  }
  // Every pipe closed, ranks still running: wait all the same (no busy loop).
  ::poll(fds.empty() ? nullptr : fds.data(), fds.size(), 100);
  for (size_t k = 0; k < fds.size(); ++k) {
    if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    Rank& r = ranks[who[k].first];
    const bool is_err = who[k].second;
    char buf[65536];
    const ssize_t n = ::read(fds[k].fd, buf, sizeof(buf));
    if (n > 0) {
      Relay(r, is_err ? r.err_part : r.out_part, buf, size_t(n), is_err ? stderr : stdout);
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      FlushPart(r, is_err ? r.err_part : r.out_part, is_err ? stderr : stdout);
      ::close(fds[k].fd);
      (is_err ? r.err_fd : r.out_fd) = -1;
    }
  }
}

// The supervision's state across the loop's turns.
struct Supervision {
  int failed = -1;  // index of the first rank that failed
  bool terminating = false;
  int forwarded = 0;   // signals passed on so far
  int interrupt = 0;   // the user's signal, once one was passed on
  std::chrono::steady_clock::time_point kill_at{};
};

// Forward signals, each one received (a second Ctrl-C too). Ranks ending after one are
// not failures: the user asked.
void ForwardSignals(std::vector<Rank>& ranks, Supervision& sv) {
  if (g_signals != sv.forwarded) {
    sv.forwarded = g_signals;
    sv.interrupt = g_signal;
    fmt::print(stderr, "zinf launch: got signal {} ({}), passing it to every rank\n",
               sv.interrupt, strsignal(sv.interrupt));
    for (auto& r : ranks)
      if (!r.exited) ::kill(r.pid, sv.interrupt);
  }
}

// Reaps the ranks that ended, noting the first failure; true when every rank has ended.
bool Reap(std::vector<Rank>& ranks, Supervision& sv) {
  bool all_done = true;
  for (size_t i = 0; i < ranks.size(); ++i) {
    Rank& r = ranks[i];
    if (r.exited) continue;
    int status = 0;
    const pid_t p = ::waitpid(r.pid, &status, WNOHANG);
    if (p == r.pid) {
      r.exited = true;
      r.status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && sv.failed < 0 && !sv.terminating && sv.interrupt == 0) sv.failed = int(i);
    } else {
      all_done = false;
    }
  }
  return all_done;
}

// After a failure: SIGTERM to the ranks still running, then SIGKILL once --grace has passed.
void EndAfterFailure(const LaunchArgs& a, std::vector<Rank>& ranks, Supervision& sv) {
  if (sv.failed >= 0 && !sv.terminating) {
    sv.terminating = true;
    for (auto& r : ranks)
      if (!r.exited) ::kill(r.pid, SIGTERM);
    sv.kill_at = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(int64_t(a.grace * 1000));
  }
  if (sv.terminating && std::chrono::steady_clock::now() >= sv.kill_at) {
    for (auto& r : ranks)
      if (!r.exited) ::kill(r.pid, SIGKILL);
    sv.kill_at = std::chrono::steady_clock::time_point::max();
  }
}

// Every rank is gone; a grandchild may still hold a pipe: closes those with nothing to read
// and returns whether any is still open.
bool CloseIdlePipes(std::vector<Rank>& ranks) {
  bool any = false;
  for (auto& r : ranks) {
    for (int* fd : {&r.out_fd, &r.err_fd}) {
      pollfd probe{*fd, POLLIN, 0};
      if (*fd >= 0 && ::poll(&probe, 1, 0) == 0) {
        ::close(*fd);
        *fd = -1;
      }
      any |= *fd >= 0;
    }
  }
  return any;
}

// The exit status, naming the rank that failed or ended badly.
int Outcome(const std::vector<Rank>& ranks, const Supervision& sv) {
  if (sv.failed >= 0) {
    const Rank& r = ranks[size_t(sv.failed)];
    fmt::print(stderr, "zinf launch: rank {} {}{}; the other ranks were ended\n", r.rank,
               HowEnded(r.status),
               r.last_line.empty() ? std::string(" without printing anything")
                                   : fmt::format(", its last message: {}", r.last_line));
    return 1;
  }
  const int interrupt = sv.interrupt;
  for (const auto& r : ranks) {
    if (!(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)) {
      fmt::print(stderr, "zinf launch: rank {} {}{}\n", r.rank, HowEnded(r.status),
                 interrupt != 0 ? fmt::format(" after signal {} ({})", interrupt,
                                              strsignal(interrupt))
                                : "");
      return interrupt != 0 ? 128 + interrupt : 1;
    }
  }
  return 0;
}

int Launch(const LaunchArgs& a) {
  const std::string run_id = RunIdOf(a);
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);

  std::vector<Rank> ranks(static_cast<size_t>(a.nproc));
  if (!SpawnAll(a, ranks, run_id)) return 1;

  Supervision sv;
  for (;;) {
    // Relay output.
    RelayOutput(ranks);
    ForwardSignals(ranks, sv);
    // Reap.
    const bool all_done = Reap(ranks, sv);
    bool pipes_open = false;
    for (const auto& r : ranks) pipes_open |= r.out_fd >= 0 || r.err_fd >= 0;
    if (all_done && !pipes_open) break;
    EndAfterFailure(a, ranks, sv);
    if (all_done && pipes_open && !CloseIdlePipes(ranks)) break;
  }
  return Outcome(ranks, sv);
}

}  // namespace

void RegisterLaunch(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  auto* cmd = app.add_subcommand(
      "launch",
      "Start N ranks of a command on this node with torchrun's environment (RANK, WORLD_SIZE, "
      "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), e.g. `zinf launch --nproc 2 -- "
      "zinf train --config c.json`; when one fails, end the others and exit 1 naming it");
  cmd->add_option("--nproc", args->nproc, "ranks on this node")->check(CLI::Range(1, 256));
  cmd->add_option("--nnodes", args->nnodes, "nodes in the job (the same command on each)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--node-rank", args->node_rank, "this node's index, 0 .. nnodes-1")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--master-addr", args->master_addr, "node 0's address (the rendezvous store)");
  cmd->add_option("--master-port", args->master_port, "the rendezvous store's port")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--run-id", args->run_id,
                  "the job's name in the store (the same on every node; default: random on one "
                  "node, MASTER_ADDR:MASTER_PORT on several)");
  cmd->add_option("--grace", args->grace,
                  "seconds between SIGTERM and SIGKILL when ending the ranks after a failure")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("command", args->command, "the command each rank runs (after --)")
      ->required();
  cmd->callback([args, &exit_code] {
    if (args->node_rank >= args->nnodes) {
      fmt::print(stderr, "zinf launch: --node-rank {} is not below --nnodes {}\n",
                 args->node_rank, args->nnodes);
      exit_code = 2;
      return;
    }
    exit_code = Launch(*args);
  });
}

}  // namespace zinf::tools
