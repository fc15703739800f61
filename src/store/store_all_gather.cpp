#include "tdist/store/store_all_gather.h"

#include "tdist/error.h"

namespace tdist {

namespace {

void check_participant(const StoreAllGatherOptions& o) {
  TDIST_CHECK_ARG(o.world_size() >= 1, o.purpose() + ": world size " +
                                           std::to_string(o.world_size()) + " must be positive");
  TDIST_CHECK_ARG(o.rank() >= 0 && o.rank() < o.world_size(),
                  o.purpose() + ": rank " + std::to_string(o.rank()) + " is outside world size " +
                      std::to_string(o.world_size()));
}

std::string missing_ranks(Store& store, const std::vector<std::string>& keys) {
  std::string missing;
  for (size_t r = 0; r < keys.size(); ++r) {
    if (!store.check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  return missing;
}

}  // namespace

std::string store_all_gather_key(const StoreAllGatherOptions& options, uint64_t round, int rank) {
  return options.prefix() + "/" + std::to_string(round) + "/" + std::to_string(rank);
}

std::vector<std::vector<uint8_t>> store_all_gather(Store& store, uint64_t round,
                                                   const std::vector<uint8_t>& value,
                                                   const StoreAllGatherOptions& options) {
  check_participant(options);
  store.set(store_all_gather_key(options, round, options.rank()), value);
  std::vector<std::string> keys;
  for (int r = 0; r < options.world_size(); ++r) {
    keys.push_back(store_all_gather_key(options, round, r));
  }
  try {
    store.wait(keys, options.timeout());
  } catch (const TimeoutError&) {
    TDIST_THROW(TimeoutError, options.purpose() + ": rank " + std::to_string(options.rank()) +
                                  " waited " + std::to_string(options.timeout().count()) +
                                  " ms for rank(s) " + missing_ranks(store, keys) +
                                  " to arrive (round " + std::to_string(round) +
                                  "); they crashed, hang, or called something else");
  }
  std::vector<std::vector<uint8_t>> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(store.get(key));
  // Every rank set this round's key after reading all of round-1, and all of them have set
  // it: round-1 is read everywhere, and this rank's key of it can go.
  if (round > 0) store.delete_key(store_all_gather_key(options, round - 1, options.rank()));
  return values;
}

}  // namespace tdist
