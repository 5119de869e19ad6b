#include "support.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace tessera::test {
namespace {

std::vector<std::string> merged_environment(const Environment& extra) {
  Environment merged;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const auto equals = text.find('=');
    if (equals != std::string::npos) merged[text.substr(0, equals)] = text.substr(equals + 1);
  }
  for (const auto& [key, value] : extra) merged[key] = value;
  std::vector<std::string> result;
  for (const auto& [key, value] : merged) result.push_back(key + "=" + value);
  return result;
}

// Spawns argv with pipes for stdin and stdout, and for stderr unless stderr_fd is null (then
// it is inherited).
pid_t spawn(const std::vector<std::string>& argv, const Environment& extra, int* stdin_fd,
            int* stdout_fd, int* stderr_fd) {
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe failed");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  if (stderr_fd != nullptr) posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const auto& word : argv) args.push_back(const_cast<char*>(word.c_str()));
  args.push_back(nullptr);
  const std::vector<std::string> environment = merged_environment(extra);
  std::vector<char*> envp;
  for (const auto& entry : environment) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int status = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  if (status != 0)
    throw std::runtime_error("cannot spawn " + argv[0] + ": " + std::strerror(status));
  *stdin_fd = in[1];
  *stdout_fd = out[0];
  if (stderr_fd != nullptr) {
    *stderr_fd = err[0];
  } else {
    close(err[0]);
  }
  return pid;
}

int decode(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

std::string Finished::value(const std::string& key) const {
  const std::string prefix = key + "=";
  std::size_t start = 0;
  while (start < out.size()) {
    std::size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    if (out.compare(start, prefix.size(), prefix) == 0) {
      return out.substr(start + prefix.size(), end - start - prefix.size());
    }
    start = end + 1;
  }
  ADD_FAILURE() << "no '" << key << "=' in output:\n" << out << "\nstderr:\n" << err;
  return "";
}

std::uint64_t Finished::number(const std::string& key) const {
  return std::strtoull(value(key).c_str(), nullptr, 10);
}

std::vector<std::uint64_t> Finished::numbers(const std::string& key) const {
  std::vector<std::uint64_t> list;
  const std::string text = value(key);
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) list.push_back(std::strtoull(text.c_str() + start, nullptr, 10));
    start = end + 1;
  }
  return list;
}

Finished run(const std::vector<std::string>& argv, const Environment& extra) {
  int in = -1, out = -1, err = -1;
  const pid_t pid = spawn(argv, extra, &in, &out, &err);
  close(in);
  Finished finished;
  // Read both pipes without letting either fill up.
  pollfd fds[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
  int open_pipes = 2;
  char buffer[4096];
  while (open_pipes > 0) {
    if (poll(fds, 2, -1) < 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t got = read(fds[i].fd, buffer, sizeof buffer);
      if (got <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_pipes;
      } else {
        (i == 0 ? finished.out : finished.err).append(buffer, static_cast<std::size_t>(got));
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  finished.exit_code = decode(status);
  return finished;
}

Running::Running(const std::vector<std::string>& argv, const Environment& extra) {
  pid_ = spawn(argv, extra, &stdin_fd_, &stdout_fd_, nullptr);
}

Running::~Running() {
  if (!waited_) {
    kill(pid_, SIGKILL);
    wait();
  }
  if (stdin_fd_ >= 0) close(stdin_fd_);
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

std::string Running::read_line() {
  for (;;) {
    const auto newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    char buffer[1024];
    const ssize_t got = read(stdout_fd_, buffer, sizeof buffer);
    if (got <= 0) return "";
    buffered_.append(buffer, static_cast<std::size_t>(got));
  }
}

void Running::write_line(const std::string& line) {
  const std::string text = line + "\n";
  ASSERT_EQ(write(stdin_fd_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
}

void Running::close_stdin() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  stdin_fd_ = -1;
}

void Running::kill_hard() {
  kill(pid_, SIGKILL);
}

int Running::wait() {
  int status = 0;
  waitpid(pid_, &status, 0);
  waited_ = true;
  return decode(status);
}

int Running::wait_for(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t ended = waitpid(pid_, &status, WNOHANG);
    if (ended == pid_) {
      waited_ = true;
      return decode(status);
    }
    if (std::chrono::steady_clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling the child's end
  }
}

Finished Running::finish() {
  Finished done;
  for (std::string line; !(line = read_line()).empty();) done.out += line + "\n";
  done.exit_code = wait();
  return done;
}

namespace {

// Where scratch directories go: /dev/shm, as in production (the CLI keeps ledgers there and
// the simulated GPU its file), when it has room; /tmp otherwise. The ledgers and the GPU's
// file are shared mappings written on every launch, and on a disk-backed /tmp such a write
// can wait for the filesystem's journal while another process writes to disk: time the timing
// tests cannot see as withheld by the host (it is neither run-queue delay nor steal).
std::string scratch_parent() {
  constexpr unsigned long long kRoomNeeded = 512ull << 20;
  struct statvfs shm {};
  if (statvfs("/dev/shm", &shm) == 0 && access("/dev/shm", W_OK) == 0 &&
      static_cast<unsigned long long>(shm.f_bavail) * shm.f_frsize >= kRoomNeeded) {
    return "/dev/shm";
  }
  return "/tmp";
}

}  // namespace

ScratchDirectory::ScratchDirectory() {
  static const std::string parent = scratch_parent();
  std::string pattern = parent + "/tessera-test-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed in " + parent);
  path_ = pattern;
}

ScratchDirectory::~ScratchDirectory() {
  std::filesystem::remove_all(path_);
}

std::string simulated_gpu_uuid(int index) {
  char text[48];
  std::snprintf(text, sizeof text, "GPU-7e55e7a0-0000-4000-8000-%012x", index);
  return text;
}

std::set<std::string> simulated_replica_ids(const std::vector<int>& gpus, int replicas) {
  std::set<std::string> ids;
  for (const int gpu : gpus) {
    for (int i = 0; i < replicas; ++i)
      ids.insert(simulated_gpu_uuid(gpu) + "::" + std::to_string(i));
  }
  return ids;
}

std::string read_text_file(const std::string& path) {
  std::ifstream input(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
}

// TESSERA_TEST_BUILD_DIR runs the tests against another build's programs (for example an
// older commit's, to see a test fail before its fix).
std::string build_path(const std::string& relative) {
  const char* other = std::getenv("TESSERA_TEST_BUILD_DIR");
  return std::string(other != nullptr && *other != '\0' ? other : TESSERA_BINARY_DIR) + "/" +
         relative;
}
std::string worker() {
  return build_path("tests/cuda_worker");
}
std::string tessera() {
  return build_path("bin/tessera");
}

Environment unhooked(const ScratchDirectory& scratch, const Environment& extra) {
  Environment environment{{"LD_LIBRARY_PATH", build_path("sim")},
                          {"TESSERA_SIM_STATE", scratch.file("simgpu")},
                          {"TESSERA_RUNTIME_DIR", scratch.path()},
                          {"TESSERA_SIM_DEVICES", kTestDevice}};
  for (const auto& [key, value] : extra) environment[key] = value;
  return environment;
}

Environment hooked(const ScratchDirectory& scratch, const Environment& extra) {
  Environment environment = unhooked(scratch, extra);
  environment["LD_PRELOAD"] = build_path("lib/libtessera-cuda.so");
  return environment;
}

}  // namespace tessera::test

namespace tessera::test {

std::vector<std::string> in_container(const ScratchDirectory& scratch, const ContainerSpec& spec,
                                      const std::vector<std::string>& command) {
  static int containers = 0;
  const std::string own = scratch.file("container-" + std::to_string(containers++));
  std::filesystem::create_directories(own);
  // The simulated GPU's state is its device, passed through as a runtime passes /dev/nvidia*.
  std::vector<std::string> argv = {build_path("tests/tessera-test-container"), "--scratch", own,
                                   "--device", scratch.file("simgpu")};
  for (const ContainerSpec::Mount& mount : spec.mounts) {
    argv.push_back("--mount");
    argv.push_back(mount.container + "=" + mount.host + (mount.read_only ? ":ro" : ""));
  }
  for (const auto& [name, value] : spec.envs) {
    argv.push_back("--env");
    argv.push_back(name + "=" + value);
  }
  argv.push_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

}  // namespace tessera::test
