// ThreadIoEngine: an IoEngine (disk/io_engine.h) on a pool of threads calling pread/pwrite, for
// kernels and containers that refuse io_uring. Each request is one system call (EINTR retried,
// a short transfer returned as is).
//
// Thread safety: as IoEngine (one submitting and reaping thread); the workers are internal.
#ifndef PATRICKSTAR_DISK_THREAD_IO_ENGINE_H_
#define PATRICKSTAR_DISK_THREAD_IO_ENGINE_H_

#include <memory>

#include "disk/io_engine.h"

namespace ps {

// REQUIRES: thread_count >= 1.
std::unique_ptr<IoEngine> NewThreadIoEngine(int thread_count);

}  // namespace ps

#endif  // PATRICKSTAR_DISK_THREAD_IO_ENGINE_H_
