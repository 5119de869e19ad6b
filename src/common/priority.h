// A group's priority on its devices, as the hook reads it from its environment:
// TESSERA_PRIORITY (high|low) and HAMi's CUDA_TASK_PRIORITY (0: high, 1: low). Where both
// are set the lower wins, as with limits: a second source can only lower a priority.
#pragma once

#include "common/error_text.h"

namespace tessera {

enum class Priority {
  none,  // neither protected from low-priority groups nor held back by high-priority ones
  high,  // low-priority groups keep out of its way
  low,   // waits while high-priority work is pending on its device
};

// False, with a message naming the variable and its value, if either is malformed.
bool priority_from_environment(Priority& priority, ErrorText& error);

// How much latency a high-priority group gives up to low-priority work, in percent of its
// launches' device time: TESSERA_PRIORITY_TOLERANCE, 1 to 100, default 10. False, with a
// message naming the variable and its value, if it is malformed.
inline constexpr unsigned kDefaultPriorityTolerance = 10;
bool priority_tolerance_from_environment(unsigned& percent, ErrorText& error);

// The lower of two settings; `none` says nothing and changes nothing.
Priority lower_priority(Priority a, Priority b);

// "high", "low" or "-".
const char* priority_name(Priority priority);

}  // namespace tessera
