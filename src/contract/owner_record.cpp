#include "contract/owner_record.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "base/files.h"
#include "kube/json_input.h"

namespace tessera::contract {
namespace {

constexpr std::size_t kMostRecordBytes = 64 << 10;
constexpr std::size_t kMostIds = 256;
constexpr std::size_t kMostText = 253;

std::string text_field(const nlohmann::json& json, const char* name) {
  const auto found = json.find(name);
  if (found == json.end() || found->is_null()) return {};
  if (!found->is_string() || found->get_ref<const std::string&>().size() > kMostText) {
    throw std::runtime_error(fmt::format("{} is not a name", name));
  }
  return found->get<std::string>();
}

}  // namespace

nlohmann::json owner_record_json(const OwnerRecord& record) {
  return {{"resource", record.resource},
          {"device_ids", record.device_ids},
          {"gpus", record.gpus},
          {"sequence", record.sequence},
          {"namespace", record.pod_namespace},
          {"pod", record.pod_name},
          {"uid", record.pod_uid},
          {"container", record.container},
          {"limits_written", record.limits_written}};
}

OwnerRecord owner_record_from_json(const nlohmann::json& json) {
  if (!json.is_object()) throw std::runtime_error("not an object");
  OwnerRecord record;
  record.resource = text_field(json, "resource");
  record.pod_namespace = text_field(json, "namespace");
  record.pod_name = text_field(json, "pod");
  record.pod_uid = text_field(json, "uid");
  record.container = text_field(json, "container");
  if (const auto ids = json.find("device_ids"); ids != json.end()) {
    if (!ids->is_array() || ids->size() > kMostIds)
      throw std::runtime_error("device_ids is not a list");
    for (const auto& id : *ids) {
      if (!id.is_string() || id.get_ref<const std::string&>().size() > kMostText) {
        throw std::runtime_error("device_ids holds something other than an ID");
      }
      record.device_ids.push_back(id.get<std::string>());
    }
  }
  if (const auto gpus = json.find("gpus"); gpus != json.end()) {
    if (!gpus->is_array() || gpus->size() > kMostIds)
      throw std::runtime_error("gpus is not a list");
    for (const auto& gpu : *gpus) {
      if (!gpu.is_number_integer() || gpu.get<std::int64_t>() < 0 ||
          gpu.get<std::int64_t>() > 4096) {
        throw std::runtime_error("gpus holds something other than a GPU index");
      }
      record.gpus.push_back(gpu.get<int>());
    }
  }
  if (const auto sequence = json.find("sequence"); sequence != json.end()) {
    if (!sequence->is_number_unsigned()) throw std::runtime_error("sequence is not a count");
    record.sequence = sequence->get<std::uint64_t>();
  }
  if (const auto written = json.find("limits_written"); written != json.end()) {
    if (!written->is_boolean()) throw std::runtime_error("limits_written is not true or false");
    record.limits_written = written->get<bool>();
  }
  return record;
}

base::Status write_owner_record(const std::string& path, const OwnerRecord& record) {
  return base::write_file_atomically(path,
                                     kube::dump_outside_json(owner_record_json(record)) + "\n");
}

base::Status read_owner_record(const std::string& path, OwnerRecord& record) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return base::Status::failure(fmt::format("{}: cannot be read", path));
  std::string text;
  text.resize(kMostRecordBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMostRecordBytes) {
    return base::Status::failure(fmt::format("{}: larger than {} bytes", path, kMostRecordBytes));
  }
  try {
    record = owner_record_from_json(kube::parse_outside_json(text));
  } catch (const std::exception& failure) {
    return base::Status::failure(fmt::format("{}: {}", path, failure.what()));
  }
  return base::Status::success();
}

}  // namespace tessera::contract
