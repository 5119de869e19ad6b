#include "common/priority.h"

#include <cstdlib>
#include <cstring>

#include "contract/variables.h"

namespace tessera {
namespace {

// Reads one variable: `high_word` or `low_word` (`choices` says so to people); unset or empty
// leaves `priority` as it is.
bool read_priority(const char* variable, const char* high_word, const char* low_word,
                   const char* choices, Priority& priority, ErrorText& error) {
  const char* value = std::getenv(variable);
  if (value == nullptr || value[0] == '\0') return true;
  if (std::strcmp(value, low_word) == 0) {
    priority = lower_priority(priority, Priority::low);
  } else if (std::strcmp(value, high_word) == 0) {
    priority = lower_priority(priority, Priority::high);
  } else {
    return error.set("%s='%s' must be %s", variable, value, choices);
  }
  return true;
}

}  // namespace

Priority lower_priority(Priority a, Priority b) {
  if (a == Priority::low || b == Priority::low) return Priority::low;
  if (a == Priority::high || b == Priority::high) return Priority::high;
  return Priority::none;
}

const char* priority_name(Priority priority) {
  switch (priority) {
    case Priority::high:
      return "high";
    case Priority::low:
      return "low";
    case Priority::none:
      break;
  }
  return "-";
}

bool priority_from_environment(Priority& priority, ErrorText& error) {
  priority = Priority::none;
  return read_priority(contract::kPriorityVariable, "high", "low", "high or low", priority,
                       error) &&
         read_priority(contract::kHamiPriorityVariable, "0", "1", "0 (high) or 1 (low)", priority,
                       error);
}

bool priority_tolerance_from_environment(unsigned& percent, ErrorText& error) {
  percent = kDefaultPriorityTolerance;
  const char* value = std::getenv(contract::kPriorityToleranceVariable);
  if (value == nullptr || value[0] == '\0') return true;
  unsigned parsed = 0;
  int digits = 0;
  for (const char* c = value; *c != '\0'; ++c, ++digits) {
    if (*c < '0' || *c > '9' || digits >= 3) {
      return error.set("%s='%.32s' must be a percentage from 1 to 100",
                       contract::kPriorityToleranceVariable, value);
    }
    parsed = parsed * 10 + static_cast<unsigned>(*c - '0');
  }
  if (parsed < 1 || parsed > 100) {
    return error.set("%s='%.32s' must be a percentage from 1 to 100",
                     contract::kPriorityToleranceVariable, value);
  }
  percent = parsed;
  return true;
}

}  // namespace tessera
