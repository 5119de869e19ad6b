// The simulated GPU's MIG tables: the GPU instance profiles of each GPU family it simulates,
// where each may start, and lookups over them. Header-only constants, for sim_nvml_mig.cpp.
#pragma once

namespace tessera::sim {

// The simulated GPU's MIG profiles: its own tables, written from NVIDIA's MIG user guide and
// what an H200 reported through NVML, not shared with Tessera's planner (whose catalog the
// tests compare with these). One row per GPU instance profile.
struct SimMigProfile {
  unsigned index;  // NVML_GPU_INSTANCE_PROFILE_*
  unsigned id;
  const char* name;
  unsigned compute_slices, size, instances;
  unsigned starts;  // bit i: may start at memory slice i
  unsigned long long memory_mib;
  unsigned sms;
};
struct SimMigTable {
  const SimMigProfile* rows;
  int count;
};

// NVIDIA's GPUs of eight memory slices share placements: 1g anywhere but the last slice, 1g
// with two slices and 2g on even slices (2g not the last pair), 3g at 0 or 4, 4g and 7g at 0.
inline constexpr unsigned kAnyButLast = 0x7f, kEven = 0x55, kEvenNotLast = 0x15, kHalves = 0x11,
                          kFirst = 0x01;
inline constexpr SimMigProfile kA100_40[] = {
    {0, 19, "MIG 1g.5gb", 1, 1, 7, kAnyButLast, 4864, 14},
    {7, 20, "MIG 1g.5gb+me", 1, 1, 1, kAnyButLast, 4864, 14},
    {9, 15, "MIG 1g.10gb", 1, 2, 4, kEven, 9856, 14},
    {1, 14, "MIG 2g.10gb", 2, 2, 3, kEvenNotLast, 9856, 28},
    {2, 9, "MIG 3g.20gb", 3, 4, 2, kHalves, 20096, 42},
    {3, 5, "MIG 4g.20gb", 4, 4, 1, kFirst, 20096, 56},
    {4, 0, "MIG 7g.40gb", 7, 8, 1, kFirst, 40448, 98},
};
inline constexpr SimMigProfile kA100_80[] = {
    {0, 19, "MIG 1g.10gb", 1, 1, 7, kAnyButLast, 9728, 14},
    {7, 20, "MIG 1g.10gb+me", 1, 1, 1, kAnyButLast, 9728, 14},
    {9, 15, "MIG 1g.20gb", 1, 2, 4, kEven, 19968, 14},
    {1, 14, "MIG 2g.20gb", 2, 2, 3, kEvenNotLast, 19968, 28},
    {2, 9, "MIG 3g.40gb", 3, 4, 2, kHalves, 40192, 42},
    {3, 5, "MIG 4g.40gb", 4, 4, 1, kFirst, 40192, 56},
    {4, 0, "MIG 7g.80gb", 7, 8, 1, kFirst, 80896, 98},
};
inline constexpr SimMigProfile kH100[] = {
    {0, 19, "MIG 1g.10gb", 1, 1, 7, kAnyButLast, 9984, 16},
    {7, 20, "MIG 1g.10gb+me", 1, 1, 1, kAnyButLast, 9984, 16},
    {9, 15, "MIG 1g.20gb", 1, 2, 4, kEven, 20096, 26},
    {1, 14, "MIG 2g.20gb", 2, 2, 3, kEvenNotLast, 20096, 32},
    {2, 9, "MIG 3g.40gb", 3, 4, 2, kHalves, 40448, 60},
    {3, 5, "MIG 4g.40gb", 4, 4, 1, kFirst, 40448, 64},
    {4, 0, "MIG 7g.80gb", 7, 8, 1, kFirst, 81152, 132},
};
inline constexpr SimMigProfile kH200[] = {
    // as an H200 reported them
    {0, 19, "MIG 1g.18gb", 1, 1, 7, kAnyButLast, 16384, 16},
    {1, 14, "MIG 2g.35gb", 2, 2, 3, kEvenNotLast, 33280, 32},
    {2, 9, "MIG 3g.71gb", 3, 4, 2, kHalves, 71424, 60},
    {3, 5, "MIG 4g.71gb", 4, 4, 1, kFirst, 71424, 64},
    {4, 0, "MIG 7g.141gb", 7, 8, 1, kFirst, 143360, 132},
    {7, 20, "MIG 1g.18gb+me", 1, 1, 1, kAnyButLast, 16384, 16},
    {9, 15, "MIG 1g.35gb", 1, 2, 4, kEven, 33280, 26},
};
inline constexpr SimMigProfile kA30[] = {
    // four memory slices, four compute slices
    {0, 14, "MIG 1g.6gb", 1, 1, 4, 0xf, 5952, 14},
    {7, 21, "MIG 1g.6gb+me", 1, 1, 1, 0xf, 5952, 14},
    {1, 5, "MIG 2g.12gb", 2, 2, 2, 0x5, 12032, 28},
    {8, 6, "MIG 2g.12gb+me", 2, 2, 1, 0x5, 12032, 28},
    {3, 0, "MIG 4g.24gb", 4, 4, 1, 0x1, 24320, 56},
};
inline constexpr SimMigTable kMigTables[] = {
    {kA100_40, 7}, {kA100_80, 7}, {kH100, 7}, {kH200, 7}, {kA30, 5},
};

inline constexpr unsigned kComputeProfileSlices[] = {1, 2, 3, 4, 7, 8, 6};  // by CI profile index

inline const SimMigProfile* profile_by_index(const SimMigTable& table, unsigned index) {
  for (int i = 0; i < table.count; ++i) {
    if (table.rows[i].index == index) return &table.rows[i];
  }
  return nullptr;
}
inline const SimMigProfile* profile_by_id(const SimMigTable& table, unsigned id) {
  for (int i = 0; i < table.count; ++i) {
    if (table.rows[i].id == id) return &table.rows[i];
  }
  return nullptr;
}

inline int memory_slices(const SimMigTable& table) {
  int most = 0;
  for (int i = 0; i < table.count; ++i) {
    const int end =
        32 - __builtin_clz(table.rows[i].starts) - 1 + static_cast<int>(table.rows[i].size);
    if (end > most) most = end;
  }
  return most;
}

}  // namespace tessera::sim
