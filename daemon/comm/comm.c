/* comm: the backend-independent front of the collectives: argument checks,
 * the blocking forms and names. What runs an op is the backend's (the ring:
 * ring.c and the files ring_impl.h lists). */
#include "daemon/comm/comm.h"

#include <stdint.h>

#include "daemon/common/err.h"

const char *comm_op_name(comm_op_t op) {
  switch (op) {
    case COMM_OP_ALL_GATHER: return "all_gather";
    case COMM_OP_REDUCE_SCATTER: return "reduce_scatter";
    case COMM_OP_ALL_REDUCE: return "all_reduce";
    case COMM_OP_BROADCAST: return "broadcast";
    case COMM_OP_BARRIER: return "barrier";
    default: return "unknown_op";
  }
}

const char *comm_dtype_name(comm_dtype_t dt) {
  return dt == COMM_F32 ? "f32" : dt == COMM_BF16 ? "bf16" : "unknown_dtype";
}

size_t comm_dtype_size(comm_dtype_t dt) { return dt == COMM_F32 ? 4 : dt == COMM_BF16 ? 2 : 0; }

int comm_supports(const comm_t *c, comm_op_t op, comm_dtype_t dt) {
  if (!c || (unsigned)op >= COMM_OP__COUNT || (unsigned)dt >= COMM_DTYPE__COUNT) return 0;
  return c->be->supports(op, dt);
}

int comm_issue(comm_t *c, const comm_args_t *a, comm_req_t **req) {
  *req = NULL;
  if (!c || !a) return err_set(FSDP_EINVAL, "comm_issue: NULL communicator or arguments");
  const char *on = comm_op_name(a->op);
  if ((unsigned)a->op >= COMM_OP__COUNT || (unsigned)a->dtype >= COMM_DTYPE__COUNT)
    return err_set(FSDP_EINVAL, "group '%s' rank %d: op %d / dtype %d out of range", c->name,
                   c->rank, (int)a->op, (int)a->dtype);
  if (!c->be->supports(a->op, a->dtype))
    return err_set(FSDP_EUNSUPPORTED, "group '%s': backend %s does not run %s on %s", c->name,
                   c->be->name, on, comm_dtype_name(a->dtype));
  if ((a->op == COMM_OP_REDUCE_SCATTER || a->op == COMM_OP_ALL_REDUCE) &&
      (unsigned)a->redop >= COMM_REDOP__COUNT)
    return err_set(FSDP_EINVAL, "group '%s' rank %d: %s with reduction %d (use COMM_SUM or COMM_AVG)",
                   c->name, c->rank, on, (int)a->redop);
  if (a->op == COMM_OP_BROADCAST && (a->root < 0 || a->root >= c->size))
    return err_set(FSDP_EINVAL, "group '%s' rank %d: broadcast root %d is not a rank of a group of %d",
                   c->name, c->rank, a->root, c->size);
  if (a->timeout_ms < 0)
    return err_set(FSDP_EINVAL, "group '%s': %s timeout %lld ms is negative (0 means the default)",
                   c->name, on, (long long)a->timeout_ms);
  if (a->op != COMM_OP_BARRIER) {
    size_t esz = comm_dtype_size(a->dtype);
    size_t total = a->count;
    int per_rank = a->op == COMM_OP_ALL_GATHER || a->op == COMM_OP_REDUCE_SCATTER;
    if (per_rank && total > SIZE_MAX / (size_t)c->size) total = SIZE_MAX;
    else if (per_rank) total *= (size_t)c->size;
    if (total > SIZE_MAX / 2 / esz)
      return err_set(FSDP_EINVAL, "group '%s' rank %d: %s count %zu is too large", c->name,
                     c->rank, on, a->count);
    if (a->count && (!a->recv || (a->op != COMM_OP_BROADCAST && !a->send)))
      return err_set(FSDP_EINVAL, "group '%s' rank %d: %s of %zu elements with a NULL buffer",
                     c->name, c->rank, on, a->count);
  }
  return c->be->issue(c, a, req);
}

int comm_wait(comm_req_t *req, int64_t wait_ms) {
  if (!req) return err_set(FSDP_EINVAL, "comm_wait: NULL request");
  return req->be->wait(req, wait_ms);
}

static comm_args_t comm_args(comm_op_t op, const void *send, void *recv, size_t count,
                             comm_dtype_t dt, comm_redop_t redop, int root) {
  comm_args_t a = {.op = op, .dtype = dt, .redop = redop, .send = send, .recv = recv,
                   .count = count, .root = root, .timeout_ms = 0};
  return a;
}

int comm_iall_gather(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                     comm_req_t **req) {
  comm_args_t a = comm_args(COMM_OP_ALL_GATHER, send, recv, count, dt, COMM_SUM, 0);
  return comm_issue(c, &a, req);
}

int comm_ireduce_scatter(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                         comm_redop_t redop, comm_req_t **req) {
  comm_args_t a = comm_args(COMM_OP_REDUCE_SCATTER, send, recv, count, dt, redop, 0);
  return comm_issue(c, &a, req);
}

int comm_iall_reduce(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                     comm_redop_t redop, comm_req_t **req) {
  comm_args_t a = comm_args(COMM_OP_ALL_REDUCE, send, recv, count, dt, redop, 0);
  return comm_issue(c, &a, req);
}

int comm_ibroadcast(comm_t *c, void *buf, size_t count, comm_dtype_t dt, int root,
                    comm_req_t **req) {
  comm_args_t a = comm_args(COMM_OP_BROADCAST, buf, buf, count, dt, COMM_SUM, root);
  return comm_issue(c, &a, req);
}

int comm_ibarrier(comm_t *c, comm_req_t **req) {
  comm_args_t a = comm_args(COMM_OP_BARRIER, NULL, NULL, 0, COMM_F32, COMM_SUM, 0);
  return comm_issue(c, &a, req);
}

int comm_run(comm_t *c, const comm_args_t *a) {
  comm_req_t *req;
  int rc = comm_issue(c, a, &req);
  return rc < 0 ? rc : comm_wait(req, -1);
}

int comm_all_gather(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt) {
  comm_args_t a = comm_args(COMM_OP_ALL_GATHER, send, recv, count, dt, COMM_SUM, 0);
  return comm_run(c, &a);
}

int comm_reduce_scatter(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                        comm_redop_t redop) {
  comm_args_t a = comm_args(COMM_OP_REDUCE_SCATTER, send, recv, count, dt, redop, 0);
  return comm_run(c, &a);
}

int comm_all_reduce(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                    comm_redop_t redop) {
  comm_args_t a = comm_args(COMM_OP_ALL_REDUCE, send, recv, count, dt, redop, 0);
  return comm_run(c, &a);
}

int comm_broadcast(comm_t *c, void *buf, size_t count, comm_dtype_t dt, int root) {
  comm_args_t a = comm_args(COMM_OP_BROADCAST, buf, buf, count, dt, COMM_SUM, root);
  return comm_run(c, &a);
}

int comm_barrier(comm_t *c) {
  comm_args_t a = comm_args(COMM_OP_BARRIER, NULL, NULL, 0, COMM_F32, COMM_SUM, 0);
  return comm_run(c, &a);
}

int comm_split(comm_t *c, int color, int key, const char *name, int64_t timeout_ms,
               comm_t **out) {
  *out = NULL;
  if (!c) return err_set(FSDP_EINVAL, "comm_split: NULL communicator");
  if (!name || !*name)
    return err_set(FSDP_EINVAL, "comm_split of group '%s': the new group needs a name", c->name);
  if (timeout_ms < 0)
    return err_set(FSDP_EINVAL, "comm_split of group '%s': timeout %lld ms is negative (0 means "
                   "the default)", c->name, (long long)timeout_ms);
  return c->be->split(c, color, key, name, timeout_ms, out);
}

int comm_rank(const comm_t *c) { return c->rank; }
int comm_size(const comm_t *c) { return c->size; }
const char *comm_name(const comm_t *c) { return c->name; }
const comm_backend_t *comm_backend(const comm_t *c) { return c->be; }
size_t comm_buffer_bytes(const comm_backend_t *be, int size) { return be->buffer_bytes(size); }

void comm_abort(comm_t *c) {
  if (c) c->be->abort(c);
}

void comm_destroy(comm_t *c) {
  if (c) c->be->destroy(c);
}
