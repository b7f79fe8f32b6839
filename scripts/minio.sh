#!/usr/bin/env bash
# minio.sh: a local MinIO server (one drive, pinned commit) for the s3kv
# driver's tests, the second S3 implementation they run against; the same
# as `scripts/s3server.sh minio ...` (see that script for the details).
#
#   scripts/minio.sh install|start|env|stop
#
# `eval "$(scripts/minio.sh start)"` sets AGENTKIT_TEST_S3_MINIO. The first
# install builds MinIO from source into the tool cache (about 2.5 minutes
# on two cores); later runs reuse the binary.
exec "$(dirname "$0")/s3server.sh" minio "$@"
