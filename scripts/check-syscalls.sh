#!/usr/bin/env bash
# Fails when store/ or fuse/ make a system call around Env (base/env.h):
# every call on the backing store must go through it, so that FaultEnv
# (tests/unit/fault_env.h) can make it fail. The POSIX Env itself
# (base/env_posix.cc, base/fd_path.cc) lives below them. Exempt, and why:
#   fuse/mount.cc       the mount table (/proc/self/mountinfo) and the
#                       mount's readahead (/sys/class/bdi), not the store.
# Left to the code: identity (geteuid, getpid), the thread's umask
# (unshare, umask), monotonic clocks (durations for logs and retries).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CALLS='open|openat|creat|read|pread|pread64|write|pwrite|pwrite64|readv|writev|fsync|fdatasync|syncfs|sync_file_range'
CALLS+='|rename|renameat|renameat2|unlink|unlinkat|rmdir|mkdir|mkdirat|mknod|mknodat|link|linkat|symlink|symlinkat'
CALLS+='|readlink|readlinkat|stat|lstat|fstat|fstatat|statx|statvfs|fstatvfs|access|faccessat|truncate|ftruncate'
CALLS+='|fallocate|posix_fallocate|posix_fadvise|flock|lockf|fcntl|chmod|fchmod|fchmodat|chown|fchown|fchownat|lchown'
CALLS+='|utimensat|futimens|setxattr|lsetxattr|fsetxattr|getxattr|lgetxattr|fgetxattr|listxattr|llistxattr'
CALLS+='|flistxattr|removexattr|lremovexattr|fremovexattr|opendir|fdopendir|readdir|lseek|copy_file_range|sendfile'
CALLS+='|clock_gettime|gettimeofday|time'
# The code calls the C library as ::name(...), by its global name.
PATTERN="(^|[^[:alnum:]_>])::($CALLS)[[:space:]]*\(|std::(filesystem|ifstream|ofstream|fstream)\b|system_clock"

bad=0
while IFS= read -r hit; do
  echo "check-syscalls: $hit: a system call around Env (base/env.h)" >&2
  bad=1
done < <(grep -rnE "$PATTERN" store fuse --include='*.h' --include='*.cc' |
           grep -vE '^fuse/mount\.cc:' |
           grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true)
if ((bad)); then exit 1; fi
echo "check-syscalls: ok (store/ and fuse/ reach the system through Env)"
