// tessera-test-container: runs a command as a container runtime would start it from a device
// plugin's answers, for the tests: in a mount namespace of its own, with each answer's mounts
// at their container paths (a bind mount, read-only where asked) and its environment, and the
// GPUs NVIDIA_VISIBLE_DEVICES names as the only ones CUDA sees. Paths that do not exist on the
// host (/etc/ld.so.preload, /usr/local/lib/tessera/...) are made in an overlay of their nearest
// existing directory, visible to this process alone, as an image would have them. The hook then
// reaches the command through /etc/ld.so.preload, read by the dynamic loader, never LD_PRELOAD.
//
//   tessera-test-container --scratch DIR [--mount CONTAINER=HOST[:ro]]... [--device PATH]...
//                          [--env NAME=VALUE]... -- COMMAND [ARGS...]
//
// A --device is passed through at its own path, as a runtime passes /dev/nvidia0: the simulated
// GPU's state file is the device here. Every source is opened before anything is mounted, so a
// mount that covers another's source (/dev/shm for MPS) hides nothing the container is given.
//
// Without the privilege to make a mount namespace it makes a user namespace first (its user as
// root there), as rootless container runtimes do.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "contract/variables.h"

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "tessera-test-container: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(125);
}

struct Mount {
  std::string container, host;
  bool read_only = false;
  int source = -1;  // the host path, opened before any mount
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out.flush()) fail("cannot write " + path);
}

void enter_namespaces() {
  if (unshare(CLONE_NEWNS) == 0) return;
  const uid_t uid = getuid();
  const gid_t gid = getgid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) fail("cannot make a mount namespace");
  write_file("/proc/self/setgroups", "deny");
  write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1");
  write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1");
}

// Makes `target` exist as a file or directory, in an overlay of its nearest existing directory
// where it does not.
void make_target(const std::string& target, bool directory, std::set<std::string>& overlaid) {
  if (fs::exists(target)) return;
  fs::path existing = fs::path(target).parent_path();
  while (!fs::exists(existing)) existing = existing.parent_path();
  const std::string lower = fs::canonical(existing).string();
  if (!overlaid.contains(lower)) {
    // Relative to the working directory, the scratch space: found even once a mount covers
    // its path (/dev/shm, where tests' scratch space may be).
    const std::string layer = "overlay-" + std::to_string(overlaid.size());
    fs::create_directories(layer + "/upper");
    fs::create_directories(layer + "/work");
    const std::string options =
        "lowerdir=" + lower + ",upperdir=" + layer + "/upper,workdir=" + layer + "/work";
    if (mount("overlay", lower.c_str(), "overlay", 0, options.c_str()) != 0) {
      fail("cannot overlay " + lower);
    }
    overlaid.insert(lower);
  }
  if (directory) {
    fs::create_directories(target);
  } else {
    fs::create_directories(fs::path(target).parent_path());
    std::ofstream(target).flush();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string scratch;
  std::vector<Mount> mounts, devices;
  std::vector<std::pair<std::string, std::string>> envs;
  int command = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      command = i + 1;
      break;
    }
    if (i + 1 >= argc) break;
    const std::string value = argv[++i];
    const std::size_t equals = value.find('=');
    if (arg == "--scratch") {
      scratch = value;
    } else if (arg == "--mount" && equals != std::string::npos) {
      Mount mount{value.substr(0, equals), value.substr(equals + 1), false};
      if (mount.host.size() > 3 && mount.host.ends_with(":ro")) {
        mount.host.resize(mount.host.size() - 3);
        mount.read_only = true;
      }
      mounts.push_back(mount);
    } else if (arg == "--device") {
      devices.push_back({value, value, false});
    } else if (arg == "--env" && equals != std::string::npos) {
      envs.emplace_back(value.substr(0, equals), value.substr(equals + 1));
    } else {
      command = -1;
      break;
    }
  }
  if (command < 0 || command >= argc || scratch.empty()) {
    std::fprintf(stderr,
                 "usage: tessera-test-container --scratch DIR [--mount C=H[:ro]]... "
                 "[--env N=V]... -- COMMAND [ARGS...]\n");
    return 2;
  }
  if (chdir(scratch.c_str()) != 0) fail("cannot enter " + scratch);
  enter_namespaces();
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    fail("cannot make / private");
  // Opened in this namespace (a mount of another cannot be bound), before anything is mounted.
  for (auto* list : {&mounts, &devices}) {
    for (Mount& entry : *list) {
      entry.source = open(entry.host.c_str(), O_PATH | O_CLOEXEC);
      if (entry.source < 0) fail("cannot open " + entry.host);
    }
  }
  // Parents before what is mounted inside them.
  std::stable_sort(mounts.begin(), mounts.end(), [](const Mount& a, const Mount& b) {
    return a.container.size() < b.container.size();
  });
  mounts.insert(mounts.end(), devices.begin(), devices.end());  // devices last: never covered
  std::set<std::string> overlaid;
  for (const Mount& entry : mounts) {
    struct stat source {};
    if (fstat(entry.source, &source) != 0) fail("cannot read " + entry.host);
    make_target(entry.container, S_ISDIR(source.st_mode), overlaid);
    const std::string from = "/proc/self/fd/" + std::to_string(entry.source);
    if (mount(from.c_str(), entry.container.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
      fail("cannot mount " + entry.host + " at " + entry.container);
    if (entry.read_only && mount(nullptr, entry.container.c_str(), nullptr,
                                 MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
      fail("cannot make " + entry.container + " read-only");
    }
  }
  unsetenv("LD_PRELOAD");  // only /etc/ld.so.preload brings the hook in
  for (const auto& [name, value] : envs) {
    setenv(name.c_str(), value.c_str(), 1);
    // The runtime gives the container only the GPUs the plugin named; CUDA then sees those.
    if (name == tessera::contract::kVisibleDevicesVariable) {
      setenv("CUDA_VISIBLE_DEVICES", value.c_str(), 1);
    }
  }
  execvp(argv[command], argv + command);
  fail(std::string("cannot run ") + argv[command]);
}
