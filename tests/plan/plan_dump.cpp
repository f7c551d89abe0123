// plan_dump.cpp — prints the launch plans of csrc/kernels/attention_plan.h for tests/test_attention_plan.py
// (plain C++: attention_plan.h includes no CUDA header). Reads commands on stdin, one per line:
//   decode B head_blocks range requested sm_count   → "part_size partitions blocks"
//   prefill G BM q_0 q_1 ... q_{B-1}                 → "grid items empty covered most": items = Σ ceil(q_b·G/BM),
//       the blocks x < grid run items x, x + grid, ... (prefill_item); empty = blocks that get no item,
//       covered = 1 if every (b, tile < ceil(q_b·G/BM)) is run exactly once and nothing else is (0 otherwise),
//       most = the most items one block runs
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention_plan.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "decode") {
      int64_t B, hb, range, req, sms;
      in >> B >> hb >> range >> req >> sms;
      const mk::DecodePlan p = mk::decode_plan(B, hb, range, req, sms);
      std::cout << p.part_size << ' ' << p.partitions << ' ' << p.blocks << '\n';
    } else if (cmd == "prefill") {
      int G, BM;
      in >> G >> BM;
      std::vector<int64_t> cu{0};
      for (int64_t q; in >> q;) cu.push_back(cu.back() + q);
      const int B = static_cast<int>(cu.size()) - 1;
      const int64_t grid = mk::prefill_grid(cu.back(), G, BM);
      int64_t items = 0, empty = 0, most = 0;
      for (int b = 0; b < B; ++b) items += mk::prefill_tiles(cu[b + 1] - cu[b], G, BM);
      std::map<std::pair<int, int>, int> claimed;
      for (int64_t x = 0; x < grid; ++x) {
        int b, tile, n = 0;
        for (int64_t t = x; mk::prefill_item(cu.data(), B, t, G, BM, b, tile); t += grid, ++n) ++claimed[{b, tile}];
        empty += n == 0;
        most = std::max<int64_t>(most, n);
      }
      bool covered = static_cast<int64_t>(claimed.size()) == items;
      for (const auto& [key, n] : claimed)
        covered = covered && n == 1 && key.second * int64_t{BM} < (cu[key.first + 1] - cu[key.first]) * G;
      std::cout << grid << ' ' << items << ' ' << empty << ' ' << covered << ' ' << most << '\n';
    } else if (!cmd.empty()) {
      std::cerr << "unknown command " << cmd << '\n';
      return 2;
    }
  }
}
