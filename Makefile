# Targets wrap the scripts under scripts/, which hold the real logic.
VERSION ?= v0.1.0-dev

.PHONY: dev build test testacc fmt fmtcheck vault release compat

# The main job: plugin + STS emulator + Vault dev server, until Ctrl-C.
dev:
	./scripts/dev.sh

# Plugin (with its version compiled in), the credentials helper for AWS
# SDKs and the STS emulator into bin/.
build:
	go build -ldflags "-X main.version=$(VERSION)" -o bin/vault-plugin-secrets-aws-resilient ./cmd/vault-plugin-secrets-aws-resilient
	go build -ldflags "-X main.version=$(VERSION)" -o bin/aws-resilient-credentials ./cmd/aws-resilient-credentials
	go build -o bin/sts-emulator ./cmd/sts-emulator

# Everything CI runs: set-up, gofmt, vet, unit, fuzz, Vault build, acceptance.
test:
	./scripts/test.sh

# Release binaries of the plugin and the credentials helper (linux/amd64,
# linux/arm64, darwin/arm64) with the version
# compiled in, and SHA256SUMS for vault plugin register -sha256, in dist/.
release:
	VERSION=$(VERSION) ./scripts/release.sh

# The acceptance suite against every Vault version in tools/vault-versions;
# writes docs/compat.md (not run by CI; commit its result).
compat:
	./scripts/compat.sh

# Acceptance tests only (real Vault, CLI, Vault Agent).
testacc:
	./scripts/testacc.sh

# The pinned Vault binary, built once into the cache; prints its path.
vault:
	./scripts/vault.sh

fmt:
	gofmt -w $$(git ls-files --cached --others --exclude-standard '*.go')

fmtcheck:
	@out=$$(git ls-files -z --cached --others --exclude-standard '*.go' | xargs -0 -r gofmt -l); \
	if [ -n "$$out" ]; then echo "not gofmt-formatted (run make fmt):"; echo "$$out"; exit 1; fi

# Benchmarks against KV, the built-in aws engine and baseline refresh
# policies, at scale and with per-entity credentials: one table, charts in
# docs/bench/ (not run by CI).
.PHONY: bench
bench:
	./scripts/bench.sh

# The plugin in a 3-node Vault HA cluster (raft): set-up, SIGKILL of the
# active node, rejoin; prints the election gap and STS calls around it.
.PHONY: ha
ha:
	./scripts/ha.sh

# The code measures of the redesign (backend fields, fields touched from
# 3+ files, files taking the store lock, ...): one line each; add -v with
# `./scripts/measures.sh -v`.
.PHONY: measures
measures:
	./scripts/measures.sh

# Mutation testing (Gremlins) of the mechanism packages under internal/:
# killed, lived and not-covered mutants and the efficacy per package; fails
# below 90 % (MUTATE_REPORT_ONLY=1 only reports). Not run by CI.
.PHONY: mutate
mutate:
	./scripts/mutate.sh

# The chaos soak: a 3-node raft cluster under a seeded schedule of
# overlapping faults, operator actions and readers; every operation recorded
# and checked offline by cmd/soak-check (`make soak DURATION=1h SEED=7`).
.PHONY: soak
soak:
	DURATION=$(DURATION) SEED=$(SEED) ./scripts/soak.sh
