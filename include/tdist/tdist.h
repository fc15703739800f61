#pragma once

// The whole public API of tdist in one include. Include only what you use in larger
// programs: each area's header is self-contained.

#include "tdist/error.h"
#include "tdist/store/file_store.h"
#include "tdist/store/hash_store.h"
#include "tdist/store/prefix_store.h"
#include "tdist/store/tcp_store.h"
#include "tdist/comm/distributed.h"
#if __has_include("tdist/comm/object_collectives.h")
#include "tdist/comm/object_collectives.h"
#endif
#if __has_include("tdist/mesh/device_mesh.h")
#include "tdist/mesh/device_mesh.h"
#endif
