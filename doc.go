// Package awsresilient is a Vault secrets engine that serves AWS STS
// credentials from a cache kept in Vault storage, refreshed in the
// background with jittered block retries; a failure is recorded as status,
// never stored as a credential.
//
// # Code map
//
// Every piece of state has one owner, in one file, whose lock only that
// file takes; an owner is given at construction the clock, random source,
// storage and other owners it calls:
//
//	backend.go     the backend: a handful of owners built and wired here,
//	               Factory, Initialize, Invalidate (it only forgets), Clean
//	storage.go     every storage key and the typed reads and writes; the only
//	               file that calls logical.Storage (config/ and cache/ are
//	               seal-wrapped)
//	rolestate.go   roleStates: the mirror of roles/, cache/ and status/, the
//	               generations and the per-role store locks (lockFor)
//	flights.go     flights: the one refresh cycle in progress per key, and
//	               the read budget (one STS call per key per retry block):
//	               the one door every asker goes through, a chained target
//	               asking for its source included (on the source's schedule)
//	refresher.go   refresher: the plan, its firing (fireDue), the cycle
//	               (runCycle over a cycleJob, attempt, the commits)
//	timing.go      every timing rule as a pure function of (time, config, rand)
//	reconcile.go   reconciler: passes and their phases, their retry,
//	               orphans, index repair
//	schedindex.go  the refresher's start from the schedule index (hints)
//	settings.go    settings: config/refresh in force (policy)
//	awstime.go     awsClocks: this node's estimate of each AWS endpoint's
//	               clock (internal/awsclock), by which every credential is
//	               judged (cacheEntry.clockAt) and every request signed;
//	               measured on start and again (an unsigned probe) when an
//	               answer disagrees or its newest sample is old (kick),
//	               persisted per host (clock/<host>)
//	client.go      stsClients: the STS client sets built from config/root
//	               (after a rotation, the old key's as a fallback until it
//	               is drained) and one per source role's credential
//	               (source_role); IAM's partition, region and endpoint
//	rotation.go    rotator: root key rotation, config/root's lock and writes
//	lifecycle.go   lifecycle: running, the end of the work (Clean, or
//	               storage refusing a write: this node lost the active
//	               role; fence), the write before every STS call
//	               (canStore), the background goroutines
//	chain.go       chains: role chaining (source_role): the chain topology
//	               (an index of roles/ that role writes keep) and its
//	               checks, and a chained attempt's signing with its source
//	               role's cached credential: fit to sign (sourceFit), or
//	               still valid once the source's refresh failed
//	               (lastResort), checked again at the call (sourceNow); a
//	               ring that storage holds fails at once (ringAbove)
//	entity.go      the rules of cache_scope=entity: session names (uniqueName,
//	               the bounded template), admission and eviction
//	               (admitLocked), dropping (entityDropReason) and the
//	               pass's slice of entity checks (entityChecks)
//	path_*.go      handlers: parse the fields, call an owner, shape the answer;
//	               status/ and the metrics read the refresher's reportView
//	               (path_status.go)
//
// Mechanisms that need no backend live under internal/ and import neither
// this package nor each other (internal/clock excepted; imports_test.go):
// clock (+ clocktest, the one fake clock), ratelimit, dueplan (the plan of
// due times with its one timer), schedindex (the sched/ hint shards) and
// memlimit (the process's soft memory limit).
//
// # Lock order
//
// A lock may be taken while holding only those above it:
//
//	reconciler.passes            one reconciler pass at a time
//	rotator.rotations, .root     a rotation; config/root's read-change-write
//	chains.topo                  a role write or delete: exclusive when it
//	                             may change a chain, shared otherwise
//	role store lock (lockFor)    every storage change of a role
//	roleStates.admitMu           a new entity's admission (count, evict, store)
//	flights.mu                   held by the plan while it fires (the
//	                             policy is read before: refresher.fireLock),
//	                             and around a plan's change (withPlan)
//	refresher.plan (dueplan)     its own lock
//	settings.loadMu, settings.mu a reload of config/refresh
//	roleStates.mu                the mirror (a read lock on the hot path)
//	reconciler.mu, rotator.mu,   the owners' small state; schedule index
//	index shards, stsClients.mu, shards are written under the store lock
//	limiter, metrics,
//	entityChecks.mu, chains.mu
//	awsClocks.persistMu          a write of clock/<host> (then awsClocks.mu)
//	lifecycle                    last: it calls nothing while held
package awsresilient
