package stsemu

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// Stats counts STS and IAM calls (not control API calls), by action.
type Stats struct {
	Total     int                       `json:"total"`
	ByAction  map[string]map[string]int `json:"by_action"`  // action -> outcome -> count
	ByOutcome map[string]int            `json:"by_outcome"` // outcome -> count
	Timeline  []Second                  `json:"timeline"`   // seconds with calls, ascending
}

// Second is one second of the timeline.
type Second struct {
	Second   int64          `json:"second"` // Unix time
	Outcomes map[string]int `json:"outcomes"`
}

// Count returns the number of calls of action (all actions when "") with
// outcome (all outcomes when "").
func (s Stats) Count(action, outcome string) int {
	switch {
	case action == "" && outcome == "":
		return s.Total
	case action == "":
		return s.ByOutcome[outcome]
	}
	n := 0
	for o, c := range s.ByAction[action] {
		if outcome == "" || o == outcome {
			n += c
		}
	}
	return n
}

// Call is one recorded STS or IAM call. AccessKeyID is the id from the
// signature's credential scope (never a secret); RoleArn the RoleArn
// parameter, if any. RoleSessionName and SourceIdentity are those
// parameters of an AssumeRole call as sent, valid or not, and "" when absent
// or for other actions; a source identity inherited from the caller's own
// session is not a parameter and is not recorded here. Outcome is "ok", a
// fault kind, or the AWS error code returned.
type Call struct {
	Seq             int64     `json:"seq"`
	Time            time.Time `json:"time"`
	Action          string    `json:"action"`
	Outcome         string    `json:"outcome"`
	RoleArn         string    `json:"role_arn"`
	AccessKeyID     string    `json:"access_key_id"`
	RoleSessionName string    `json:"role_session_name"`
	SourceIdentity  string    `json:"source_identity"`
	// IssuedKeyID and IssuedExpiration name the credential a successful
	// AssumeRole, GetSessionToken or GetFederationToken issued (the soak's
	// checker matches every key Vault served to one of these); for
	// CreateAccessKey and DeleteAccessKey IssuedKeyID is the IAM key created
	// or deleted. Never a secret: key ids only.
	IssuedKeyID      string    `json:"issued_key_id,omitempty"`
	IssuedExpiration time.Time `json:"issued_expiration,omitzero"`
	// CallerArn is the principal whose signature the emulator verified:
	// arn:aws:iam::ACCOUNT:user/NAME for a long-term key or its
	// GetSessionToken credentials, arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION
	// for a role session (whose access key is AccessKeyID), a federated
	// user's ARN; "" when no signature was verified (unsigned, refused
	// by the check or before it, or a fault answered first).
	CallerArn string `json:"caller_arn"`
	// Listener is the address of the listener the call came through
	// (ListenerView.Addr); "" when served without one (a test's recorder).
	Listener string `json:"listener,omitempty"`
}

// maxCalls bounds the call log: a long-lived dev server or a benchmark that
// never resets would otherwise grow without limit. Counters stay exact; only
// the oldest individual records are dropped, and a million is far beyond
// what any test inspects.
const maxCalls = 1 << 20

// recorder accumulates Stats and Calls.
type recorder struct {
	mu        sync.Mutex // guards every field
	seq       int64
	total     int
	byAction  map[string]map[string]int
	byOutcome map[string]int
	timeline  map[int64]map[string]int
	log       []Call
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total = 0
	r.byAction = map[string]map[string]int{}
	r.byOutcome = map[string]int{}
	r.timeline = map[int64]map[string]int{}
	r.log = nil
	// seq keeps counting so call numbers never repeat within one emulator.
}

func (r *recorder) record(c Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	c.Seq = r.seq
	r.total++
	a := r.byAction[c.Action]
	if a == nil {
		a = map[string]int{}
		r.byAction[c.Action] = a
	}
	a[c.Outcome]++
	r.byOutcome[c.Outcome]++
	sec := c.Time.Unix()
	t := r.timeline[sec]
	if t == nil {
		t = map[string]int{}
		r.timeline[sec] = t
	}
	t[c.Outcome]++
	if len(r.log) >= maxCalls {
		// Drop the oldest quarter at once so trimming is amortised O(1).
		r.log = append(r.log[:0], r.log[maxCalls/4:]...)
	}
	r.log = append(r.log, c)
}

func (r *recorder) snapshot() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{
		Total:     r.total,
		ByAction:  make(map[string]map[string]int, len(r.byAction)),
		ByOutcome: maps.Clone(r.byOutcome),
		Timeline:  make([]Second, 0, len(r.timeline)),
	}
	for a, m := range r.byAction {
		s.ByAction[a] = maps.Clone(m)
	}
	for _, sec := range slices.Sorted(maps.Keys(r.timeline)) {
		s.Timeline = append(s.Timeline, Second{Second: sec, Outcomes: maps.Clone(r.timeline[sec])})
	}
	return s
}

func (r *recorder) calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}
