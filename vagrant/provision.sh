#!/usr/bin/env bash
# Provision one VM of vagrant/Vagrantfile as one machine of `nomadtf dev up --clients N`:
# the server machine (Consul server, Nomad server, the NFS export of the shared model_dir)
# or client INDEX (a Consul client agent and the Nomad client client-INDEX).
#
#   provision.sh KIND INDEX ADDRESS SERVER_ADDRESS GPUS
#   provision.sh server 0 192.168.56.10 192.168.56.10 0
#   provision.sh client 2 192.168.56.12 192.168.56.10 0
#
# Steps, in order (NOMADTF_PROVISION_STEPS picks some; NOMADTF_PROVISION_ROOT writes the
# configs under that folder instead of /, which is how tests/test_vagrant.py runs `configs`):
#   packages   Debian's Python, NFS and curl, and Go 1.23 from bookworm-backports (the
#              oldest go command that fetches another Go itself is 1.21; Debian 12's is 1.19)
#   nomadtf    a virtual environment with nomadtf (clients: with TensorFlow, the `train` extra)
#   shared     /nomadtf-shared: exported over NFS by the server, mounted by the clients; the
#              model_dir of every task, and the binaries' cache (built once, by the server)
#   binaries   `nomadtf dev binaries --go`: Consul and Nomad built exactly as `nomadtf dev up`
#              builds them, with the project's Go, which the go command fetches from the Go
#              module proxy and checks against the Go checksum database itself (GOTOOLCHAIN)
#   configs    `nomadtf dev config`: the agents' files from nomadtf/devstack/wiring.py, the
#              code that writes the several-client stack's
#   units      systemd units for both agents, started
set -euo pipefail
KIND=$1 INDEX=$2 ADDRESS=$3 SERVER=$4 GPUS=${5:-0}
STEPS=${NOMADTF_PROVISION_STEPS:-packages nomadtf shared binaries configs units}
ROOT=${NOMADTF_PROVISION_ROOT:-}
SRC=/nomadtf                 # the repository, copied in by Vagrant
VENV=/opt/nomadtf/venv
NOMADTF=${NOMADTF:-$VENV/bin/nomadtf}
SHARED=/nomadtf-shared
STATE=/var/lib/nomadtf       # <machine>/nomad-data and <machine>/consul-data
INTERFACE=eth1               # Vagrant's private network; eth0 is VirtualBox's NAT
SUBNET=${SERVER%.*}.0/24
export NOMADTF_CACHE_DIR=$SHARED/cache
export DEBIAN_FRONTEND=noninteractive

step() { [[ " $STEPS " == *" $1 "* ]]; }
say() { echo "==> $KIND ${INDEX}: $*"; }

if step packages; then
  say "Debian packages"
  extra=$([ "$KIND" = server ] && echo nfs-kernel-server || true)
  echo "deb http://deb.debian.org/debian bookworm-backports main" > /etc/apt/sources.list.d/backports.list
  apt-get update -qq
  apt-get install -y -qq python3 python3-venv curl ca-certificates nfs-common $extra >/dev/null
  apt-get install -y -qq -t bookworm-backports golang-1.23-go >/dev/null
fi

if step nomadtf; then
  say "nomadtf in $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  if [ "$KIND" = client ]; then
    "$VENV/bin/pip" install --quiet "$SRC[train]"
  else
    "$VENV/bin/pip" install --quiet "$SRC"
  fi
fi

if step shared; then
  mkdir -p "$SHARED"
  if [ "$KIND" = server ]; then
    say "exporting $SHARED to $SUBNET"
    echo "$SHARED $SUBNET(rw,sync,no_root_squash,no_subtree_check)" > /etc/exports
    systemctl enable --now nfs-server
    exportfs -ra
  else
    say "mounting $SERVER:$SHARED"
    grep -q " $SHARED " /etc/fstab || echo "$SERVER:$SHARED $SHARED nfs defaults,_netdev 0 0" >> /etc/fstab
    mountpoint -q "$SHARED" || mount "$SHARED"
  fi
fi

if step binaries; then
  say "Go, Consul and Nomad (nomadtf dev binaries)"
  go_version=$("$VENV/bin/python" -c 'from nomadtf.devstack.binaries import GO_VERSION; print(GO_VERSION)')
  names="consul nomad"
  [ "$GPUS" -gt 0 ] && names="$names gpu-plugin"
  # shellcheck disable=SC2086
  PATH=/usr/lib/go-1.23/bin:$PATH "$NOMADTF" dev binaries $names --go "$go_version"
  install -m 0755 "$NOMADTF_CACHE_DIR/bin/consul" "$NOMADTF_CACHE_DIR/bin/nomad" /usr/local/bin/
fi

if step configs; then
  say "agent configuration (nomadtf dev config)"
  args=(--address "$ADDRESS" --state-dir "$STATE" --no-vault)
  if [ "$KIND" = client ]; then
    args+=(--index "$INDEX" --servers "$SERVER" --interface "$INTERFACE" --gpus "$GPUS")
  fi
  mkdir -p "$ROOT/etc/nomadtf"
  "$NOMADTF" dev config "$KIND" "${args[@]}" --agent nomad > "$ROOT/etc/nomadtf/nomad.hcl"
  "$NOMADTF" dev config "$KIND" "${args[@]}" --agent consul > "$ROOT/etc/nomadtf/consul.json"
fi

if step units; then
  say "systemd units"
  machine=$([ "$KIND" = server ] && echo server || echo "client-$INDEX")
  mkdir -p "$STATE/$machine"
  cat > /etc/systemd/system/nomadtf-consul.service <<UNIT
[Unit]
Description=Consul agent ($KIND) of the nomadtf cluster
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/local/bin/consul agent -config-file /etc/nomadtf/consul.json
Restart=on-failure

[Install]
WantedBy=multi-user.target
UNIT
  cat > /etc/systemd/system/nomadtf-nomad.service <<UNIT
[Unit]
Description=Nomad agent ($KIND) of the nomadtf cluster
Wants=network-online.target nomadtf-consul.service
After=network-online.target nomadtf-consul.service remote-fs.target

[Service]
# raw_exec tasks inherit this PATH: \`python3 -m nomadtf task\` finds the venv's nomadtf.
Environment=PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart=/usr/local/bin/nomad agent -config /etc/nomadtf/nomad.hcl
# As Nomad's own unit: stop only the agent, so a restart of it leaves the tasks running.
KillMode=process
KillSignal=SIGINT
Restart=on-failure

[Install]
WantedBy=multi-user.target
UNIT
  systemctl daemon-reload
  systemctl enable --now nomadtf-consul nomadtf-nomad
  say "up: Nomad UI at http://$SERVER:4646/ui/"
fi
