#!/usr/bin/env bash
# Test: run_getting_started.sh on a machine whose host name does not resolve (common in
# containers and fresh VMs), made with a UTS namespace: the single-host job must run (Gloo on
# the route to MASTER_ADDR), not crash. Skips (77) where no UTS namespace can be made.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! unshare -u true 2>/dev/null; then
  echo "SKIP: cannot create a UTS namespace here (unshare -u needs CAP_SYS_ADMIN)"
  exit 77
fi
exec unshare -u bash -c '
  hostname tdist-unresolvable-host.invalid || exit 1
  if getent hosts "$(hostname)" >/dev/null; then echo "FAIL: the test host name resolves"; exit 1; fi
  exec "$0" "$@"' "$here/run_getting_started.sh" "$@"
