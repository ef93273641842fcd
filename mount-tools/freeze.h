// `ckptfs freeze MOUNTPOINT` and `ckptfs thaw MOUNTPOINT`: a live store
// held still for a backup. Freeze pushes the kernel's dirty pages to the
// daemon (syncfs), then stops the daemon (SIGSTOP) and waits until every
// one of its threads has stopped, so that nothing in the store changes
// until thaw (SIGCONT). A copy of the store taken meanwhile is what a crash
// at that moment would leave: fsck finds it clean, and mounting it
// recovers (reseals files that were still staged). While frozen, every
// access to the mount waits.
#pragma once

#include <string>

namespace ckptfs {

// 0 done, 2 error (not a ckptfs mount, a cluster store, no daemon).
int RunFreeze(const std::string& mountpoint, double timeout_s);
int RunThaw(const std::string& mountpoint);

}  // namespace ckptfs
