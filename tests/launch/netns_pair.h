#pragma once

// Two "hosts" for tests: network namespaces joined by a veth pair, each with its own address
// (10.213.x.1 and .2). Skips the test, saying why, where namespaces cannot be created (needs
// root and ip netns).

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "launch/run_process.h"

namespace tdist::launch::testing {

// Two hosts: network namespaces joined by a veth pair.
class NetnsPair : public ::testing::Test {
 protected:
  void SetUp() override {
    id_ = std::to_string(getpid() % 100000);
    ns_[0] = "tdl" + id_ + "a";
    ns_[1] = "tdl" + id_ + "b";
    int octet = 1 + getpid() % 250;
    addr_[0] = "10.213." + std::to_string(octet) + ".1";
    addr_[1] = "10.213." + std::to_string(octet) + ".2";
    std::string va = "tdv" + id_ + "a", vb = "tdv" + id_ + "b";
    std::string script = "set -e; ip netns add " + ns_[0] + "; ip netns add " + ns_[1] +
                         "; ip link add " + va + " type veth peer name " + vb + "; ip link set " +
                         va + " netns " + ns_[0] + "; ip link set " + vb + " netns " + ns_[1];
    for (int i = 0; i < 2; ++i) {
      std::string dev = i == 0 ? va : vb;
      script += "; ip -n " + ns_[i] + " addr add " + addr_[i] + "/24 dev " + dev + "; ip -n " +
                ns_[i] + " link set " + dev + " up; ip -n " + ns_[i] + " link set lo up";
    }
    auto r = run({"/bin/sh", "-c", script + " 2>&1"}, {}, std::chrono::seconds(20));
    created_ = r.exit_code == 0;
    if (!created_) {
      TearDown();
      GTEST_SKIP() << "cannot create network namespaces here (needs root and ip netns): " << r.out;
    }
  }
  void TearDown() override {
    run({"/bin/sh", "-c",
         "ip netns del " + ns_[0] + " 2>/dev/null; ip netns del " + ns_[1] + " 2>/dev/null; true"},
        {}, std::chrono::seconds(20));
  }
  std::vector<std::string> in_ns(int i) { return {"/usr/sbin/ip", "netns", "exec", ns_[i]}; }

  std::string id_, ns_[2], addr_[2];
  bool created_ = false;

  /// Drops every packet into and out of host i (an nftables table in its namespace), as a
  /// node cut off by a partition or a power loss: no reset, no error, silence.
  bool cut_off(int i) {
    const std::string nft = "ip netns exec " + ns_[i] + " nft ";
    const auto r = run({"/bin/sh", "-c",
                        nft + "add table inet cut && " + nft +
                            "'add chain inet cut in { type filter hook input priority 0; policy "
                            "drop; }' && " +
                            nft +
                            "'add chain inet cut out { type filter hook output priority 0; "
                            "policy drop; }' 2>&1"},
                       {}, std::chrono::seconds(20));
    cut_error_ = r.out;
    return r.exit_code == 0;
  }
  std::string cut_error_;
};

}  // namespace tdist::launch::testing
