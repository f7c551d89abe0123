// emu_launch.cpp — run_grid (validation, schedule, blocks over OS threads), the CUDA error strings, and
// the AddressSanitizer hook that names the faulting blockIdx/threadIdx.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "emu_block.h"
#include "emu_stats.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace simt::emu {
namespace {

// Largest dynamic shared memory a block may request (cudaFuncAttributeMaxDynamicSharedMemorySize opt-in
// maximum), per target. sm_80 cubins also run on sm_86 / sm_89, which offer only 99 KiB.
struct SmemTarget {
  const char* name;
  size_t bytes;
};
constexpr SmemTarget kSmemTargets[] = {
    {"sm_80", 163 * 1024}, {"sm_86", 99 * 1024}, {"sm_87", 163 * 1024}, {"sm_89", 99 * 1024}, {"sm_90", 227 * 1024},
};
constexpr size_t kDefaultMaxDynamicSmem = 163 * 1024;  // sm_80, the smallest GPU the project is built for

// MK_SIMT_MAX_DYN_SMEM = <bytes> | <target>[,<target>...] (the smallest of their limits); unset: sm_80's
// 163 KiB. `limit_name` describes the limit for error messages.
bool parse_smem_limit(size_t& limit, std::string& limit_name, std::string& error) {
  const char* env = std::getenv("MK_SIMT_MAX_DYN_SMEM");
  const std::string v = env ? env : "";
  if (v.empty()) {
    limit = kDefaultMaxDynamicSmem;
    limit_name = "the sm_80 limit of " + std::to_string(limit);
    return true;
  }
  if (v.find_first_not_of("0123456789") == std::string::npos && v.size() <= 12) {
    limit = std::strtoull(v.c_str(), nullptr, 10);
    limit_name = "the limit of " + v + " (MK_SIMT_MAX_DYN_SMEM)";
    return true;
  }
  limit = SIZE_MAX;
  for (size_t start = 0; start <= v.size();) {
    const size_t comma = std::min(v.find(',', start), v.size());
    const std::string t = v.substr(start, comma - start);
    const SmemTarget* hit = nullptr;
    for (const SmemTarget& k : kSmemTargets)
      if (t == k.name) hit = &k;
    if (!hit) {
      error = "SIMT emulator: MK_SIMT_MAX_DYN_SMEM='" + v +
              "' is not a byte count or a comma-separated list of sm_80, sm_86, sm_87, sm_89, sm_90";
      return false;
    }
    if (hit->bytes < limit) {
      limit = hit->bytes;
      limit_name = "the " + t + " limit of " + std::to_string(limit) + " (MK_SIMT_MAX_DYN_SMEM=" + v + ")";
    }
    start = comma + 1;
  }
  return true;
}

thread_local cudaError_t tl_last_error = cudaSuccess;
thread_local cudaError_t tl_detail_code = cudaSuccess;
thread_local std::string tl_detail;

cudaError_t fail(cudaError_t code, std::string detail) {
  tl_last_error = code;
  tl_detail_code = code;
  tl_detail = std::move(detail);
  return code;
}

// MK_SIMT_SCHEDULE = forward (default) | reverse | random | random:<seed>. `random` draws a fresh seed
// per launch; the seed is part of any failure report so the run can be replayed.
bool parse_schedule(Schedule& s, std::string& error) {
  const char* env = std::getenv("MK_SIMT_SCHEDULE");
  const std::string v = env ? env : "";
  if (v.empty() || v == "forward") {
    s = {ScheduleKind::Forward, 0};
  } else if (v == "reverse") {
    s = {ScheduleKind::Reverse, 0};
  } else if (v == "random") {
    s = {ScheduleKind::Random, std::random_device{}()};
  } else if (v.rfind("random:", 0) == 0 && v.size() > 7 &&
             v.find_first_not_of("0123456789", 7) == std::string::npos) {
    s = {ScheduleKind::Random, std::strtoull(v.c_str() + 7, nullptr, 10)};
  } else {
    error = "SIMT emulator: MK_SIMT_SCHEDULE='" + v + "' is not forward, reverse, random or random:<seed>";
    return false;
  }
  return true;
}

std::string schedule_name(const Schedule& s) {
  switch (s.kind) {
    case ScheduleKind::Forward: return "forward";
    case ScheduleKind::Reverse: return "reverse";
    case ScheduleKind::Random: return "random:" + std::to_string(s.seed);
  }
  return "?";
}

// MK_SIMT_THREADS: OS threads that run blocks. Default: one per core, at most 8 (on the 2-core dev box
// two threads emulate a 512-block rms_norm 1.3x faster than one, and tiny grids equally fast).
int os_threads() {
  if (const char* env = std::getenv("MK_SIMT_THREADS")) {
    const long v = std::strtol(env, nullptr, 10);
    if (v >= 1) return static_cast<int>(std::min<long>(v, 256));
  }
  static const int cores = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  return cores;
}

std::string dims(dim3 d) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", d.x, d.y, d.z);
  return buf;
}

// Persistent worker threads: a launch hands them a job, runs it on the caller too, waits for all.
// Each worker keeps its own BlockRunner (stacks, shared memory) across launches.
class WorkerPool {
 public:
  void run(int participants, const std::function<void()>& job) {
    std::lock_guard<std::mutex> serial(launch_mutex_);  // one multi-threaded launch at a time
    {
      std::unique_lock<std::mutex> lock(mutex_);
      while (static_cast<int>(threads_.size()) < participants - 1) {
        const int id = static_cast<int>(threads_.size());
        threads_.emplace_back([this, id] { worker(id); });
        threads_.back().detach();
      }
      job_ = &job;
      wanted_ = participants - 1;
      pending_ = wanted_;
      ++generation_;
    }
    work_cv_.notify_all();
    job();
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void worker(int id) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (id >= wanted_) continue;
      const std::function<void()>* job = job_;
      lock.unlock();
      (*job)();
      lock.lock();
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex launch_mutex_, mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<std::thread> threads_;
  const std::function<void()>* job_ = nullptr;
  int wanted_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
};

// After fork() the child has none of the parent's worker threads: it starts a new pool (the old object
// is leaked on purpose; its mutexes may be held by threads that no longer exist).
std::atomic<WorkerPool*> g_pool{nullptr};
WorkerPool& pool() {
  static const int registered = pthread_atfork(nullptr, nullptr, [] { g_pool.store(nullptr); });
  (void)registered;
  WorkerPool* p = g_pool.load();
  if (!p) {
    auto* fresh = new WorkerPool;
    if (g_pool.compare_exchange_strong(p, fresh)) return *fresh;
    delete fresh;
  }
  return *p;
}

}  // namespace

cudaError_t run_grid(const LaunchSpec& spec) {
  tl_last_error = cudaSuccess;
  const dim3 g = spec.grid, b = spec.block;
  if (g.x == 0 || g.y == 0 || g.z == 0) return cudaSuccess;  // empty problem, as portable.cuh on the GPU
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024)
    return fail(cudaErrorInvalidConfiguration,
                "SIMT emulator: blockDim " + dims(b) + " is invalid (each of x, y ≤ 1024, z ≤ 64, x·y·z ≤ 1024, none 0)");
  if (g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    return fail(cudaErrorInvalidConfiguration,
                "SIMT emulator: gridDim " + dims(g) + " is invalid (x < 2^31, y and z ≤ 65535)");
  size_t smem_limit = 0;
  std::string limit_name, error;
  if (!parse_smem_limit(smem_limit, limit_name, error)) return fail(cudaErrorInvalidValue, error);
  if (spec.smem_bytes > smem_limit)
    return fail(cudaErrorInvalidValue, "SIMT emulator: " + std::to_string(spec.smem_bytes) +
                                           " bytes of dynamic shared memory exceed " + limit_name + " (kernel " +
                                           kernel_name(spec.kernel) + ")");
  Schedule schedule;
  if (!parse_schedule(schedule, error)) return fail(cudaErrorInvalidValue, error);

  const bool stats = stats::enabled_by_env();
  if (stats) stats::launch_begin(spec);
  const uint64_t blocks = uint64_t{g.x} * g.y * g.z;
  const int participants = static_cast<int>(std::min<uint64_t>(os_threads(), blocks));
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex failure_mutex;
  Failure first;
  auto job = [&] {
    BlockRunner& runner = this_thread_runner();
    Failure failure;
    for (uint64_t blk; !failed.load(std::memory_order_relaxed) && (blk = next.fetch_add(1)) < blocks;) {
      if (!runner.run(spec, schedule, blk, failure, stats)) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failed.exchange(true)) first = failure;
        return;
      }
    }
  };
  if (participants <= 1)
    job();
  else
    pool().run(participants, std::function<void()>(job));
  if (stats) stats::launch_end();
  if (failed.load()) return fail(first.code, first.message + "\n  (schedule " + schedule_name(schedule) + ")");
  return cudaSuccess;
}

// ---- AddressSanitizer: say which simulated thread made the bad access ---------------------------------
#if defined(__SANITIZE_ADDRESS__)
namespace {
void asan_report_hook(const char*) {
  if (BlockRunner* r = BlockRunner::active())
    std::fprintf(stderr, "SIMT emulator: the AddressSanitizer error above happened in %s\n", r->where().c_str());
}
[[gnu::constructor]] void install_asan_hook() { __asan_set_error_report_callback(&asan_report_hook); }
}  // namespace
#endif

}  // namespace simt::emu

// ---- CUDA runtime error API ------------------------------------------------------------------------------
namespace {
const char* generic_message(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unrecognized error code";
}
}  // namespace

const char* cudaGetErrorString(cudaError_t err) {
  using namespace simt::emu;
  if (err == cudaSuccess || err != tl_detail_code || tl_detail.empty()) return generic_message(err);
  thread_local std::string text;
  text = std::string(generic_message(err)) + " — " + tl_detail;
  return text.c_str();
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = simt::emu::tl_last_error;
  simt::emu::tl_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return simt::emu::tl_last_error; }
