#!/usr/bin/env bash
# Installs and starts what the integration tests need. As root it installs missing Debian
# packages and starts dockerd; as a normal user it only says what is missing.
set -euo pipefail

need_pkgs=()
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
[ -x /bin/busybox ] || command -v busybox >/dev/null 2>&1 || need_pkgs+=(busybox-static)
# the SSH tests' namespace hosts (tests/infra/ssh_hosts.py): sshd, ssh-keygen, ip, ss, unshare
[ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || need_pkgs+=(openssh-client)
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v unshare >/dev/null 2>&1 || need_pkgs+=(util-linux)
# the Slurm test cluster (tests/infra/slurm_cluster.py): slurmctld, slurmd, sbatch and munge;
# the cluster's fixture starts munged itself when none answers
command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need_pkgs+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need_pkgs+=(munge)
# a private registry with basic auth, for the registry_auth tests
command -v docker-registry >/dev/null 2>&1 || need_pkgs+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || need_pkgs+=(apache2-utils)
# `dstack graph --format svg` renders with Graphviz's dot
command -v dot >/dev/null 2>&1 || need_pkgs+=(graphviz)
# the Azure tests serve their fake Resource Manager over HTTPS with a certificate openssl makes
command -v openssl >/dev/null 2>&1 || need_pkgs+=(openssl)
# the web UI's browser tests (tests/e2e/test_web_ui.py): headless Chromium and its driver
[ -x /usr/bin/chromium ] || need_pkgs+=(chromium)
[ -x /usr/bin/chromedriver ] || need_pkgs+=(chromium-driver)

if [ "$(id -u)" != 0 ]; then
  if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "test-deps: not root; integration tests need Debian packages: ${need_pkgs[*]}" >&2
  fi
  docker info >/dev/null 2>&1 || echo "test-deps: no Docker engine answers; docker tests will skip" >&2
  exit 0
fi

if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "test-deps: installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "test-deps: starting dockerd"
  mkdir -p /var/log
  nohup dockerd >/var/log/dstack-plan-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "test-deps: dockerd did not start" >&2; tail -20 /var/log/dstack-plan-dockerd.log >&2; exit 1; }
fi
# the fan-out benchmark (benchmarks/fanout.py) compares `dstack exec` with Ansible; no test needs it
venv_bin="${VENV:-.venv}/bin"
if [ -x "$venv_bin/pip" ] && [ ! -x "$venv_bin/ansible" ]; then
  echo "test-deps: installing ansible-core into $venv_bin (benchmarks only)"
  "$venv_bin/pip" install -q ansible-core \
    || echo "test-deps: could not install ansible-core; benchmarks/fanout.py needs it" >&2
fi
echo "test-deps: ok"
