#include "store/write_behind.h"

#include <fcntl.h>

namespace ckptfs {

void WriteBehind::Wrote(uint64_t end) {
  if (window_ == 0) return;
  while (end >= started_ + window_) {
    (void)env_->SyncFileRange(fd_, started_, window_, SYNC_FILE_RANGE_WRITE);
    started_ += window_;
    // One window stays in flight while the next fills.
    if (started_ >= dropped_ + 2 * window_) {
      (void)env_->SyncFileRange(fd_, dropped_, window_,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      (void)env_->Fadvise(fd_, dropped_, window_, POSIX_FADV_DONTNEED);
      dropped_ += window_;
    }
  }
}

}  // namespace ckptfs
