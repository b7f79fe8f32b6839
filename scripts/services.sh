#!/usr/bin/env bash
# Makes sure the servers the driver tests use are up on this machine:
# PostgreSQL, Redis and NATS with JetStream at their default local ports.
# A server that is down is started with the command this machine's image uses.
# Servers reached through AGENTKIT_TEST_* variables elsewhere are left alone.
set -uo pipefail

up() { # host port
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

wait_up() { # name host port
  for _ in $(seq 1 50); do
    up "$2" "$3" && return 0
    sleep 0.2
  done
  echo "services: $1 did not come up on $2:$3" >&2
  return 1
}

status=0
if ! up 127.0.0.1 5432; then
  echo "services: starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  wait_up PostgreSQL 127.0.0.1 5432 || status=1
fi
if ! up 127.0.0.1 6379; then
  echo "services: starting Redis" >&2
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  wait_up Redis 127.0.0.1 6379 || status=1
fi
if ! up 127.0.0.1 4222; then
  echo "services: starting NATS" >&2
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || true
  wait_up NATS 127.0.0.1 4222 || status=1
fi
exit $status
