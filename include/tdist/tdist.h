#pragma once

// The whole public API of tdist in one include. Larger programs may include only the areas
// they use: each header below is self-contained.

#include "tdist/error.h"
#include "tdist/store/file_store.h"
#include "tdist/store/hash_store.h"
#include "tdist/store/prefix_store.h"
#include "tdist/store/tcp_store.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/flight_recorder.h"
#include "tdist/comm/object_collectives.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/join/join.h"
#include "tdist/ddp/distributed_data_parallel.h"
#include "tdist/ddp/zero_redundancy_optimizer.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/activation_checkpoint.h"
#include "tdist/fsdp/clip_grad.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/fsdp/full_params.h"
#include "tdist/fsdp/fully_sharded_data_parallel.h"
#include "tdist/fsdp/join.h"
#include "tdist/fsdp/state_dict.h"
#include "tdist/checkpoint/checkpoint.h"
#include "tdist/checkpoint/checkpoint_manager.h"
