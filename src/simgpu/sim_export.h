// What the simulated libraries export: the functions of NVIDIA's libcuda.so.1 and
// libnvidia-ml.so.1 they implement, with C names; everything else stays hidden.
#pragma once

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))
