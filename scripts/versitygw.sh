#!/usr/bin/env bash
# versitygw.sh: a local S3-compatible server (versitygw v1.8.0 with its
# posix backend) for the s3kv driver's tests; the same as
# `scripts/s3server.sh versitygw ...` (see that script for the details).
#
#   scripts/versitygw.sh install|start|env|stop
#
# `eval "$(scripts/versitygw.sh start)"` sets AGENTKIT_TEST_S3.
exec "$(dirname "$0")/s3server.sh" versitygw "$@"
