package stsemu

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// ConfigView is the control API's view of the runtime-adjustable settings
// (GET /_emulator/config).
type ConfigView struct {
	Rate           float64  `json:"rate"`
	Burst          int      `json:"burst"`
	LatencyMin     string   `json:"latency_min"`
	LatencyMax     string   `json:"latency_max"`
	MaxLifetime    string   `json:"max_lifetime"`
	Deny           []string `json:"deny"`
	IAMPropagation string   `json:"iam_propagation"` // see Config.IAMPropagation
	// The IAM windows (IAMWindows) and the partition (read only).
	IAMInconsistency        string  `json:"iam_inconsistency"`
	IAMInconsistencyRefusal float64 `json:"iam_inconsistency_refusal"`
	IAMRevocation           string  `json:"iam_revocation"`
	IAMRefuseFirst          int     `json:"iam_refuse_first"`
	Partition               string  `json:"partition"`
	IAMRegion               string  `json:"iam_region"`
	// ClockOffset is how far the emulator's clock (AWS's, as it plays it)
	// is from its host's (SetClockOffset): "60s", "-4m0s".
	ClockOffset string `json:"clock_offset"`
	// SkewTolerance is how far a signature's time may be off (read only).
	SkewTolerance string `json:"skew_tolerance"`
	// Accounts are the accounts played, the -account first (Accounts).
	Accounts []string `json:"accounts"`
}

// configUpdate is a POST /_emulator/config body: only the fields sent apply.
type configUpdate struct {
	Rate        *float64  `json:"rate"`
	Burst       *int      `json:"burst"`
	LatencyMin  *string   `json:"latency_min"`
	LatencyMax  *string   `json:"latency_max"`
	MaxLifetime *string   `json:"max_lifetime"`
	Deny        *[]string `json:"deny"`

	IAMPropagation *string `json:"iam_propagation"`

	IAMInconsistency        *string  `json:"iam_inconsistency"`
	IAMInconsistencyRefusal *float64 `json:"iam_inconsistency_refusal"`
	IAMRevocation           *string  `json:"iam_revocation"`
	IAMRefuseFirst          *int     `json:"iam_refuse_first"`

	// ClockOffset may be negative: AWS's clock behind the host's.
	ClockOffset *string `json:"clock_offset"`

	// Accounts replaces the accounts played besides the -account.
	Accounts *[]string `json:"accounts"`
}

// ConfigView returns the current runtime settings.
func (e *Emulator) ConfigView() ConfigView {
	accounts := e.Accounts() // its own lock, not taken under mu
	e.mu.Lock()
	defer e.mu.Unlock()
	deny := append([]string{}, e.deny...)
	w := e.iam.getWindows()
	return ConfigView{
		IAMInconsistency:        w.Inconsistency.String(),
		IAMInconsistencyRefusal: w.Refusal,
		IAMRevocation:           w.Revocation.String(),
		IAMRefuseFirst:          w.RefuseFirst,
		Partition:               e.partition.Name,
		IAMRegion:               e.partition.IAMRegion,
		Rate:                    e.rateLimit,
		Burst:                   e.burst,
		LatencyMin:              e.latencyMin.String(),
		LatencyMax:              e.latencyMax.String(),
		MaxLifetime:             e.maxLifetime.String(),
		Deny:                    deny,
		// The IAM directory has its own lock; taking it under e.mu is the
		// only nesting of the two, so it cannot deadlock.
		IAMPropagation: e.iam.getPropagation().String(),
		ClockOffset:    e.clockOffset().String(),
		SkewTolerance:  e.skewTolerance.String(),
		Accounts:       accounts,
	}
}

// serveControl is the JSON control API. It is unsigned, so it answers only
// loopback clients: the emulator may listen on a wider address for a
// container, but nobody else should re-plan its faults.
func (e *Emulator) serveControl(w http.ResponseWriter, r *http.Request) {
	if !isLoopback(r.RemoteAddr) {
		writeJSONError(w, http.StatusForbidden, "the control API answers loopback clients only")
		return
	}
	switch r.URL.Path {
	case controlPrefix + "stats":
		if allow(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, e.Stats())
		}
	case controlPrefix + "calls":
		if allow(w, r, http.MethodGet) {
			calls := e.Calls()
			if calls == nil {
				calls = []Call{}
			}
			writeJSON(w, http.StatusOK, calls)
		}
	case controlPrefix + "reset":
		if allow(w, r, http.MethodPost) {
			e.ResetStats()
			writeJSON(w, http.StatusOK, e.Stats())
		}
	case controlPrefix + "config":
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, http.StatusOK, e.ConfigView())
		case http.MethodPost:
			var u configUpdate
			if err := decodeBody(r, &u); err != nil {
				writeJSONError(w, http.StatusBadRequest, err.Error())
				return
			}
			if err := e.applyConfig(u); err != nil {
				writeJSONError(w, http.StatusBadRequest, err.Error())
				return
			}
			writeJSON(w, http.StatusOK, e.ConfigView())
		default:
			allow(w, r, http.MethodGet, http.MethodPost)
		}
	case controlPrefix + "iam/users":
		if allow(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, e.IAMUsers())
		}
	case controlPrefix + "listeners":
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, http.StatusOK, e.Listeners())
		case http.MethodPost:
			var u struct {
				Addr  string `json:"addr"`
				State string `json:"state"`
			}
			if err := decodeBody(r, &u); err != nil {
				writeJSONError(w, http.StatusBadRequest, err.Error())
				return
			}
			if via, _ := e.listenerOf(r); u.State == ListenerRefused && via != "" && via == strings.TrimPrefix(u.Addr, "http://") {
				// Closing it would cut this very request before its answer.
				writeJSONError(w, http.StatusBadRequest, "this request came through "+via+": send it through another listener to refuse that one")
				return
			}
			if err := e.SetListenerState(u.Addr, u.State); err != nil {
				writeJSONError(w, http.StatusBadRequest, err.Error())
				return
			}
			writeJSON(w, http.StatusOK, e.Listeners())
		default:
			allow(w, r, http.MethodGet, http.MethodPost)
		}
	case controlPrefix + "roles":
		e.serveRoles(w, r)
	case controlPrefix + "faults":
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, http.StatusOK, e.Faults())
		case http.MethodPost:
			var p FaultPlan
			if err := decodeBody(r, &p); err != nil {
				writeJSONError(w, http.StatusBadRequest, err.Error())
				return
			}
			e.SetFaults(p)
			writeJSON(w, http.StatusOK, e.Faults())
		case http.MethodDelete:
			e.ClearFaults()
			writeJSON(w, http.StatusOK, e.Faults())
		default:
			allow(w, r, http.MethodGet, http.MethodPost, http.MethodDelete)
		}
	default:
		writeJSONError(w, http.StatusNotFound,
			"unknown control path; try stats, calls, reset, config, faults, listeners, roles or iam/users under "+controlPrefix)
	}
}

// applyConfig validates the whole update before applying any of it, so a
// bad field leaves the settings untouched.
func (e *Emulator) applyConfig(u configUpdate) error {
	parse := func(name string, s *string) (time.Duration, error) {
		if s == nil {
			return 0, nil
		}
		d, err := time.ParseDuration(*s)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		if d < 0 {
			return 0, fmt.Errorf("%s: negative duration %s", name, d)
		}
		return d, nil
	}
	lmin, err := parse("latency_min", u.LatencyMin)
	if err != nil {
		return err
	}
	lmax, err := parse("latency_max", u.LatencyMax)
	if err != nil {
		return err
	}
	life, err := parse("max_lifetime", u.MaxLifetime)
	if err != nil {
		return err
	}
	propagation, err := parse("iam_propagation", u.IAMPropagation)
	if err != nil {
		return err
	}
	inconsistency, err := parse("iam_inconsistency", u.IAMInconsistency)
	if err != nil {
		return err
	}
	revocation, err := parse("iam_revocation", u.IAMRevocation)
	if err != nil {
		return err
	}
	if r := u.IAMInconsistencyRefusal; r != nil && (*r < 0 || *r > 1) {
		return fmt.Errorf("iam_inconsistency_refusal: %v is not a probability in [0, 1]", *r)
	}
	if n := u.IAMRefuseFirst; n != nil && *n < 0 {
		return fmt.Errorf("iam_refuse_first: negative %d", *n)
	}
	if u.Rate != nil && *u.Rate < 0 {
		return fmt.Errorf("rate: negative %v", *u.Rate)
	}
	var offset time.Duration
	if u.ClockOffset != nil {
		if offset, err = time.ParseDuration(*u.ClockOffset); err != nil {
			return fmt.Errorf("clock_offset: %w", err)
		}
	}
	if u.Accounts != nil {
		if err := e.SetAccounts(*u.Accounts); err != nil {
			return fmt.Errorf("accounts: %w", err)
		}
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	if u.Rate != nil || u.Burst != nil {
		r, b := e.rateLimit, e.burst
		if u.Rate != nil {
			r = *u.Rate
		}
		if u.Burst != nil {
			b = *u.Burst
		}
		e.setRateLocked(r, b)
	}
	if u.LatencyMin != nil || u.LatencyMax != nil {
		lo, hi := e.latencyMin, e.latencyMax
		if u.LatencyMin != nil {
			lo = lmin
		}
		if u.LatencyMax != nil {
			hi = lmax
		}
		e.setLatencyLocked(lo, hi)
	}
	if u.MaxLifetime != nil {
		if life == 0 {
			life = DefaultMaxLifetime
		}
		e.maxLifetime = life
	}
	if u.Deny != nil {
		e.deny = append([]string(nil), (*u.Deny)...)
	}
	if u.IAMPropagation != nil {
		e.iam.setPropagation(propagation)
	}
	if u.ClockOffset != nil {
		e.SetClockOffset(offset)
	}
	if u.IAMInconsistency != nil || u.IAMInconsistencyRefusal != nil || u.IAMRevocation != nil || u.IAMRefuseFirst != nil {
		w := e.iam.getWindows()
		if u.IAMInconsistency != nil {
			w.Inconsistency = inconsistency
		}
		if u.IAMInconsistencyRefusal != nil {
			w.Refusal = *u.IAMInconsistencyRefusal
		}
		if u.IAMRevocation != nil {
			w.Revocation = revocation
		}
		if u.IAMRefuseFirst != nil {
			w.RefuseFirst = *u.IAMRefuseFirst
		}
		e.iam.setWindows(w)
	}
	return nil
}

func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// allow reports whether r uses one of methods, answering 405 otherwise.
func allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	for _, m := range methods {
		w.Header().Add("Allow", m)
	}
	writeJSONError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed")
	return false
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding request body: %w", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
