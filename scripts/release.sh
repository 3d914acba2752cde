#!/usr/bin/env bash
# Publishes a release to any OCI registry: the operator image and the chart,
# pinned to each other. The release workflow (.github/workflows/release.yml)
# runs it against the project's registry on a version tag; the real-cluster
# quick start test runs it against the local one, so what is tested is what
# publishes.
#
#   scripts/release.sh --registry HOST[:PORT][/PATH] [--plain-http] [--out DIR] [--chart DIR]
#
# --chart publishes another chart directory (default charts/skill-operator):
# the upgrade test publishes the previous chart version with it.
#
# Steps, each checked before the next:
#   1. versions agree: Cargo.toml's version is the chart's appVersion, and a
#      tag in RELEASE_TAG (the workflow's v1.2.3) is the chart's version;
#   2. the image: `skill-operator image self` pushes this binary to
#      REGISTRY/skill-operator:<appVersion>, with its CycloneDX SBOM as an
#      OCI referrer; the digest is what the chart pins;
#   3. the chart: a copy of charts/skill-operator whose values name
#      REGISTRY/skill-operator and that digest, packaged (`helm package`)
#      and pushed as an OCI artifact to REGISTRY/charts (`helm push`);
#   4. pulled back: `helm pull oci://…` of that version, whose values and
#      render must name exactly the pushed image digest;
#   5. OUT/release-notes.md (image, digest, SBOM, chart, install line) and
#      OUT/release.json.
# A failed step stops the script (exit 1) with what to do; nothing is
# pushed after a failed check.
#
# Settings (environment):
#   SKILL_OPERATOR_BIN   the binary to publish (default: cargo build --release --locked)
#   HELM                 helm (default: on PATH, else target/test-deps/bin/helm)
#   SKILL_OPERATOR_DOCKER_CONFIG  registry credentials for the image push
#                        (`{"auths": {...}}`); helm uses its own login
#                        (`helm registry login`)
#   RELEASE_TAG          the git tag being released (checked against the chart version)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REGISTRY="" PLAIN=() OUT="$ROOT/target/release-out" CHART="$ROOT/charts/skill-operator"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --registry) REGISTRY="${2:?--registry needs HOST[:PORT][/PATH]}"; shift 2 ;;
    --plain-http) PLAIN=(--plain-http); shift ;;
    --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
    --chart) CHART="${2:?--chart needs a chart directory}"; shift 2 ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "release: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "release: $*" >&2; exit 1; }
[[ -n "$REGISTRY" ]] || die "give --registry HOST[:PORT][/PATH] (the project's is ghcr.io/skill-operator)"
REGISTRY="${REGISTRY%/}"
HELM="${HELM:-$(command -v helm || echo "$ROOT/target/test-deps/bin/helm")}"
[[ -x "$HELM" ]] || die "helm is missing: install Helm 3.8+ (OCI support) or run scripts/install-test-deps.sh"

# ------------------------------------------------------------- 1. versions
[[ -f "$CHART/Chart.yaml" ]] || die "$CHART has no Chart.yaml"
chart_field() { sed -n "s/^$1: *\"\\{0,1\\}\\([^\"]*\\)\"\\{0,1\\} *$/\\1/p" "$CHART/Chart.yaml"; }
CHART_VERSION="$(chart_field version)" APP_VERSION="$(chart_field appVersion)"
CARGO_VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)"
[[ "$APP_VERSION" == "$CARGO_VERSION" ]] \
  || die "the chart's appVersion ($APP_VERSION) is not Cargo.toml's version ($CARGO_VERSION): make them equal before releasing"
if [[ -n "${RELEASE_TAG:-}" && "${RELEASE_TAG#v}" != "$CHART_VERSION" ]]; then
  die "tag $RELEASE_TAG does not match the chart version $CHART_VERSION: bump charts/skill-operator/Chart.yaml or tag v$CHART_VERSION"
fi

# --------------------------------------------------------------- 2. image
BIN="${SKILL_OPERATOR_BIN:-}"
if [[ -z "$BIN" ]]; then
  (cd "$ROOT" && cargo build --release --locked) || die "the release build failed"
  BIN="$ROOT/target/release/skill-operator"
fi
[[ -x "$BIN" ]] || die "$BIN is not an executable binary"
mkdir -p "$OUT"
IMAGE_REPO="$REGISTRY/skill-operator"
if ! "$BIN" image self --registry "$IMAGE_REPO" --tag "$APP_VERSION" "${PLAIN[@]}" --json >"$OUT/image.json" 2>"$OUT/image.log"; then
  die "pushing the image to $IMAGE_REPO failed: $(tail -n 3 "$OUT/image.log")
  (check the registry address and that your credentials may push there: SKILL_OPERATOR_DOCKER_CONFIG; nothing else was pushed)"
fi
read -r IMAGE_DIGEST SBOM_DIGEST ARCH < <(python3 - "$OUT/image.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
print(c["digest"], (c.get("sbom") or {}).get("manifestDigest", "none"), c["images"][0]["platform"]["architecture"])
PY
)
[[ "$IMAGE_DIGEST" == sha256:* ]] || die "image self printed no digest (see $OUT/image.json)"
[[ "$SBOM_DIGEST" == sha256:* ]] || die "image self attached no SBOM to $IMAGE_DIGEST (see $OUT/image.json): a release carries one"
echo "image: $IMAGE_REPO:$APP_VERSION @ $IMAGE_DIGEST (linux/$ARCH, SBOM $SBOM_DIGEST)"

# --------------------------------------------------------------- 3. chart
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
cp -r "$CHART" "$STAGE/skill-operator"
# The image block of values.yaml, rewritten in place (comments kept): the
# release's repository and digest.
python3 - "$STAGE/skill-operator/values.yaml" "$IMAGE_REPO" "$IMAGE_DIGEST" <<'PY' || die "could not pin the image in the chart's values.yaml"
import re, sys
path, repo, digest = sys.argv[1:]
text = open(path).read()
block = re.search(r"^image:\n((?:[ #].*\n|\n)*?)(?=^\S)", text, re.M)
if not block:
    sys.exit("values.yaml has no top-level image: block")
body = block.group(1)
body, n1 = re.subn(r"^  repository: .*$", f"  repository: {repo}", body, count=1, flags=re.M)
body, n2 = re.subn(r'^  digest: .*$', f'  digest: "{digest}"', body, count=1, flags=re.M)
if (n1, n2) != (1, 1):
    sys.exit("image.repository or image.digest not found in values.yaml")
open(path, "w").write(text[: block.start(1)] + body + text[block.end(1):])
PY
"$HELM" package "$STAGE/skill-operator" --destination "$STAGE" >/dev/null || die "helm package failed"
PACKAGE="$STAGE/skill-operator-$CHART_VERSION.tgz"
[[ -f "$PACKAGE" ]] || die "helm package wrote no $PACKAGE"
cp "$PACKAGE" "$OUT/"
if ! "$HELM" push "$PACKAGE" "oci://$REGISTRY/charts" "${PLAIN[@]}" >"$OUT/chart-push.log" 2>&1; then
  die "pushing the chart to oci://$REGISTRY/charts failed: $(tail -n 3 "$OUT/chart-push.log")
  (helm registry login $REGISTRY first; the image above is pushed, the chart is not)"
fi
CHART_DIGEST="$(sed -n 's/^Digest: //p' "$OUT/chart-push.log")"
CHART_REF="oci://$REGISTRY/charts/skill-operator"
echo "chart: $CHART_REF --version $CHART_VERSION @ $CHART_DIGEST"

# -------------------------------------------------------- 4. pulled back
mkdir -p "$STAGE/pulled"
"$HELM" pull "$CHART_REF" --version "$CHART_VERSION" "${PLAIN[@]}" --destination "$STAGE/pulled" >/dev/null 2>"$OUT/chart-pull.log" \
  || die "the pushed chart cannot be pulled back: $(tail -n 3 "$OUT/chart-pull.log")"
pulled_values="$("$HELM" show values "$STAGE/pulled/skill-operator-$CHART_VERSION.tgz")"
grep -qx "  repository: $IMAGE_REPO" <<<"$pulled_values" || die "the pulled chart does not name $IMAGE_REPO"
grep -qx "  digest: \"$IMAGE_DIGEST\"" <<<"$pulled_values" || die "the pulled chart does not pin $IMAGE_DIGEST"
rendered="$("$HELM" template skills "$STAGE/pulled/skill-operator-$CHART_VERSION.tgz" -n skill-operator)"
grep -q -- "--operator-image=$IMAGE_REPO@$IMAGE_DIGEST" <<<"$rendered" || die "the pulled chart renders another image than $IMAGE_REPO@$IMAGE_DIGEST"
echo "pulled back: the chart pins $IMAGE_REPO@$IMAGE_DIGEST"

# ------------------------------------------------------------- 5. notes
cat >"$OUT/release-notes.md" <<NOTES
## skill-operator $CHART_VERSION (app $APP_VERSION)

| what | reference | digest |
|---|---|---|
| operator image (linux/$ARCH) | \`$IMAGE_REPO:$APP_VERSION\` | \`$IMAGE_DIGEST\` |
| SBOM (CycloneDX, OCI referrer of the image) | \`$IMAGE_REPO@$SBOM_DIGEST\` | \`$SBOM_DIGEST\` |
| Helm chart (OCI) | \`$CHART_REF:$CHART_VERSION\` | \`$CHART_DIGEST\` |

The chart pins the image by digest: chart and image cannot drift.

\`\`\`sh
helm install skills $CHART_REF --version $CHART_VERSION -n skill-operator --create-namespace --wait
\`\`\`
NOTES
python3 - "$OUT/release.json" <<PY
import json, sys
json.dump({"chartVersion": "$CHART_VERSION", "appVersion": "$APP_VERSION", "image": "$IMAGE_REPO", "imageDigest": "$IMAGE_DIGEST",
           "sbomDigest": "$SBOM_DIGEST", "architecture": "$ARCH", "chart": "$CHART_REF", "chartDigest": "$CHART_DIGEST"},
          open(sys.argv[1], "w"), indent=2)
PY
echo "release notes: $OUT/release-notes.md"
