// Which engine the disk tier's `auto` choice (disk/io_engine.h IoEngineKind::kAuto) takes on this
// machine, for tests that assert the engine that ran: io_uring where the kernel allows it, else
// the thread pool with the kernel's reason. A test that needs io_uring itself calls
// GTEST_SKIP() << "io_uring is refused here: " << IoUringRefusal() when the refusal is not empty,
// so a sandbox that refuses io_uring reports the test as skipped, never as passed on threads.
#ifndef PATRICKSTAR_DISK_TESTING_IO_URING_GATE_H_
#define PATRICKSTAR_DISK_TESTING_IO_URING_GATE_H_

#include <string>

namespace ps {

// Why the kernel refuses io_uring here (the strerror text of io_uring_queue_init's error), or ""
// when a ring opens.
std::string IoUringRefusal();

// The engine description a swap or probe opened with IoEngineKind::kAuto reports here:
// "io_uring", or "threads (io_uring refused: <IoUringRefusal()>)".
std::string ExpectedAutoEngine();

}  // namespace ps

#endif  // PATRICKSTAR_DISK_TESTING_IO_URING_GATE_H_
