// The seal planner that knows formats: it detects a closed file's format by
// its content, takes the layout of a file that says nothing of itself (TF
// data shard, ONNX external data, Orbax data file, legacy zarr chunk) from
// the files of its save, keeps exact what readers were served before the
// seal, and sets up the lossy coder. The store calls it through
// store/seal_plan.h and names no format itself.
#pragma once

#include "store/seal_plan.h"

namespace ckptfs {

// The planner a mount, import or recode passes the store (StoreOptions::planner).
const SealPlanner& FormatSealPlanner();

}  // namespace ckptfs
