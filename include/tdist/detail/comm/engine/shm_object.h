#pragma once

// POSIX shared-memory objects (shm_open + mmap), shared by the Gloo engine's staging segments
// and symmetric-memory tensors. Every tdist object is named /tdist-<kind>-<creator pid>-...,
// so that remove_stale_shm_objects can tell the leftovers of dead processes.

#include <cstddef>
#include <string>

namespace tdist::detail {

/// Creates, sizes (with the pages reserved, so that a full /dev/shm fails here and not as a
/// SIGBUS later) and maps `name` read-write; nullptr with `error` set on failure.
char* create_shm_object(const std::string& name, size_t len, std::string& error);

/// Maps the existing object `name` (read-only unless `writable`); nullptr on failure (errno
/// set). On success *len is its size and, when `fd` is given, the open descriptor is left to
/// the caller (to fstat it later; close it after munmap).
char* map_shm_object(const std::string& name, bool writable, size_t* len, int* fd = nullptr);

/// True once the object behind `fd` has been unlinked (its creator freed it).
bool shm_object_unlinked(int fd);

/// Removes /dev/shm/tdist-* objects of processes that no longer exist, once half a minute
/// old (a process in another pid namespace that shares /dev/shm looks dead, but its peers
/// have mapped its objects long before then, and unlinking a mapped name is harmless).
void remove_stale_shm_objects();

}  // namespace tdist::detail
