/* device_cuda: the CUDA plugin's table (see device_cuda.h). Built into
 * libfsdp-cuda.so only. */
#include "daemon/train/device_cuda.h"

static const device_cuda_plugin_t device_cuda_table = {
    .abi = DEVICE_CUDA_ABI,
    .device_count = kern_cuda_device_count,
    .kern_init = kern_cuda_init,
    .kern_stream = kern_cuda_stream,
    .reserved_bytes = kern_cuda_reserved_bytes,
    .device_name = kern_cuda_device_name,
    .device_memory = kern_cuda_device_memory,
    .pool_stats = kern_cuda_pool_stats,
    .comm = &comm_nccl_backend,
    .nccl_unique_id = comm_nccl_unique_id,
    .nccl_create = comm_nccl_create,
    .nccl_quiesce = comm_nccl_quiesce,
    .device_usable = kern_cuda_device_usable,
};

__attribute__((visibility("default"))) const device_cuda_plugin_t *device_cuda_plugin(void) {
  return &device_cuda_table;
}
