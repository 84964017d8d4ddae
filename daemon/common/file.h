/* file: opening a file in a directory someone else may write (a job's
 * attempt directory, owned by the ranks' user; a checkpoint's step
 * directory). Such a name may have been replaced by a link, a FIFO, a
 * directory or a device. A link is never followed (O_NOFOLLOW); the open
 * never waits (O_NONBLOCK: a FIFO with nobody at its other end would hold
 * an open for reading, or for writing, forever, and a libuv loop's thread
 * must never block); then anything but a regular file is refused, and
 * O_NONBLOCK is cleared again. */
#ifndef FSDP_FILE_H
#define FSDP_FILE_H

#include <sys/types.h>

/* open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, mode) as above:
 * 0 and *fd (blocking, close-on-exec) for a regular file. Else no
 * descriptor is left open and the code is FSDP_EFORMAT for something that
 * is not a regular file (a FIFO opened for writing with no reader fails at
 * once, ENXIO, and is one), else the open's errno mapped (FSDP_ENOENT for a
 * missing file); the message names path. */
int file_open_regular(const char *path, int flags, mode_t mode, int *fd);

/* Marks every descriptor from 3 up close-on-exec: what a process was
 * started with (a file its parent left open) does not pass on to the
 * programs it runs, which may run as a less trusted user. Its own it opens
 * close-on-exec already. */
void file_cloexec_inherited(void);

#endif
