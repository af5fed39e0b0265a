#!/usr/bin/env bash
# Install the cluster engines tests/clusters runs real jobs on: SLURM (slurmctld, slurmd and the client commands) and
# OpenMPI's mpirun, Debian packages. Ray comes from PyPI with the workspace's dev group (uv sync).
# Needs root (apt-get; the tests also need it, for network namespaces and slurmd). Quick when already installed:
# apt-get runs only for a missing command. The packages' own services are not started: the tests start their own
# daemons with a configuration of their own (tests/harness/slurm.py).
set -euo pipefail

needed=()
command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v srun >/dev/null 2>&1 ||
    needed+=(slurm-wlm)
command -v mpirun >/dev/null 2>&1 || needed+=(openmpi-bin)
if [[ ${#needed[@]} -eq 0 ]]; then
    echo "cluster engines present: $(slurmd -V), $(mpirun --version 2>/dev/null | head -n 1)"
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
    echo "tests/clusters/setup.sh: installing ${needed[*]} needs root (apt-get); the cluster tests will be skipped" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d: the packages' post-install scripts must not start the machine's own munge/slurm services.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
apt-get install -y -qq "${needed[@]}" >/dev/null
[[ $made_policy -eq 1 ]] && rm -f "$policy"
echo "cluster engines installed: $(slurmd -V), $(mpirun --version | head -n 1)"
