// plan_dump.cpp — prints the launch plans of csrc/kernels/attention_plan.h for tests/test_attention_plan.py
// (plain C++: attention_plan.h includes no CUDA header). Reads commands on stdin, one per line:
//   decode B head_blocks range requested sm_count   → "part_size partitions blocks"
//   prefill G BM q_0 q_1 ... q_{B-1}                 → "grid items idle covered" where items = Σ ceil(q_b·G/BM),
//       idle = grid indices prefill_locate_tile rejects, covered = 1 if every (b, tile < ceil(q_b·G/BM)) is
//       claimed by exactly one grid index (0 otherwise)
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
      const int64_t grid = mk::prefill_tile_start(cu.back(), B, G, BM);
      int64_t items = 0, idle = 0;
      for (int b = 0; b < B; ++b) items += ((cu[b + 1] - cu[b]) * G + BM - 1) / BM;
      std::map<std::pair<int, int>, int> claimed;
      for (int64_t t = 0; t < grid; ++t) {
        int b, tile;
        if (mk::prefill_locate_tile(cu.data(), B, t, G, BM, b, tile)) ++claimed[{b, tile}];
        else ++idle;
      }
      bool covered = static_cast<int64_t>(claimed.size()) == items;
      for (const auto& [key, n] : claimed)
        covered = covered && n == 1 && key.second * int64_t{BM} < (cu[key.first + 1] - cu[key.first]) * G;
      std::cout << grid << ' ' << items << ' ' << idle << ' ' << covered << '\n';
    } else if (!cmd.empty()) {
      std::cerr << "unknown command " << cmd << '\n';
      return 2;
    }
  }
}
