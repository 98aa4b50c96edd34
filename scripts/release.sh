#!/usr/bin/env bash
# release.sh: release binaries of the plugin and of the credentials helper
# (`make release VERSION=v0.2.0`).
#
# Cross-builds the plugin and cmd/aws-resilient-credentials for each target with -trimpath, CGO off and the
# version compiled in (Vault checks it against `vault plugin register
# -version`), into dist/<version>/, and writes SHA256SUMS there, one line per
# binary in sha256sum's format: the sum is what `vault plugin register
# -sha256` wants.
#
#   VERSION          the version to compile in (required, v-prefixed semver)
#   RELEASE_TARGETS  os/arch pairs (default: linux/amd64 linux/arm64 darwin/arm64)
#   RELEASE_DIR      output directory (default dist/<version>)
set -euo pipefail
cd "$(dirname "$0")/.."

version=${VERSION:-}
if [[ ! "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release.sh: VERSION must be a v-prefixed semantic version such as v0.2.0; got '${version}'" >&2
	exit 2
fi
targets=${RELEASE_TARGETS:-linux/amd64 linux/arm64 darwin/arm64}
out=${RELEASE_DIR:-dist/$version}
mkdir -p "$out"
rm -f "$out/SHA256SUMS"

name=vault-plugin-secrets-aws-resilient
helper=aws-resilient-credentials
for target in $targets; do
	os=${target%/*}
	arch=${target#*/}
	for cmd in $name $helper; do
		bin="${cmd}_${version}_${os}_${arch}"
		echo "building $bin" >&2
		CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath \
			-ldflags "-s -w -X main.version=$version" \
			-o "$out/$bin" ./cmd/$cmd
	done
done
# sha256sum (Linux) or shasum -a 256 (macOS): the same line format.
sum=(sha256sum)
command -v sha256sum >/dev/null || sum=(shasum -a 256)
(cd "$out" && "${sum[@]}" "${name}_${version}"_* "${helper}_${version}"_* >SHA256SUMS)
cat "$out/SHA256SUMS"
echo "release binaries and SHA256SUMS in $out" >&2
