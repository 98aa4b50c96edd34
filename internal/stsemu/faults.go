package stsemu

import (
	"encoding/json"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Fault is a way for an STS or IAM call to fail on purpose.
type Fault string

// The fault kinds. The capitalised ones are AWS error codes and produce that
// error response; the lower-case ones break the transport or the payload.
const (
	FaultThrottling           Fault = "Throttling"           // 400 Throttling "Rate exceeded"
	FaultRequestLimitExceeded Fault = "RequestLimitExceeded" // 400 RequestLimitExceeded
	FaultInternalFailure      Fault = "InternalFailure"      // 500 InternalFailure
	FaultServiceUnavailable   Fault = "ServiceUnavailable"   // 503 ServiceUnavailable
	FaultAccessDenied         Fault = "AccessDenied"         // 403 AccessDenied
	FaultReset                Fault = "reset"                // TCP RST instead of a response
	FaultResetAfter           Fault = "reset_after"          // the call takes effect, then a TCP RST instead of its answer
	FaultHang                 Fault = "hang"                 // hold the request for FaultPlan.Hang, then answer normally
	FaultMalformed            Fault = "malformed"            // 200 with truncated XML
	FaultExpired              Fault = "expired"              // success, but Expiration already past (GetCallerIdentity: ExpiredToken)
	FaultEmptyKey             Fault = "empty_key"            // success with an empty AccessKeyId (GetCallerIdentity, GetUser: empty UserId)

	// The malformed credential shapes: a 200 whose Credentials element
	// (AssumeRole, GetSessionToken, GetFederationToken) lacks or bends one
	// field. Calls that issue no credential answer normally, with outcome ok
	// (they still use up their step of the Sequence).
	FaultEmptySecret   Fault = "empty_secret"   // SecretAccessKey empty
	FaultEmptyToken    Fault = "empty_token"    // SessionToken empty
	FaultNoExpiration  Fault = "no_expiration"  // no Expiration element at all
	FaultFarExpiration Fault = "far_expiration" // Expiration FarExpiration away (and honoured that long)
	FaultWhitespace    Fault = "whitespace"     // AccessKeyId, SecretAccessKey and SessionToken wrapped in whitespace
)

// FarExpiration is how far in the future the far_expiration fault puts a
// credential's expiry: absurd next to STS's 36 hours at most, and still a
// four-digit year that every client parses.
const FarExpiration = 100 * 365 * 24 * time.Hour

// credentialShapes are the faults that bend the Credentials of an
// otherwise successful answer rather than fail the call.
var credentialShapes = []Fault{
	FaultExpired, FaultEmptyKey, FaultEmptySecret, FaultEmptyToken,
	FaultNoExpiration, FaultFarExpiration, FaultWhitespace,
}

// CredentialShapes lists the faults that answer 200 with a bent
// credential (an issuing action's Credentials element): expired, empty_key
// and the malformed shapes.
func CredentialShapes() []Fault { return slices.Clone(credentialShapes) }

// shapesCredential reports whether f bends an issued credential.
func (f Fault) shapesCredential() bool { return slices.Contains(credentialShapes, f) }

// bends reports whether f, a credential shape, changed the successful
// answer of action, whose outcome then names it. expired and empty_key also
// act on calls that issue nothing (GetCallerIdentity, IAM: see their
// handlers); the other shapes only on the issuing actions.
func (f Fault) bends(action string) bool {
	switch {
	case f == FaultExpired || f == FaultEmptyKey:
		return true
	case f.shapesCredential():
		return issuingActions[action]
	}
	return false
}

// AllFaults lists every fault kind.
func AllFaults() []Fault {
	return []Fault{
		FaultThrottling, FaultRequestLimitExceeded, FaultInternalFailure, FaultServiceUnavailable,
		FaultAccessDenied, FaultReset, FaultResetAfter, FaultHang, FaultMalformed, FaultExpired, FaultEmptyKey,
		FaultEmptySecret, FaultEmptyToken, FaultNoExpiration, FaultFarExpiration, FaultWhitespace,
	}
}

// Valid reports whether f is a known fault kind.
func (f Fault) Valid() bool { return slices.Contains(AllFaults(), f) }

// DefaultHang is how long the hang fault holds a request when FaultPlan.Hang
// is zero: longer than any sane client timeout.
const DefaultHang = 30 * time.Second

// FaultPlan says which calls fail and how. Without Actions it applies to the
// four STS actions only, as it always has, so a plan written for STS
// refreshes leaves a credential rotation's IAM calls alone; Actions selects
// IAM calls. Never the control API, and only calls that passed the
// throttling bucket. Calls a plan does not select neither fail nor use up
// its Sequence.
type FaultPlan struct {
	Sequence    []FaultStep       // next Count calls get Fault, in order, then normal
	Probability map[Fault]float64 // independent per-call probability (after Sequence is used up)
	Hang        time.Duration     // how long the "hang" fault hangs (default 30s or until client gives up)
	Match       string            // optional: only calls whose RoleArn contains Match (IAM calls have none)

	// Actions, when set, selects the calls instead of "every STS action":
	// an action name ("CreateAccessKey"), SERVICE:ACTION ("iam:GetUser"),
	// SERVICE:* ("iam:*" for every IAM call, "sts:*") or "*" for all.
	Actions []string
}

// FaultStep is one entry of FaultPlan.Sequence.
type FaultStep struct {
	Fault Fault `json:"fault"`
	Count int   `json:"count"`
}

// faultPlanJSON is the control API's form of a FaultPlan.
type faultPlanJSON struct {
	Sequence    []FaultStep       `json:"sequence"`
	Probability map[Fault]float64 `json:"probability"`
	Hang        string            `json:"hang,omitempty"`
	Match       string            `json:"match,omitempty"`
	Actions     []string          `json:"actions,omitempty"`
}

// MarshalJSON renders the plan as the control API shows it, with Hang as a
// Go duration string.
func (p FaultPlan) MarshalJSON() ([]byte, error) {
	j := faultPlanJSON{Sequence: p.Sequence, Probability: p.Probability, Match: p.Match, Actions: p.Actions}
	if j.Sequence == nil {
		j.Sequence = []FaultStep{}
	}
	if j.Probability == nil {
		j.Probability = map[Fault]float64{}
	}
	if p.Hang > 0 {
		j.Hang = p.Hang.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON parses the control API form and validates it.
func (p *FaultPlan) UnmarshalJSON(b []byte) error {
	var j faultPlanJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	out := FaultPlan{Sequence: j.Sequence, Probability: j.Probability, Match: j.Match, Actions: j.Actions}
	if j.Hang != "" {
		d, err := time.ParseDuration(j.Hang)
		if err != nil {
			return fmt.Errorf("hang: %w", err)
		}
		out.Hang = d
	}
	if err := out.Validate(); err != nil {
		return err
	}
	*p = out
	return nil
}

// Validate checks fault names, counts and probabilities.
func (p FaultPlan) Validate() error {
	for _, s := range p.Sequence {
		if !s.Fault.Valid() {
			return fmt.Errorf("unknown fault %q (known: %s)", s.Fault, faultNames())
		}
		if s.Count < 0 {
			return fmt.Errorf("fault %s: negative count %d", s.Fault, s.Count)
		}
	}
	sum := 0.0
	for f, pr := range p.Probability {
		if !f.Valid() {
			return fmt.Errorf("unknown fault %q (known: %s)", f, faultNames())
		}
		if pr < 0 || pr > 1 {
			return fmt.Errorf("fault %s: probability %v outside [0,1]", f, pr)
		}
		sum += pr
	}
	if sum > 1+1e-9 {
		return fmt.Errorf("fault probabilities add up to %v, more than 1", sum)
	}
	if p.Hang < 0 {
		return fmt.Errorf("negative hang %s", p.Hang)
	}
	for _, a := range p.Actions {
		if !validActionSelector(a) {
			return fmt.Errorf("unknown action %q (want an action name, SERVICE:ACTION, SERVICE:* or *; services sts, iam; actions %s)",
				a, actionNames())
		}
	}
	return nil
}

// validActionSelector reports whether sel names served actions.
func validActionSelector(sel string) bool {
	if sel == "*" {
		return true
	}
	svc, name, scoped := strings.Cut(sel, ":")
	if !scoped {
		_, sts := stsActions[sel]
		_, iam := iamActions[sel]
		return sts || iam
	}
	for _, a := range []*api{stsAPI, iamAPI} {
		if a.service == svc {
			_, ok := a.actions[name]
			return ok || name == "*"
		}
	}
	return false
}

// selects reports whether the plan applies to a call of action on service.
func (p FaultPlan) selects(service, action string) bool {
	if len(p.Actions) == 0 {
		return service == stsService
	}
	for _, sel := range p.Actions {
		svc, name, scoped := strings.Cut(sel, ":")
		switch {
		case sel == "*",
			!scoped && sel == action,
			scoped && svc == service && (name == "*" || name == action):
			return true
		}
	}
	return false
}

func actionNames() string {
	names := append(slices.Sorted(maps.Keys(stsActions)), slices.Sorted(maps.Keys(iamActions))...)
	return strings.Join(names, ", ")
}

func faultNames() string {
	var names []string
	for _, f := range AllFaults() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// ParseFaultPlan parses the command-line form of a plan: a JSON object as
// the control API takes, or comma-separated items:
//
//	FAULT:N    the next N calls get FAULT (in order of appearance; ":N" defaults to 1)
//	FAULT=P    afterwards, each call gets FAULT with probability P
//	hang=DUR   how long the hang fault holds a request (Go duration)
//	match=STR  only fault calls whose RoleArn contains STR
//	action=SEL only fault calls SEL selects (repeatable; see FaultPlan.Actions)
//
// Example: "Throttling:3,reset,InternalFailure=0.2,hang=5s,match=app", or
// "ServiceUnavailable:1,action=CreateAccessKey".
func ParseFaultPlan(s string) (FaultPlan, error) {
	s = strings.TrimSpace(s)
	var p FaultPlan
	if s == "" {
		return p, nil
	}
	if strings.HasPrefix(s, "{") {
		err := json.Unmarshal([]byte(s), &p)
		return p, err
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if k, v, ok := strings.Cut(item, "="); ok {
			switch k {
			case "hang":
				d, err := time.ParseDuration(v)
				if err != nil {
					return FaultPlan{}, fmt.Errorf("faults: hang: %w", err)
				}
				p.Hang = d
			case "match":
				p.Match = v
			case "action":
				p.Actions = append(p.Actions, v)
			default:
				pr, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return FaultPlan{}, fmt.Errorf("faults: %q: probability: %w", item, err)
				}
				if p.Probability == nil {
					p.Probability = map[Fault]float64{}
				}
				p.Probability[Fault(k)] = pr
			}
			continue
		}
		name, count, hasCount := strings.Cut(item, ":")
		n := 1
		if hasCount {
			var err error
			if n, err = strconv.Atoi(count); err != nil {
				return FaultPlan{}, fmt.Errorf("faults: %q: count: %w", item, err)
			}
		}
		p.Sequence = append(p.Sequence, FaultStep{Fault: Fault(name), Count: n})
	}
	if err := p.Validate(); err != nil {
		return FaultPlan{}, fmt.Errorf("faults: %w", err)
	}
	return p, nil
}

// faultState is the plan in force plus how far its Sequence has got.
// Guarded by Emulator.mu.
type faultState struct {
	plan    FaultPlan
	step    int // index into plan.Sequence
	used    int // calls already faulted by plan.Sequence[step]
	ordered []Fault
}

func (s *faultState) set(p FaultPlan) {
	p.Sequence = slices.Clone(p.Sequence)
	p.Actions = slices.Clone(p.Actions)
	prob := make(map[Fault]float64, len(p.Probability))
	s.ordered = s.ordered[:0]
	for f, pr := range p.Probability {
		if pr > 0 {
			prob[f] = pr
			s.ordered = append(s.ordered, f)
		}
	}
	// A fixed order makes a seeded run reproducible despite map iteration.
	slices.Sort(s.ordered)
	p.Probability = prob
	s.plan, s.step, s.used = p, 0, 0
}

// pick returns the fault for the next call, if any, and the hang duration.
func (s *faultState) pick(service, action, roleArn string, rng *mrand.Rand) (Fault, time.Duration) {
	if !s.plan.selects(service, action) {
		return "", 0
	}
	if s.plan.Match != "" && !strings.Contains(roleArn, s.plan.Match) {
		return "", 0
	}
	hang := s.plan.Hang
	if hang <= 0 {
		hang = DefaultHang
	}
	for s.step < len(s.plan.Sequence) {
		st := s.plan.Sequence[s.step]
		if s.used < st.Count {
			s.used++
			return st.Fault, hang
		}
		s.step, s.used = s.step+1, 0
	}
	if len(s.ordered) == 0 {
		return "", 0
	}
	// One draw against cumulative bands gives each fault exactly its own
	// probability (they are disjoint because Validate caps the sum at 1).
	u, acc := rng.Float64(), 0.0
	for _, f := range s.ordered {
		acc += s.plan.Probability[f]
		if u < acc {
			return f, hang
		}
	}
	return "", 0
}

// remaining is the plan with Sequence reduced to what is left.
func (s *faultState) remaining() FaultPlan {
	p := s.plan
	p.Actions = slices.Clone(s.plan.Actions)
	p.Sequence = nil
	for i := s.step; i < len(s.plan.Sequence); i++ {
		st := s.plan.Sequence[i]
		if i == s.step {
			st.Count -= s.used
		}
		if st.Count > 0 {
			p.Sequence = append(p.Sequence, st)
		}
	}
	if len(s.plan.Probability) > 0 {
		p.Probability = make(map[Fault]float64, len(s.plan.Probability))
		for f, pr := range s.plan.Probability {
			p.Probability[f] = pr
		}
	}
	return p
}
