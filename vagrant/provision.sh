#!/usr/bin/env bash
# Provision one node: Go and Python, nomadtf and the server binaries, Consul and Nomad
# agents as systemd units. Arguments: NAME IP SERVER_IP.
set -euo pipefail
NAME=$1 IP=$2 SERVER=$3
apt-get update -qq
apt-get install -y -qq golang python3 python3-venv nfs-common nfs-kernel-server >/dev/null
cd /nomadtf && bash scripts/setup
BIN=/root/.cache/nomadtf/bin

mkdir -p /nomadtf-shared /etc/consul.d /etc/nomad.d /opt/consul /opt/nomad
if [ "$IP" = "$SERVER" ]; then
  echo "/nomadtf-shared 192.168.56.0/24(rw,sync,no_root_squash,no_subtree_check)" > /etc/exports
  exportfs -ra
  SERVER_BLOCK='server { enabled = true
  bootstrap_expect = 1 }'
  CONSUL_SERVER='-server -bootstrap-expect=1 -ui'
else
  mount -t nfs "$SERVER:/nomadtf-shared" /nomadtf-shared || true
  SERVER_BLOCK=''
  CONSUL_SERVER=''
fi

cat > /etc/systemd/system/consul.service <<UNIT
[Unit]
Description=Consul
[Service]
ExecStart=$BIN/consul agent $CONSUL_SERVER -node=$NAME -bind=$IP -client=0.0.0.0 -data-dir=/opt/consul -retry-join=$SERVER
Restart=always
[Install]
WantedBy=multi-user.target
UNIT

cat > /etc/nomad.d/nomad.hcl <<HCL
data_dir  = "/opt/nomad"
bind_addr = "0.0.0.0"
advertise { http = "$IP" rpc = "$IP" serf = "$IP" }
$SERVER_BLOCK
client {
  enabled = true
  servers = ["$SERVER"]
  network_interface = "eth1"
}
plugin "raw_exec" { config { enabled = true } }
consul { address = "127.0.0.1:8500" }
HCL

cat > /etc/systemd/system/nomad.service <<UNIT
[Unit]
Description=Nomad
After=consul.service
[Service]
Environment=PATH=/nomadtf/.venv/bin:/usr/local/bin:/usr/bin:/bin
ExecStart=$BIN/nomad agent -config=/etc/nomad.d
Restart=always
[Install]
WantedBy=multi-user.target
UNIT

systemctl daemon-reload
systemctl enable --now consul nomad
