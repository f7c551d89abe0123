// emu_stats.cpp — MK_SIMT_STATS counters (see emu_stats.h) and the address-sanitizer callbacks through
// which compiled kernel code reports its loads and stores.
#include "emu_stats.h"

#include <link.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "emu_block.h"

namespace simt::emu::stats {
namespace {

// An access site: an emulator instruction's source location (file pointer + line) or a code address.
struct Site {
  uintptr_t key;   // const char* file, or the pc
  uint32_t line;   // 0 for a pc
  bool operator<(const Site& o) const { return std::tie(key, line) < std::tie(o.key, o.line); }
  bool operator==(const Site& o) const { return key == o.key && line == o.line; }
};
struct SiteOp {
  Site site;
  bool shared, store;
  bool operator<(const SiteOp& o) const {
    return std::tie(site, shared, store) < std::tie(o.site, o.shared, o.store);
  }
};

struct Access {
  Site site;
  uintptr_t addr;
  uint32_t bytes;
  uint16_t thread;
  bool store;
};

struct Range {
  uintptr_t lo = 0, hi = 0;
  bool has(uintptr_t a) const { return a >= lo && a < hi; }
};

// Per OS thread: the block being run.
struct BlockState {
  Range smem, stacks, tls;
  int thread = 0;
  bool worked = false;
  std::vector<Access> trace;
  std::map<SiteOp, SiteStats> sites;
};
thread_local bool tl_on = false;  // a block runs on this OS thread with stats enabled
thread_local BlockState tl;

// Launch being recorded. One at a time: concurrent emulated launches from several host threads under
// MK_SIMT_STATS would mix their counters (the tests launch from one thread).
std::mutex g_mutex;
LaunchStats g_launch;
std::map<SiteOp, SiteStats> g_sites;
std::vector<LaunchStats> g_done;

// This OS thread's block of thread-local storage of the module that holds threadIdx: the kernels'
// static __shared__ arrays are thread_locals of that module (emu.h).
int find_tls(dl_phdr_info* info, size_t, void* out) {
  Range& r = *static_cast<Range*>(out);
  const auto probe = reinterpret_cast<uintptr_t>(&threadIdx);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_TLS || !info->dlpi_tls_data) continue;
    const auto lo = reinterpret_cast<uintptr_t>(info->dlpi_tls_data);
    if (probe >= lo && probe < lo + ph.p_memsz) {
      r = {lo, lo + ph.p_memsz};
      return 1;
    }
  }
  return 0;
}

bool is_index_variable(uintptr_t a) {
  auto in = [a](const void* v, size_t n) {
    const auto p = reinterpret_cast<uintptr_t>(v);
    return a >= p && a < p + n;
  };
  return in(&threadIdx, sizeof threadIdx) || in(&blockIdx, sizeof blockIdx) || in(&blockDim, sizeof blockDim) ||
         in(&gridDim, sizeof gridDim);
}

inline void record(Site site, uintptr_t addr, uint32_t bytes, bool store) {
  BlockState& b = tl;
  if (b.stacks.has(addr) || is_index_variable(addr)) return;  // locals, the emulator's index variables
  const bool shared = b.smem.has(addr) || b.tls.has(addr);
  if (store && !shared) b.worked = true;
  // The host compiler may split one 8- or 16-byte vector access of the kernel into scalar ones (each its own
  // site): an access that continues the same thread's previous one inside one 16-byte chunk extends it.
  if (!b.trace.empty()) {
    Access& prev = b.trace.back();
    if (prev.thread == b.thread && prev.store == store && prev.addr + prev.bytes == addr &&
        prev.bytes + bytes <= 16 && prev.addr / 16 == (addr + bytes - 1) / 16) {
      prev.bytes += bytes;
      return;
    }
  }
  b.trace.push_back({site, addr, bytes, static_cast<uint16_t>(b.thread), store});
}

// Distinct 4-byte words per bank over the given (address, bytes) accesses of one phase.
unsigned bank_degree(const std::vector<std::pair<uintptr_t, uint32_t>>& phase) {
  std::unordered_map<unsigned, std::unordered_set<uintptr_t>> banks;
  for (const auto& [addr, bytes] : phase)
    for (uintptr_t w = addr >> 2; w < (addr + bytes + 3) >> 2; ++w) banks[static_cast<unsigned>(w % 32)].insert(w);
  unsigned degree = 0;
  for (const auto& [bank, words] : banks) degree = std::max(degree, static_cast<unsigned>(words.size()));
  return degree;
}

void add_shared_phase(SiteStats& s, const std::vector<std::pair<uintptr_t, uint32_t>>& phase) {
  if (phase.empty()) return;
  const unsigned d = bank_degree(phase);
  s.wavefronts += d;
  s.ideal_wavefronts += 1;
  s.max_degree = std::max(s.max_degree, d);
}

void touch(SiteStats& s, uintptr_t addr, uint32_t bytes) {
  s.bytes += bytes;
  s.lo = std::min(s.lo, addr);
  s.hi = std::max(s.hi, static_cast<uintptr_t>(addr + bytes));
}

// Groups the block's trace into warp-level instructions: the k-th execution of a site by each lane of a warp.
void fold_trace(BlockState& b) {
  struct Key {
    Site site;
    bool store;
    int warp;
    uint32_t occurrence;
    bool operator<(const Key& o) const {
      return std::tie(site, store, warp, occurrence) < std::tie(o.site, o.store, o.warp, o.occurrence);
    }
  };
  std::map<std::tuple<Site, bool, int>, uint32_t> seen;  // (site, store, thread) → executions so far
  std::map<Key, std::vector<const Access*>> instructions;
  for (const Access& a : b.trace) {
    uint32_t& n = seen[{a.site, a.store, a.thread}];
    instructions[{a.site, a.store, a.thread / 32, n++}].push_back(&a);
  }
  for (const auto& [key, lanes] : instructions) {
    const bool shared = b.smem.has(lanes[0]->addr) || b.tls.has(lanes[0]->addr);
    SiteStats& s = b.sites[{key.site, shared, key.store}];
    s.shared = shared;
    s.store = key.store;
    s.instructions += 1;
    if (shared) {
      uint32_t widest = 0;
      for (const Access* a : lanes) widest = std::max(widest, a->bytes);
      const int per_phase = widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
      std::vector<std::vector<std::pair<uintptr_t, uint32_t>>> phases(32 / per_phase);
      for (const Access* a : lanes) {
        phases[(a->thread % 32) / per_phase].push_back({a->addr, a->bytes});
        touch(s, a->addr, a->bytes);
      }
      for (const auto& p : phases) add_shared_phase(s, p);
    } else {
      // Bytes used: distinct bytes (lanes reading the same address share the transfer).
      std::unordered_set<uintptr_t> sectors, used;
      for (const Access* a : lanes) {
        for (uintptr_t sec = a->addr >> 5; sec <= (a->addr + a->bytes - 1) >> 5; ++sec) sectors.insert(sec);
        for (uintptr_t byte = a->addr; byte < a->addr + a->bytes; ++byte) used.insert(byte);
        touch(s, a->addr, a->bytes);
      }
      uint64_t requested = 0;
      for (const Access* a : lanes) requested += a->bytes;
      s.bytes = s.bytes - requested + used.size();
      s.sectors += sectors.size();
    }
  }
  b.trace.clear();
}

void merge(SiteStats& into, const SiteStats& s) {
  into.shared = s.shared;
  into.store = s.store;
  into.instructions += s.instructions;
  into.bytes += s.bytes;
  into.sectors += s.sectors;
  into.wavefronts += s.wavefronts;
  into.ideal_wavefronts += s.ideal_wavefronts;
  into.max_degree = std::max(into.max_degree, s.max_degree);
  into.lo = std::min(into.lo, s.lo);
  into.hi = std::max(into.hi, s.hi);
}

std::string site_name(const Site& s) {
  char buf[64];
  if (s.line == 0) {
    std::snprintf(buf, sizeof buf, "pc 0x%zx", static_cast<size_t>(s.key));
    return buf;
  }
  const char* file = reinterpret_cast<const char*>(s.key);
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(s.line);
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

bool enabled_by_env() {
  const char* env = std::getenv("MK_SIMT_STATS");
  return env && env[0] && std::strcmp(env, "0") != 0;
}

void launch_begin(const LaunchSpec& spec) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_launch = {kernel_name(spec.kernel), spec.grid, spec.block, spec.smem_bytes, 0, 0, {}};
  g_sites.clear();
}

void launch_end() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [key, s] : g_sites) {
    SiteStats out = s;
    out.site = site_name(key.site);
    g_launch.sites.push_back(std::move(out));
  }
  g_done.push_back(std::move(g_launch));
  g_sites.clear();
}

void block_begin(const BlockContext& ctx) {
  BlockState& b = tl;
  if (b.tls.hi == 0) dl_iterate_phdr(&find_tls, &b.tls);
  b.smem = {reinterpret_cast<uintptr_t>(ctx.smem_lo), reinterpret_cast<uintptr_t>(ctx.smem_hi)};
  b.stacks = {reinterpret_cast<uintptr_t>(ctx.stacks_lo), reinterpret_cast<uintptr_t>(ctx.stacks_hi)};
  b.worked = false;
  b.trace.clear();
  b.sites.clear();
  tl_on = true;
}

void block_end(bool completed) {
  tl_on = false;
  BlockState& b = tl;
  fold_trace(b);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!completed) return;
  g_launch.blocks += 1;
  g_launch.empty_blocks += !b.worked;
  for (const auto& [key, s] : b.sites) merge(g_sites[key], s);
}

void set_thread(int index) { tl.thread = index; }
void note_sync() {
  if (tl_on) tl.worked = true;
}

void access(const void* addr, unsigned bytes, bool store, SrcLoc site) {
  if (!tl_on || bytes == 0) return;
  record({reinterpret_cast<uintptr_t>(site.file_name()), site.line()}, reinterpret_cast<uintptr_t>(addr), bytes, store);
}

void ldmatrix_phase(const uintptr_t* rows, SrcLoc site) {
  if (!tl_on) return;
  SiteStats& s = tl.sites[{{reinterpret_cast<uintptr_t>(site.file_name()), site.line()}, true, false}];
  s.shared = true;
  s.instructions += 1;
  std::vector<std::pair<uintptr_t, uint32_t>> phase;
  for (int r = 0; r < 8; ++r) {
    phase.push_back({rows[r], 16});
    touch(s, rows[r], 16);
  }
  add_shared_phase(s, phase);
}

std::vector<LaunchStats> launches() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_done;
}

void clear() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_done.clear();
}

std::string json(bool reset) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string out = "[";
  char buf[512];
  for (size_t i = 0; i < g_done.size(); ++i) {
    const LaunchStats& l = g_done[i];
    std::snprintf(buf, sizeof buf,
                  "%s{\"kernel\": \"%s\", \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u], \"smem_bytes\": %zu, "
                  "\"blocks\": %llu, \"empty_blocks\": %llu, \"sites\": [",
                  i ? ", " : "", "%s", l.grid.x, l.grid.y, l.grid.z, l.block.x, l.block.y, l.block.z, l.smem_bytes,
                  static_cast<unsigned long long>(l.blocks), static_cast<unsigned long long>(l.empty_blocks));
    std::string head = buf;
    head.replace(head.find("%s"), 2, escape(l.kernel));
    out += head;
    for (size_t j = 0; j < l.sites.size(); ++j) {
      const SiteStats& s = l.sites[j];
      std::snprintf(buf, sizeof buf,
                    "%s{\"site\": \"%s\", \"space\": \"%s\", \"op\": \"%s\", \"instructions\": %llu, \"bytes\": %llu, "
                    "\"sectors\": %llu, \"efficiency\": %.6f, \"wavefronts\": %llu, \"ideal_wavefronts\": %llu, "
                    "\"max_degree\": %u, \"lo\": %zu, \"hi\": %zu}",
                    j ? ", " : "", escape(s.site).c_str(), s.shared ? "shared" : "global", s.store ? "store" : "load",
                    static_cast<unsigned long long>(s.instructions), static_cast<unsigned long long>(s.bytes),
                    static_cast<unsigned long long>(s.sectors), s.efficiency(),
                    static_cast<unsigned long long>(s.wavefronts), static_cast<unsigned long long>(s.ideal_wavefronts),
                    s.max_degree, static_cast<size_t>(s.lo), static_cast<size_t>(s.hi));
      out += buf;
    }
    out += "]}";
  }
  out += "]";
  if (reset) g_done.clear();
  return out;
}

}  // namespace simt::emu::stats

// ---- the compiler's access callbacks (-fsanitize=kernel-address, outline calls) ---------------------------
// Compiled kernel code calls these before each load / store; outside a stats block they return at once.
// Not in AddressSanitizer builds: there the ASan runtime owns these names.
#if !defined(__SANITIZE_ADDRESS__)
namespace {
inline void hook(void* pc, uintptr_t addr, uint32_t bytes, bool store) {
  if (__builtin_expect(!simt::emu::stats::tl_on, 1)) return;
  simt::emu::stats::record({reinterpret_cast<uintptr_t>(pc), 0}, addr, bytes, store);
}
}  // namespace

#define SIMT_STATS_HOOKS(N)                                                                             \
  extern "C" [[gnu::noinline]] void __asan_load##N##_noabort(void* a) {                              \
    hook(__builtin_return_address(0), reinterpret_cast<uintptr_t>(a), N, false);                        \
  }                                                                                                     \
  extern "C" [[gnu::noinline]] void __asan_store##N##_noabort(void* a) {                             \
    hook(__builtin_return_address(0), reinterpret_cast<uintptr_t>(a), N, true);                         \
  }
SIMT_STATS_HOOKS(1)
SIMT_STATS_HOOKS(2)
SIMT_STATS_HOOKS(4)
SIMT_STATS_HOOKS(8)
SIMT_STATS_HOOKS(16)
#undef SIMT_STATS_HOOKS
// (void*, ...): the signatures gcc declares for these built-ins.
extern "C" [[gnu::noinline]] void __asan_loadN_noabort(void* a, long n) {
  hook(__builtin_return_address(0), reinterpret_cast<uintptr_t>(a), static_cast<uint32_t>(n), false);
}
extern "C" [[gnu::noinline]] void __asan_storeN_noabort(void* a, long n) {
  hook(__builtin_return_address(0), reinterpret_cast<uintptr_t>(a), static_cast<uint32_t>(n), true);
}
extern "C" void __asan_handle_no_return() {}
// Initialization-order bracketing the instrumentation emits around dynamic initializers: nothing to do.
extern "C" void __asan_before_dynamic_init(const void*) {}
extern "C" void __asan_after_dynamic_init() {}
#endif

// The Python accessor (mistral_kernels.emulated.simt_stats) reads this through ctypes.
extern "C" [[gnu::visibility("default")]] const char* mk_simt_stats_json(int reset) {
  thread_local std::string text;
  text = simt::emu::stats::json(reset != 0);
  return text.c_str();
}
