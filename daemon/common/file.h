/* file: opening a file in a directory someone else may write (a job's
 * attempt directory, owned by the ranks' user; a checkpoint's step
 * directory). Such a name may have been replaced by a link, a FIFO, a
 * directory or a device. A link is never followed (O_NOFOLLOW); the open
 * never waits (O_NONBLOCK: a FIFO with nobody at its other end would hold
 * an open for reading, or for writing, forever, and a libuv loop's thread
 * must never block); then anything but a regular file is refused, and
 * O_NONBLOCK is cleared again.
 *
 * And writing a file a user named (fsdp-train's save, fsdp-tokenize's -o,
 * an export) the way docs/FORMATS.md says every writer does: into a
 * temporary of its own beside it, renamed over the name once whole. A
 * rename replaces whatever is at the name, so what is there is looked at
 * first: a device, a FIFO, a socket or a directory is refused (renamed
 * over, /dev/null would become a regular file). */
#ifndef FSDP_FILE_H
#define FSDP_FILE_H

#include <stddef.h>
#include <sys/types.h>

/* open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, mode) as above:
 * 0 and *fd (blocking, close-on-exec) for a regular file. Else no
 * descriptor is left open and the code is FSDP_EFORMAT for something that
 * is not a regular file (a FIFO opened for writing with no reader fails at
 * once, ENXIO, and is one), else the open's errno mapped (FSDP_ENOENT for a
 * missing file); the message names path. */
int file_open_regular(const char *path, int flags, mode_t mode, int *fd);
/* The same for a path the user names (a job file given to --config): a
 * link is followed, as any program follows one, and the open still never
 * waits on a FIFO. */
int file_open_regular_named(const char *path, int flags, mode_t mode, int *fd);

/* Marks every descriptor from 3 up close-on-exec: what a process was
 * started with (a file its parent left open) does not pass on to the
 * programs it runs, which may run as a less trusted user. Its own it opens
 * close-on-exec already. */
void file_cloexec_inherited(void);

/* 0 when an output may be written at path by a temporary and a rename:
 * nothing is there (or a link to nothing), or a regular file (a link is
 * followed: one to /dev/null is refused too). Else FSDP_EINVAL, the message
 * naming key (the option: "save", "-o"), path, what is there and the fix;
 * for a directory, with the example of a file in it (example: "model.bin"). */
int file_output_check(const char *key, const char *path, const char *example);

/* Creates path's temporary, this process's alone: "<path>.tmp.<pid>", or,
 * where that name is taken (left by a killed writer whose pid this one has
 * now, or another host's writer in a shared directory), "<path>.tmp.<pid>.<8
 * random hex digits>". Opened O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
 * O_CLOEXEC, mode 0644 less the umask: a link planted at the name is never
 * written through, and no other writer's temporary is reused. 0, the name in
 * tmp (size bytes) and *fd; else the open's errno mapped, the message naming
 * tmp, nothing created. */
int file_temp_create(const char *path, char *tmp, size_t size, int *fd);

/* Puts the whole temporary tmp at path by rename, after a last
 * file_output_check (the one before the write may be minutes old). On
 * failure tmp is left for the caller to remove; the message names key. */
int file_temp_place(const char *key, const char *tmp, const char *path);

/* 1 when a and b name the same file: by device and inode where both exist
 * (a hard link, "./x" and "x"), else by name, each resolved as far as it
 * exists (realpath of its directory, then its last component). */
int file_same(const char *a, const char *b);

#endif
