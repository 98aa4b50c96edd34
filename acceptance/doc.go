// Package acceptance holds the acceptance tests: the plugin in a real Vault
// (dev and non-dev servers), driven through the real `vault` CLI, the HTTP
// API and Vault Agent, against the STS emulator. They run only with
// VAULT_ACC=1; scripts/test.sh (the README's test command) sets it.
package acceptance
