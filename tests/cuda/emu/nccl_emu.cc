/* nccl_emu.cc: NCCL for cuda_emu (cuda_emu.h): what daemon/comm/nccl.c calls,
 * so the CUDA plugin built on the emulator (build/emu/libfsdp-cuda.so) trains
 * through the same NCCL backend a GPU does, at one rank or at several (rank
 * processes, as fsdp-launch and fsdpd start them, or threads of one).
 *
 * One rank: every collective is a copy (an average of one is the value
 * itself), work on the stream it was called on, as a kernel is (run at the
 * call, or queued: CUDA_EMU_STREAMS, cuda_emu.cc).
 *
 * Several ranks: a communicator is a POSIX shared-memory segment named by the
 * unique id (a split's child: the parent's name, the split's number and the
 * color), holding for each rank two round counters (posted, read), the
 * signature of the op it posted, its split color and key, and a slot of
 * EMU_SLOT bytes. An op runs in rounds of at most a slot per rank: a rank
 * waits until every rank has read the last round, writes its part into its
 * slot, posts, waits until every rank has posted, then reads what it needs
 * from the slots (a reduction adds in fp32 in rank order and rounds once,
 * ncclAvg pre-multiplying each input by 1/n as NCCL does for floats: every
 * rank gets the same bits) and marks the round read. The segment is
 * unlinked once every rank has joined, so a job that ends leaves nothing in
 * /dev/shm (one killed before all joined leaves its name; they start with
 * fsdp-nccl-emu).
 *
 * Nothing blocks. A non-blocking communicator (config.blocking = 0, as
 * nccl.c makes them) answers ncclInProgress to init, split and every op of
 * several ranks, and advances when ncclCommGetAsyncError is called (nccl.c
 * polls it) until it says ncclSuccess; a rank that never comes leaves its
 * peers in ncclInProgress until nccl.c's timeout aborts them, as a GPU's
 * NCCL does. A blocking communicator's calls loop on the same steps.
 * ncclCommAbort frees the communicator wherever its op stood.
 *
 * With queued streams (CUDA_EMU_STREAMS=deferred or ahead) a collective of several
 * ranks is work queued on its stream, as on a GPU: the call answers at once
 * (a non-blocking communicator's ncclInProgress until the next poll, as
 * NCCL's launch may), and the op starts when its stream reaches it (after
 * the compute work it waits for through an event) and runs a round each
 * time that stream is driven (a synchronization, or cudaEventQuery of an
 * event behind it, which nccl.c polls); ncclCommGetAsyncError then only
 * reports a failure and advances joins and splits. A failed collective
 * leaves its stream stuck, as a GPU's does, until ncclCommAbort ends it.
 *
 * Ranks that post different ops in the same round (another collective,
 * count, type, reduction or root) fail it with ncclInvalidUsage on each
 * side, ncclGetLastError naming both: NCCL would hang or compute garbage
 * there, and the emulator is where the runtime's order of collectives is
 * checked across ranks.
 *
 * Buffers must be device memory (cudaMalloc), as NCCL's. */
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_emu.h"
#include "kernels/kern_math.h"

#define EMU_MAXR 256          /* ranks a communicator */
#define EMU_SLOT (4u << 20)   /* bytes a rank moves a round */
#define EMU_NAME 200          /* a segment's name, at most */

/* What a rank posted for its current round: equal on every rank, or the
 * ranks diverged. */
struct emu_sig {
  int32_t kind, dtype, redop, root;
  uint64_t count;
};

struct emu_rank {
  std::atomic<uint64_t> posted; /* rounds whose slot data this rank wrote */
  std::atomic<uint64_t> read;   /* rounds this rank finished reading */
  emu_sig sig;                  /* of round `posted`, written before it */
  int32_t color, key;           /* a split's, written before posting it */
  char pad[16];
};

struct emu_seg {
  std::atomic<uint32_t> joined;
  int32_t nranks;
  char pad[56];
  emu_rank r[EMU_MAXR]; /* nranks of them used; the slots follow the header */
};

enum { OP_NONE, OP_JOIN, OP_SPLIT, OP_ALLGATHER, OP_REDUCESCATTER, OP_ALLREDUCE, OP_BCAST };
static const char *const op_names[] = {"none",          "init",           "split",
                                       "ncclAllGather", "ncclReduceScatter", "ncclAllReduce",
                                       "ncclBroadcast"};

struct emu_op {
  int kind = OP_NONE;
  const unsigned char *send = nullptr;
  unsigned char *recv = nullptr;
  size_t count = 0, done = 0; /* elements: the op's, and those finished */
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t redop = ncclSum;
  int root = 0;
  bool posted = false;         /* this round's part written and posted */
  int color = 0, key = 0;      /* a split's */
  ncclComm_t *newcomm = nullptr;
  int child_blocking = 1;
};

struct ncclComm {
  int blocking = 1, rank = 0, nranks = 1;
  char name[EMU_NAME] = "";
  emu_seg *seg = nullptr;
  size_t map_bytes = 0;
  uint64_t round = 0; /* rounds this rank has completed */
  unsigned splits = 0;
  emu_op op;
  ncclResult_t err = ncclSuccess; /* sticky: the communicator is broken */
  uint64_t serial = 0;            /* in nccl_emu_live while it lives */
  bool launching = false; /* deferred: a collective answered ncclInProgress, not yet polled */
};

/* The communicators alive, by serial: a collective queued on a stream
 * (CUDA_EMU_STREAMS=deferred) finds its own there, or that it was
 * destroyed or aborted meanwhile (then it ends, as ncclCommAbort ends a
 * GPU's kernels). Under nccl_emu_live_mu; a communicator is freed only with
 * emu::stream_mu() held too, so a queued collective, running under it, never
 * sees one freed under it. */
static std::mutex nccl_emu_live_mu;
static std::map<uint64_t, ncclComm *> nccl_emu_live;
static uint64_t nccl_emu_serials;

static pthread_mutex_t nccl_emu_mu = PTHREAD_MUTEX_INITIALIZER;
static char nccl_emu_last[512];

static ncclResult_t nccl_emu_fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t nccl_emu_fail(ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&nccl_emu_mu);
  vsnprintf(nccl_emu_last, sizeof nccl_emu_last, fmt, ap);
  pthread_mutex_unlock(&nccl_emu_mu);
  va_end(ap);
  return r;
}

static size_t nccl_emu_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
  case ncclUint8: return 1;
  case ncclFloat16:
  case ncclBfloat16: return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32: return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64: return 8;
  default: return 0;
  }
}

static size_t emu_seg_bytes(int n) { return sizeof(emu_seg) + (size_t)n * EMU_SLOT; }
static unsigned char *emu_slot(const ncclComm *c, int r) {
  return (unsigned char *)c->seg + sizeof(emu_seg) + (size_t)r * EMU_SLOT;
}

static ncclComm *nccl_emu_new(const ncclConfig_t *cfg, int rank, int nranks, const char *name) {
  ncclComm *c = new (std::nothrow) ncclComm;
  if (!c) return nullptr;
  c->blocking = !cfg || cfg->blocking != 0;
  c->rank = rank, c->nranks = nranks;
  snprintf(c->name, sizeof c->name, "%s", name);
  std::lock_guard<std::mutex> g(nccl_emu_live_mu);
  c->serial = ++nccl_emu_serials;
  nccl_emu_live[c->serial] = c;
  return c;
}

static ncclComm *nccl_emu_alive(uint64_t serial) {
  std::lock_guard<std::mutex> g(nccl_emu_live_mu);
  auto it = nccl_emu_live.find(serial);
  return it == nccl_emu_live.end() ? nullptr : it->second;
}

static void nccl_emu_free(ncclComm *c) {
  if (!c) return;
  std::lock_guard<std::mutex> q(emu::stream_mu());
  {
    std::lock_guard<std::mutex> g(nccl_emu_live_mu);
    nccl_emu_live.erase(c->serial);
  }
  if (c->seg) {
    munmap(c->seg, c->map_bytes);
    shm_unlink(c->name); /* a join cut short leaves no name behind (ENOENT otherwise) */
  }
  delete c;
}

/* Maps c's segment and counts c in: the rank that comes first makes it
 * (O_EXCL), sized and its memory reserved (posix_fallocate: a full
 * /dev/shm is an error here, not a SIGBUS at a later write), then writes
 * nranks; the others map it once it has its size, and a rank given another
 * size than the maker's fails (it would shrink the segment under the
 * others). ncclSuccess, ncclInProgress (the maker has not sized it yet: try
 * again), or an error. */
static ncclResult_t emu_attach(ncclComm *c) {
  const size_t bytes = emu_seg_bytes(c->nranks);
  bool maker = true;
  int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) maker = false, fd = shm_open(c->name, O_RDWR, 0600);
  if (fd < 0)
    return nccl_emu_fail(ncclSystemError, "cuda_emu: shm_open(%s): %s", c->name, strerror(errno));
  int e = 0;
  if (maker) {
    if (ftruncate(fd, (off_t)bytes) || (e = posix_fallocate(fd, 0, (off_t)bytes))) {
      e = e ? e : errno;
      close(fd);
      shm_unlink(c->name);
      return nccl_emu_fail(ncclSystemError, "cuda_emu: %zu bytes of shared memory for %s: %s",
                           bytes, c->name, strerror(e));
    }
  } else {
    struct stat st;
    if (fstat(fd, &st)) {
      e = errno;
      close(fd);
      return nccl_emu_fail(ncclSystemError, "cuda_emu: fstat(%s): %s", c->name, strerror(e));
    }
    if ((size_t)st.st_size != bytes) {
      close(fd);
      if (st.st_size == 0) return ncclInProgress; /* the maker is sizing it */
      return nccl_emu_fail(ncclInvalidUsage,
                           "cuda_emu: %s: rank %d was given %d ranks, but the communicator's "
                           "segment is %lld bytes (another size)",
                           c->name, c->rank, c->nranks, (long long)st.st_size);
    }
  }
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return nccl_emu_fail(ncclSystemError, "cuda_emu: mapping %zu bytes of %s: %s", bytes, c->name,
                         strerror(e));
  c->seg = (emu_seg *)p, c->map_bytes = bytes;
  if (maker) c->seg->nranks = c->nranks;
  c->seg->joined.fetch_add(1);
  return ncclSuccess;
}

/* "ncclAllReduce(count=7 bf16 avg)" */
static void emu_sig_text(char *out, size_t n, const emu_sig &s) {
  const int k = s.kind >= 0 && s.kind <= OP_BCAST ? s.kind : 0;
  if (k == OP_SPLIT)
    snprintf(out, n, "ncclCommSplit");
  else
    snprintf(out, n, "%s(count=%llu type=%d redop=%d root=%d)", op_names[k],
             (unsigned long long)s.count, s.dtype, s.redop, s.root);
}

static bool emu_sig_equal(const emu_sig &a, const emu_sig &b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.redop == b.redop && a.root == b.root &&
         a.count == b.count;
}

/* Elements a round moves for c's op. */
static size_t emu_round_len(const ncclComm *c) {
  const emu_op &o = c->op;
  const size_t es = nccl_emu_size(o.dtype), left = o.count - o.done;
  const size_t per = o.kind == OP_REDUCESCATTER ? EMU_SLOT / (es * (size_t)c->nranks) : EMU_SLOT / es;
  return left < per ? left : per;
}

static float emu_load(const unsigned char *p, size_t i, ncclDataType_t t) {
  if (t == ncclBfloat16) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return kern_bf16_to_f32(h);
  }
  float f;
  memcpy(&f, p + 4 * i, 4);
  return f;
}

static void emu_store(unsigned char *p, size_t i, ncclDataType_t t, float v) {
  if (t == ncclBfloat16) {
    const uint16_t h = kern_f32_to_bf16(v);
    memcpy(p + 2 * i, &h, 2);
  } else {
    memcpy(p + 4 * i, &v, 4);
  }
}

/* out[0, len) = the reduction over ranks of slot(i) + off elements. */
static void emu_reduce(const ncclComm *c, unsigned char *out, size_t off, size_t len) {
  const ncclDataType_t t = c->op.dtype;
  const float pre = c->op.redop == ncclAvg ? 1.0f / (float)c->nranks : 1.0f;
  for (size_t e = 0; e < len; e++) {
    float acc = 0.0f;
    for (int i = 0; i < c->nranks; i++) {
      const float v = emu_load(emu_slot(c, i), off + e, t);
      acc += c->op.redop == ncclAvg ? v * pre : v;
    }
    emu_store(out, e, t, acc);
  }
}

/* Writes this rank's part of the round (len elements from done) into its slot. */
static void emu_write(ncclComm *c, size_t len) {
  emu_op &o = c->op;
  const size_t es = nccl_emu_size(o.dtype);
  unsigned char *mine = emu_slot(c, c->rank);
  emu_rank &me = c->seg->r[c->rank];
  switch (o.kind) {
  case OP_ALLGATHER:
  case OP_ALLREDUCE: memcpy(mine, o.send + o.done * es, len * es); break;
  case OP_BCAST:
    if (c->rank == o.root) memcpy(mine, o.send + o.done * es, len * es);
    break;
  case OP_REDUCESCATTER:
    for (int j = 0; j < c->nranks; j++)
      memcpy(mine + (size_t)j * len * es, o.send + ((size_t)j * o.count + o.done) * es, len * es);
    break;
  case OP_SPLIT: me.color = o.color, me.key = o.key; break;
  }
  me.sig = emu_sig{o.kind, (int32_t)o.dtype, (int32_t)o.redop, o.root, (uint64_t)o.count};
}

/* Reads the round (every rank has posted it) into this rank's output. */
static ncclResult_t emu_read(ncclComm *c, size_t len);

/* The split's result: this rank's child (or none), made from the colors and
 * keys every rank posted. */
static ncclResult_t emu_split_done(ncclComm *c) {
  emu_op &o = c->op;
  const unsigned index = c->splits++;
  if (o.color == NCCL_SPLIT_NOCOLOR) {
    *o.newcomm = nullptr;
    return ncclSuccess;
  }
  std::vector<std::pair<std::pair<int, int>, int>> members; /* ((key, rank), rank) */
  for (int i = 0; i < c->nranks; i++) {
    const int color = c->seg ? c->seg->r[i].color : o.color, key = c->seg ? c->seg->r[i].key : o.key;
    if (color == o.color) members.push_back({{key, i}, i});
  }
  std::sort(members.begin(), members.end());
  int me = 0;
  for (size_t k = 0; k < members.size(); k++)
    if (members[k].second == c->rank) me = (int)k;
  char name[EMU_NAME];
  if (snprintf(name, sizeof name, "%s.%u.%d", c->name, index, o.color) >= (int)sizeof name)
    return nccl_emu_fail(ncclInternalError, "cuda_emu: split name of %s too long", c->name);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = o.child_blocking;
  ncclComm *child = nccl_emu_new(&cfg, me, (int)members.size(), name);
  if (!child) return nccl_emu_fail(ncclSystemError, "cuda_emu: out of memory");
  if (child->nranks > 1) child->op.kind = OP_JOIN; /* joins on its own first poll */
  *o.newcomm = child;
  return ncclSuccess;
}

static ncclResult_t emu_read(ncclComm *c, size_t len) {
  emu_op &o = c->op;
  const size_t es = nccl_emu_size(o.dtype);
  /* every rank must have posted the same op */
  const emu_sig &mine = c->seg->r[c->rank].sig;
  for (int i = 0; i < c->nranks; i++) {
    const emu_sig &s = c->seg->r[i].sig;
    if (!emu_sig_equal(s, mine)) {
      char a[128], b[128];
      emu_sig_text(a, sizeof a, mine);
      emu_sig_text(b, sizeof b, s);
      return nccl_emu_fail(ncclInvalidUsage,
                           "cuda_emu: communicator %s, round %llu: rank %d called %s but rank %d "
                           "called %s: the ranks' collectives diverged",
                           c->name, (unsigned long long)c->round + 1, c->rank, a, i, b);
    }
  }
  switch (o.kind) {
  case OP_ALLGATHER:
    for (int i = 0; i < c->nranks; i++)
      memcpy(o.recv + ((size_t)i * o.count + o.done) * es, emu_slot(c, i), len * es);
    break;
  case OP_ALLREDUCE: emu_reduce(c, o.recv + o.done * es, 0, len); break;
  case OP_REDUCESCATTER: emu_reduce(c, o.recv + o.done * es, (size_t)c->rank * len, len); break;
  case OP_BCAST: memcpy(o.recv + o.done * es, emu_slot(c, o.root), len * es); break;
  case OP_SPLIT: return emu_split_done(c);
  }
  return ncclSuccess;
}

/* Every rank's counter `which` at least v? */
static bool emu_all(const ncclComm *c, bool posted, uint64_t v) {
  for (int i = 0; i < c->nranks; i++) {
    const emu_rank &r = c->seg->r[i];
    if ((posted ? r.posted : r.read).load(std::memory_order_acquire) < v) return false;
  }
  return true;
}

/* Advances c's op as far as it goes without waiting long for a peer:
 * ncclSuccess once it is done, ncclInProgress, or an error (sticky). */
static ncclResult_t emu_progress(ncclComm *c) {
  if (c->err != ncclSuccess) return c->err;
  emu_op &o = c->op;
  if (o.kind == OP_NONE) return ncclSuccess;
  if (o.kind == OP_JOIN) {
    if (!c->seg) {
      const ncclResult_t r = emu_attach(c);
      if (r == ncclInProgress) return r;
      if (r != ncclSuccess) return c->err = r;
    }
    for (int spin = 0; spin < 64; spin++) {
      if (c->seg->joined.load() >= (uint32_t)c->nranks) {
        shm_unlink(c->name); /* every rank has it mapped */
        o.kind = OP_NONE;
        return ncclSuccess;
      }
      sched_yield();
    }
    return ncclInProgress;
  }
  for (int spin = 0; spin < 64;) {
    const size_t len = o.kind == OP_SPLIT ? 0 : emu_round_len(c);
    if (!o.posted) {
      /* every rank has read the last round: the slots are free */
      if (!emu_all(c, false, c->round)) {
        sched_yield(), spin++;
        continue;
      }
      emu_write(c, len);
      c->seg->r[c->rank].posted.store(c->round + 1, std::memory_order_release);
      o.posted = true;
    }
    if (!emu_all(c, true, c->round + 1)) {
      sched_yield(), spin++;
      continue;
    }
    const ncclResult_t r = emu_read(c, len);
    if (r != ncclSuccess) return c->err = r;
    c->seg->r[c->rank].read.store(c->round + 1, std::memory_order_release);
    c->round++;
    o.posted = false;
    o.done += len;
    if (o.kind == OP_SPLIT || o.done >= o.count) {
      o.kind = OP_NONE;
      return ncclSuccess;
    }
  }
  return ncclInProgress;
}

/* One step of c's op from the host: with deferred streams, under the lock
 * its queued collectives run under. */
static ncclResult_t emu_host_step(ncclComm *c) {
  if (!emu::deferred()) return emu_progress(c);
  std::lock_guard<std::mutex> g(emu::stream_mu());
  return emu_progress(c);
}

/* A call's answer: a blocking communicator waits for its op here. */
static ncclResult_t emu_answer(ncclComm *c) {
  ncclResult_t r = emu_host_step(c);
  while (c->blocking && r == ncclInProgress) {
    const struct timespec ts = {0, 20000};
    nanosleep(&ts, nullptr);
    r = emu_host_step(c);
  }
  return r;
}

/* A collective of several ranks queued on its stream (CUDA_EMU_STREAMS=
 * deferred): it starts when the stream reaches it and the communicator has
 * no other op (a split), and runs a round each time the stream is driven
 * until done. A failure leaves it unfinished, as a GPU's failed collective
 * hangs its stream, until an abort ends it. */
static bool emu_queued_collective(uint64_t serial, const emu_op &want, bool *started) {
  ncclComm *c = nccl_emu_alive(serial);
  if (!c) return true; /* destroyed or aborted */
  if (c->err != ncclSuccess) return false;
  if (!*started) {
    if (c->op.kind != OP_NONE) return false;
    c->op = want;
    *started = true;
  }
  return emu_progress(c) == ncclSuccess;
}

/* A blocking communicator still joining (a child a non-blocking parent's
 * split made) finishes its join before its first call, as NCCL's would
 * have at the split. */
static ncclResult_t emu_join_blocking(ncclComm *c) {
  return c->blocking && c->op.kind == OP_JOIN ? emu_answer(c) : ncclSuccess;
}

/* One collective: a copy at one rank; at several, started (it runs as
 * ncclCommGetAsyncError is polled). send_n and recv_n are the buffers'
 * elements. */
static ncclResult_t emu_collective(int kind, const void *send, void *recv, size_t count,
                                   size_t send_n, size_t recv_n, ncclDataType_t t,
                                   ncclRedOp_t redop, int root, ncclComm_t c, cudaStream_t st) {
  const char *what = op_names[kind];
  if (!c) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: %s on a NULL communicator", what);
  if (c->err != ncclSuccess)
    return nccl_emu_fail(c->err, "cuda_emu: %s on a broken communicator", what);
  const ncclResult_t joined = emu_join_blocking(c);
  if (joined != ncclSuccess) return joined;
  if (c->op.kind != OP_NONE && !emu::deferred())
    return nccl_emu_fail(ncclInvalidUsage,
                         "cuda_emu: %s while %s still runs (poll ncclCommGetAsyncError "
                         "until it is done)",
                         what, op_names[c->op.kind]);
  const size_t es = nccl_emu_size(t);
  if (!es || (t != ncclFloat32 && t != ncclBfloat16 && kind != OP_ALLGATHER && kind != OP_BCAST))
    return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: %s: data type %d", what, (int)t);
  if (redop != ncclSum && redop != ncclAvg)
    return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: %s: reduction %d", what, (int)redop);
  if (root < 0 || root >= c->nranks)
    return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: %s: root %d of %d", what, root,
                         c->nranks);
  if (!count) return ncclSuccess;
  if ((send_n && !emu::device_range(send, send_n * es)) || !emu::device_range(recv, recv_n * es))
    return nccl_emu_fail(ncclInvalidArgument,
                         "cuda_emu: %s of %zu elements: a buffer is not device memory", what,
                         count);
  if (c->nranks == 1) {
    emu::enqueue(
        st,
        [send, recv, count, es]() {
          if (send != recv) memmove(recv, send, count * es);
          return true;
        },
        true);
    return ncclSuccess;
  }
  emu_op o;
  o.kind = kind;
  o.send = (const unsigned char *)send, o.recv = (unsigned char *)recv;
  o.count = count, o.dtype = t, o.redop = redop, o.root = root;
  if (emu::deferred()) {
    auto started = std::make_shared<bool>(false);
    const uint64_t serial = c->serial;
    emu::enqueue(
        st, [serial, o, started]() { return emu_queued_collective(serial, o, started.get()); },
        true);
    if (c->blocking) return ncclSuccess;
    /* as NCCL's may: still launching, until ncclCommGetAsyncError is polled */
    std::lock_guard<std::mutex> g(emu::stream_mu());
    c->launching = true;
    return ncclInProgress;
  }
  c->op = o;
  return emu_answer(c);
}

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static std::atomic<unsigned> made;
  uint64_t salt = 0;
  if (getrandom(&salt, sizeof salt, 0) != (ssize_t)sizeof salt) salt = (uint64_t)time(nullptr);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "/fsdp-nccl-emu.%d.%u.%016llx", (int)getpid(),
           made.fetch_add(1), (unsigned long long)salt);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
  *comm = nullptr;
  if (nranks < 1 || nranks > EMU_MAXR || rank < 0 || rank >= nranks)
    return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: rank %d of %d (the emulator takes up "
                         "to %d ranks)", rank, nranks, EMU_MAXR);
  char name[EMU_NAME];
  static_assert(sizeof id.internal < sizeof name, "an id fits a name");
  memcpy(name, id.internal, sizeof id.internal);
  name[sizeof id.internal] = 0;
  if (nranks > 1 && strncmp(name, "/fsdp-nccl-emu.", 15))
    return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: the unique id was not made by "
                         "ncclGetUniqueId");
  ncclComm *c = nccl_emu_new(config, rank, nranks, name);
  if (!c) return nccl_emu_fail(ncclSystemError, "cuda_emu: out of memory");
  *comm = c;
  if (nranks == 1) return c->blocking ? ncclSuccess : ncclInProgress;
  c->op.kind = OP_JOIN;
  const ncclResult_t r = emu_answer(c);
  return r == ncclSuccess && !c->blocking ? ncclInProgress : r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: split of a NULL communicator");
  if (comm->err != ncclSuccess)
    return nccl_emu_fail(comm->err, "cuda_emu: split of a broken communicator");
  const ncclResult_t joined = emu_join_blocking(comm);
  if (joined != ncclSuccess) return joined;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: split color %d", color);
  std::unique_lock<std::mutex> g(emu::stream_mu(), std::defer_lock);
  if (emu::deferred()) g.lock(); /* a queued collective may start meanwhile */
  if (comm->op.kind != OP_NONE)
    return nccl_emu_fail(ncclInvalidUsage, "cuda_emu: split while %s still runs",
                         op_names[comm->op.kind]);
  emu_op &o = comm->op;
  o = emu_op();
  o.kind = OP_SPLIT;
  o.color = color, o.key = key, o.newcomm = newcomm;
  o.child_blocking = !config || config->blocking != 0;
  if (comm->nranks == 1) { /* no peers: the child now */
    const ncclResult_t r = emu_split_done(comm);
    o.kind = OP_NONE;
    if (r != ncclSuccess) return r;
    return comm->blocking ? ncclSuccess : ncclInProgress;
  }
  *newcomm = nullptr;
  if (g.owns_lock()) g.unlock();
  const ncclResult_t r = emu_answer(comm);
  if (r == ncclSuccess && *newcomm && (*newcomm)->blocking) {
    const ncclResult_t j = emu_answer(*newcomm); /* a blocking child joins here */
    if (j != ncclSuccess) return j;
  }
  return r == ncclSuccess && !comm->blocking ? ncclInProgress : r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: NULL communicator");
  if (emu::deferred()) { /* collectives run on their streams; joins and splits here */
    std::lock_guard<std::mutex> g(emu::stream_mu());
    const int k = comm->op.kind;
    *state = comm->err != ncclSuccess           ? comm->err
             : k == OP_JOIN || k == OP_SPLIT ? emu_progress(comm)
             : comm->launching                 ? ncclInProgress
                                             : ncclSuccess;
    comm->launching = false;
    return ncclSuccess;
  }
  *state = emu_progress(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: finalize of NULL");
  return comm->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  nccl_emu_free(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  nccl_emu_free(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: NULL communicator");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: NULL communicator");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t st) {
  return emu_collective(OP_ALLREDUCE, send, recv, count, count, count, t, op, 0, comm, st);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t st) {
  const size_t n = comm ? (size_t)comm->nranks : 1;
  return emu_collective(OP_REDUCESCATTER, send, recv, recvcount, recvcount * n, recvcount, t, op,
                        0, comm, st);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t st) {
  const size_t n = comm ? (size_t)comm->nranks : 1;
  return emu_collective(OP_ALLGATHER, send, recv, sendcount, sendcount, sendcount * n, t, ncclSum,
                        0, comm, st);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t st) {
  const bool sends = comm && root == comm->rank;
  return emu_collective(OP_BCAST, send, recv, count, sends ? count : 0, count, t, ncclSum, root,
                        comm, st);
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t) { return nccl_emu_last; }

} /* extern "C" */
