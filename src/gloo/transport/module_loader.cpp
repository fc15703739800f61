// Loads the Gloo transport module (Note [One Gloo per symbol scope] in transport.h) from
// the copy embedded in this library (module_image.cpp), so no path has to be found at run
// time: it is written to an anonymous memory file and dlopen'ed from there.

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "gloo/transport/transport.h"
#include "tdist/error.h"

extern "C" const unsigned char tdist_gloo_module_image[];
extern "C" const unsigned char tdist_gloo_module_image_end[];

namespace tdist::detail::gloo_transport {
namespace {

constexpr const char* kCreateDevice = "_ZN4gloo9transport3tcp12CreateDeviceERKNS1_4attrE";

std::string loaded_from(const void* address) {
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

[[noreturn]] void fail(const std::string& why) {
  TDIST_THROW(DistBackendError, "the gloo backend cannot load its transport: " + why);
}

// The file of an already loaded libgloo, or "": loaded before the module, it sits in the
// global scope (or another library's), where LibTorch's Gloo would serve its calls too.
std::string loaded_libgloo() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        if (name.find("libgloo.so") == std::string::npos) return 0;
        *static_cast<std::string*>(out) = name;
        return 1;
      },
      &found);
  return found;
}

// The embedded image as a file descriptor dlopen can read.
int image_file() {
  const int fd = memfd_create("tdist_gloo_module.so", MFD_CLOEXEC);
  if (fd < 0) fail(std::string("memfd_create failed: ") + std::strerror(errno));
  const unsigned char* p = tdist_gloo_module_image;
  while (p < tdist_gloo_module_image_end) {
    const ssize_t n = write(fd, p, static_cast<size_t>(tdist_gloo_module_image_end - p));
    if (n <= 0) {
      close(fd);
      fail(std::string("writing the module image failed: ") + std::strerror(errno));
    }
    p += n;
  }
  return fd;
}

// GCC's macros; clang's __has_feature (older clangs define no macro).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TDIST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TDIST_SANITIZED 1
#endif
#endif
#ifdef TDIST_SANITIZED
constexpr bool kSanitized = true;
#undef TDIST_SANITIZED
#else
constexpr bool kSanitized = false;
#endif

// Note [Deep binding under a sanitizer]: the sanitizer runtimes refuse every dlopen with
// RTLD_DEEPBIND (google/sanitizers#611), because a library that is not linked against the
// runtime would find libc's malloc and free in its own scope first and hand the runtime
// memory it never allocated. The module of a sanitized build is linked against it (the
// build's -fsanitize link option), so the runtime is the first library of the module's own
// scope: the module's and libgloo's allocations and intercepted libc calls bind to it as
// everyone else's do. So here, and only here, libc's dlopen is called past the
// runtime's interceptor; check_allocator_shared confirms what this relies on.
void* open_deep(const char* path, int flags) {
  if (!kSanitized) return dlopen(path, flags);
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  using Dlopen = void* (*)(const char*, int);
  auto libc_dlopen = libc ? reinterpret_cast<Dlopen>(dlsym(libc, "dlopen")) : nullptr;
  if (libc_dlopen == nullptr) fail("libc's dlopen cannot be found in a sanitized build");
  return libc_dlopen(path, flags);
}

// Under a sanitizer, the module's scope must find the runtime's malloc as the global scope
// does, or memory would cross the interface between the runtime's heap and libc's.
void check_allocator_shared(void* handle) {
  if (kSanitized && dlsym(handle, "malloc") != dlsym(RTLD_DEFAULT, "malloc"))
    fail(
        "the module's malloc is not the process's (a sanitized tdist whose Gloo module "
        "was linked without -fsanitize: rebuild it with the same TDIST_SANITIZE)");
}

Module* load() {
  if (const std::string early = loaded_libgloo(); !early.empty())
    fail("'" + early +
         "' is already loaded (is libgloo linked into the program?); two Gloo "
         "copies would mix, since LibTorch carries its own (" +
         global_gloo_library_path() +
         "). Link tdist::tdist without libgloo: tdist loads it privately (docs/gloo.md)");
  const int fd = image_file();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  // RTLD_DEEPBIND: the module's and libgloo's own references to `gloo::` bind to libgloo
  // before the global scope, where LibTorch's copy is; RTLD_LOCAL: nothing outside binds to
  // them.
  void* handle = open_deep(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  close(fd);
  if (handle == nullptr) {
    const char* error = dlerror();
    fail(std::string(error ? error : "dlopen failed") +
         "; it needs Debian's Gloo library (apt-get install libgloo0, or run tools/setup.sh)");
  }
  using Entry = Module* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "tdist_gloo_transport_module"));
  if (entry == nullptr) fail("the module has no entry point");
  check_allocator_shared(handle);
  Module* module = entry();
  if (module->abi_version() != kAbiVersion)
    fail("the module speaks ABI " + std::to_string(module->abi_version()) + ", tdist " +
         std::to_string(kAbiVersion) + " (a stale build: rebuild tdist)");
  const std::string own = module->gloo_library_path();
  const std::string global = global_gloo_library_path();
  if (own.empty() || own == global)
    fail("its Gloo calls bind to '" + own +
         "', the Gloo of the process's global scope; two Gloo copies would mix "
         "(docs/gloo.md)");
  return module;
}

}  // namespace

Module& module() {
  static std::once_flag once;
  static Module* instance = nullptr;
  std::call_once(once, [] { instance = load(); });
  return *instance;
}

std::string global_gloo_library_path() {
  return loaded_from(dlsym(RTLD_DEFAULT, kCreateDevice));
}

}  // namespace tdist::detail::gloo_transport
