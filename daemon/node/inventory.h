/* inventory: what a node offers the coordinator. fsdpd owns its devices and
 * registers them: CUDA GPUs found through the driver (libcuda.so.1, opened at
 * run time so that fsdpd starts on a machine without one), or CPU devices,
 * `cpu:N`, which share the host's memory N ways and run the same code paths
 * on the CPU backend.
 *
 * Spec (fsdpd --devices): "cpu:N" (1..INVENTORY_MAX), "cuda" (every GPU),
 * "cuda:0,2" (those), "auto" (every GPU, else one CPU device). */
#ifndef FSDP_INVENTORY_H
#define FSDP_INVENTORY_H

#include <stdint.h>

#define INVENTORY_MAX 64
#define INVENTORY_CU_NOT_FOUND 500 /* CUDA_ERROR_NOT_FOUND */
#define INVENTORY_NOT_MEASURED -1
/* A GPU with this much less free than its total holds more than a CUDA
 * context (a few hundred MiB): others' memory, measured again up to
 * INVENTORY_SETTLE_ROUNDS times a second apart (inventory_measure) */
#define INVENTORY_HELD_MAX (2ull << 30)
#define INVENTORY_SETTLE_ROUNDS 5

typedef struct inventory_device {
  char kind[8];   /* "cpu" or "cuda" */
  int index;      /* the device's index on this node (the CUDA ordinal for GPUs) */
  char name[96];  /* "CPU device 0 of 2", "NVIDIA H100 80GB HBM3" */
  uint64_t memory; /* bytes a rank may use there: a CPU device's share of the host's memory;
                    * a GPU's free memory with a CUDA context of fsdpd's on it, as fsdpd
                    * started (inventory_measure; a rank's own context takes about as much)
                    * and since as measured again while idle (ranks.c), or its total where
                    * the driver could not say (free_error) */
  uint64_t total;  /* a GPU's whole memory (cuDeviceTotalMem); a CPU device's, memory */
  int free_error;  /* a GPU's: the CUDA error that kept its free memory from being measured
                    * (INVENTORY_CU_NOT_FOUND: a driver without the entry points;
                    * INVENTORY_NOT_MEASURED before inventory_measure; 0: measured) */
} inventory_device_t;

typedef struct inventory {
  int count;
  /* the host's memory divided among the devices: a CPU device's memory, and
   * the host memory a GPU's rank may keep apart from it (its checkpoint
   * snapshot; FSDP_HOST_MEMORY_BYTES) */
  uint64_t host_share;
  inventory_device_t dev[INVENTORY_MAX];
} inventory_t;

/* Finds the devices spec names. Errors name the spec and the fix: a malformed
 * spec (EINVAL), no driver or no GPU for "cuda" (EUNSUPPORTED), an ordinal
 * the node does not have (ERANGE). */
int inventory_find(const char *spec, inventory_t *out);
/* Sets each GPU's memory to what is free on it with a CUDA context of this
 * process there (its primary context retained, cuMemGetInfo, released), a
 * GPU whose context cannot be had keeping its total with the error in
 * free_error; CPU devices are left as they are. A GPU where others hold
 * more than INVENTORY_HELD_MAX is measured again, a second apart, up to
 * INVENTORY_SETTLE_ROUNDS times in all (at most 4 s). The driver stays loaded
 * after (threads it started may outlive the contexts), so call this once
 * the process's environment is set: they may read it. */
void inventory_measure(inventory_t *inv);
/* GPU index's (its CUDA ordinal) free memory with a context of this process
 * on it, into *bytes: the CUDA error, 0 when measured. Any thread; the
 * caller sees that no rank of this node starts on the GPU meanwhile (a
 * GPU in exclusive-process mode takes one context at a time). */
int inventory_gpu_free(int index, uint64_t *bytes);

#endif
