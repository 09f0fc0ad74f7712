#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv with the build tools and the
# package's extras.  Usage: bootstrap.sh PYTHON VENV [EXTRAS]
# EXTRAS: "spark" for the demo (PySpark, pyarrow, matplotlib), "dev,spark"
# (the default) for the tests, the benchmarks and fuzzing as well.
set -euo pipefail
PYTHON=${1:-python3}
VENV=${2:-.venv}
EXTRAS=${3:-dev,spark}
if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "bootstrap: $PYTHON lacks venv/ensurepip; installing python3-venv" >&2
    apt-get update -qq && apt-get install -y -qq python3-venv python3-dev
fi
if ! command -v gcc >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq build-essential
fi
# Sealed connections (AES-256-GCM) build against OpenSSL's libcrypto.
if [ ! -e /usr/include/openssl/evp.h ] && [ ! -e /usr/local/include/openssl/evp.h ]; then
    echo "bootstrap: no OpenSSL headers; installing libssl-dev" >&2
    apt-get update -qq && apt-get install -y -qq libssl-dev
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip "setuptools>=68" wheel
"$VENV/bin/python" -m pip install -q "Cython>=3.0,<4" "numpy>=1.26"
# Spark (the spark extra) runs on a Java runtime.
if ! command -v java >/dev/null 2>&1; then
    echo "bootstrap: no java; installing a headless Java runtime for Spark" >&2
    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless \
        || apt-get install -y -qq default-jre-headless
fi
# The multi-host Spark tests (network namespaces, as root) load firewall and
# NAT rules with nft.
if [ "$(id -u)" = 0 ] && ! command -v nft >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: no nft; installing nftables for the multi-host tests" >&2
    apt-get update -qq && apt-get install -y -qq nftables
fi
# The tests load the live view's page in a real headless browser (Debian's
# chromium); where none can be installed, that test says so and is skipped.
if [[ ",$EXTRAS," == *",dev,"* ]] && ! command -v chromium >/dev/null 2>&1 \
        && ! command -v chromium-browser >/dev/null 2>&1; then
    echo "bootstrap: no chromium; installing Debian's for the live view's browser test" >&2
    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium \
        || echo "bootstrap: chromium could not be installed; the browser test will be skipped" >&2
fi
# The package itself (editable, no isolation: the build uses the venv's Cython),
# with the extras asked for.
"$VENV/bin/python" -m pip install -q --no-build-isolation -e ".[$EXTRAS]"
