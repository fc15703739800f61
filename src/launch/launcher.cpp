#include "tdist/launch/launcher.h"

#include <iostream>

#include "launch/mpirun_launch.h"
#include "launch/process_util.h"
#include "tdist/launch/elastic_agent.h"
#include "tdist/store/tcp_store.h"

namespace tdist::launch {

std::unique_ptr<Rendezvous> make_rendezvous(const LaunchConfig& config) {
  if (config.rendezvous_mode() == RendezvousMode::kNone) {
    return std::make_unique<LocalRendezvous>(config);
  }
  // The rendezvous store authenticates with TDIST_STORE_SECRET(_FILE) when the launcher's
  // environment has one (TCPStore reads it); give every node the same one.
  auto options = TCPStoreOptions()
                     .port(config.rdzv_port)
                     .wait_for_workers(false)
                     .timeout(config.join_timeout)
                     .client_name(config.rendezvous_mode() == RendezvousMode::kStatic
                                      ? "tdistrun node " + std::to_string(config.node_rank)
                                      : std::string("tdistrun"))
                     .server_name("the rendezvous host");
  const std::string endpoint = config.rdzv_host + ":" + std::to_string(config.rdzv_port);
  StorePtr store;
  bool is_host = false;
  if (config.rendezvous_mode() == RendezvousMode::kStatic) {
    is_host = config.node_rank == 0;
    try {
      store =
          std::make_shared<TCPStore>(config.rdzv_host, TCPStoreOptions(options).is_server(is_host));
    } catch (const Error& e) {
      TDIST_THROW(NetworkError,
                  std::string(is_host ? "tdistrun: node 0 cannot host the rendezvous store at "
                                      : "tdistrun: cannot reach the rendezvous store at ") +
                      endpoint + ": " + e.what() +
                      (is_host ? " (is --master-addr this machine and --master-port free?)"
                               : " (is node 0 started, and are --master-addr/--master-port "
                                 "right?)"));
    }
  } else {
    // c10d: the first launcher on the endpoint's machine to bind it becomes the host.
    if (detail::is_local_host(config.rdzv_host)) {
      try {
        store = std::make_shared<TCPStore>(
            config.rdzv_host,
            TCPStoreOptions(options).is_server(true).timeout(std::chrono::seconds(10)));
        store->set_timeout(config.join_timeout);
        is_host = true;
      } catch (const Error&) {
        store.reset();  // taken: another launcher on this machine hosts it
      }
    }
    if (!store) {
      try {
        store = std::make_shared<TCPStore>(config.rdzv_host, options);
      } catch (const Error& e) {
        TDIST_THROW(NetworkError, "tdistrun: cannot reach the rendezvous store at " + endpoint +
                                      ": " + e.what() + " (check --rdzv-endpoint)");
      }
    }
  }
  return std::make_unique<StoreRendezvous>(store, config, is_host);
}

int launcher_main(int argc, const char* const* argv) {
  if (argc >= 2 && std::string(argv[1]) == detail::kMpiWorkerShimFlag) {
    return detail::mpi_worker_shim_main(argc - 2, argv + 2);
  }
  ParsedArgs parsed = parse_launch_args(argc, argv);
  if (!parsed.config) {
    (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << std::flush;
    return parsed.exit_code;
  }
  const LaunchConfig& config = *parsed.config;
  detail::SignalPipe::instance();  // handle SIGINT/SIGTERM from the very start
  try {
    auto rendezvous = make_rendezvous(config);
    ElasticAgent agent(config, *rendezvous);
    return agent.run();
  } catch (const InvalidArgument& e) {
    std::cerr << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cerr << (what.rfind("tdistrun:", 0) == 0 ? "" : "tdistrun: ") << what << std::endl;
    return 1;
  }
}

}  // namespace tdist::launch
