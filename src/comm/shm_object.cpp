#include "tdist/detail/comm/engine/shm_object.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace tdist::detail {

char* create_shm_object(const std::string& name, size_t len, std::string& error) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    error = "shm_open(" + name + "): " + std::strerror(errno);
    return nullptr;
  }
  int rc = ::ftruncate(fd, static_cast<off_t>(len));
  if (rc == 0) rc = ::posix_fallocate(fd, 0, static_cast<off_t>(len));
  if (rc != 0) {
    error = "cannot reserve " + std::to_string(len) + " bytes of shared memory (" + name +
            "): " + std::strerror(rc > 0 ? rc : errno) + " (is /dev/shm full?)";
    ::close(fd);
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    error = "mmap(" + name + "): " + std::strerror(errno);
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  return static_cast<char*>(p);
}

char* map_shm_object(const std::string& name, bool writable, size_t* len, int* fd_out) {
  int fd = ::shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) return nullptr;
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    return nullptr;
  }
  void* p =
      ::mmap(nullptr, st.st_size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return nullptr;
  }
  if (fd_out) {
    *fd_out = fd;
  } else {
    ::close(fd);
  }
  *len = static_cast<size_t>(st.st_size);
  return static_cast<char*>(p);
}

bool shm_object_unlinked(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 && st.st_nlink == 0;
}

void remove_stale_shm_objects() {
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return;
  const time_t now = ::time(nullptr);
  while (dirent* e = ::readdir(dir)) {
    long pid = 0;
    char kind[16];
    if (std::sscanf(e->d_name, "tdist-%15[a-z]-%ld-", kind, &pid) != 2 || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat st;
    const std::string path = std::string("/dev/shm/") + e->d_name;
    if (::stat(path.c_str(), &st) != 0 || now - st.st_mtime < 30) continue;
    ::shm_unlink(("/" + std::string(e->d_name)).c_str());
  }
  ::closedir(dir);
}

}  // namespace tdist::detail
