#!/usr/bin/env bash
# Makes sure a Chromium is installed for the browser tests (the playground
# page and a cross-origin client, driven by chromedp): Debian's chromium
# package, installed with apt-get when missing. AGENTKIT_TEST_CHROMIUM names
# another binary instead. The tests fail under CI when no Chromium starts.
set -euo pipefail

if [ -n "${AGENTKIT_TEST_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  sudo="sudo"
fi
echo "chromium: installing Debian's chromium package for the browser tests" >&2
$sudo apt-get update -qq || true
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
