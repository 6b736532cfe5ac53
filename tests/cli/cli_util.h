// tests/cli/cli_util.h — run the zinf binary and capture what it prints.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace zinf::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `ZINF_BINARY args` through the shell; stderr is captured through a temp file.
inline CommandResult RunZinf(const std::string& args, const std::string& tmpdir) {
  CommandResult r;
  std::string err_path = tmpdir + "/stderr.txt";
  std::string cmd = std::string(ZINF_BINARY) + " " + args + " 2>" + err_path;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (FILE* e = fopen(err_path.c_str(), "r")) {
    while ((n = fread(buf.data(), 1, buf.size(), e)) > 0) r.err.append(buf.data(), n);
    fclose(e);
  }
  return r;
}

// Starts `ZINF_BINARY args...` in the background with stdout to a pipe (*out_fd, the caller
// reads and closes it) and stderr to err_path, SIGINT and SIGTERM at their defaults and
// unblocked; returns its pid (-1 on failure).
inline pid_t SpawnZinf(std::vector<std::string> args, const std::string& err_path, int* out_fd) {
  args.insert(args.begin(), ZINF_BINARY);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int p[2];
  if (pipe(p) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], STDOUT_FILENO);
    close(p[0]);
    close(p[1]);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) dup2(err, STDERR_FILENO);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(p[1]);
  if (pid < 0) {
    close(p[0]);
    return -1;
  }
  *out_fd = p[0];
  return pid;
}

// The words of `s` (split at white space): arguments for SpawnZinf.
inline std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> r;
  std::istringstream in(s);
  for (std::string w; in >> w;) r.push_back(w);
  return r;
}

// Reads fd to its end and closes it.
inline std::string Drain(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t got; (got = read(fd, buf, sizeof buf)) > 0;) {
    out.append(buf, static_cast<size_t>(got));
  }
  close(fd);
  return out;
}

}  // namespace zinf::testing
