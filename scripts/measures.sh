#!/usr/bin/env bash
# measures.sh: the code measures of the "Owners, not a god object" redesign
# (`make measures`): backend fields, fields touched from 3+ files, files
# taking the store lock, calling logical.Storage or splitting the entity
# key, long parameter lists, bool flags, cyclomatic complexity, fake clocks
# and mechanisms tested without a backend. One line per measure; -v lists
# the items behind each; -h defines them. Arguments go to cmd/code-measures.
#
# It type-checks the plugin package against its dependencies' export data
# (go list -export), so the plugin must build; it changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./cmd/code-measures -dir . "$@"
