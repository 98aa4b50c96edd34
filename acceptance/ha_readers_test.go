package acceptance

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// haReadInterval is the pause between two reads of one reader: fine enough
// to measure the election gap to a tenth of a second, light enough for
// two cores that also run three Vault servers.
const haReadInterval = 100 * time.Millisecond

// haRead is one read by a reader.
type haRead struct {
	node       string
	start, end time.Time
	err        string    // "" on success; never holds a secret
	expiration time.Time // of the credential served
}

// haReaders poll creds/<role> through the given nodes, one goroutine per
// node, cycling through every role, as applications would while the active
// node dies.
type haReaders struct {
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex // guards reads
	reads []haRead
}

func startHAReaders(t *testing.T, h *haRun, nodes []*vaulttest.Server) *haReaders {
	t.Helper()
	r := &haReaders{stop: make(chan struct{})}
	for n, node := range nodes {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			// A short timeout: a request stuck behind a dead active node
			// shows up as an error, not as a silent pause.
			client := haClient(5 * time.Second)
			for k := n * 37; ; k++ {
				role := h.roles[k%len(h.roles)]
				rd := haRead{node: node.NodeID(), start: time.Now()}
				c, err := readCredsHTTP(client, node, role)
				rd.end = time.Now()
				if err != nil {
					rd.err = err.Error()
				} else {
					rd.expiration = c.Expiration
				}
				r.mu.Lock()
				r.reads = append(r.reads, rd)
				r.mu.Unlock()
				select {
				case <-r.stop:
					return
				case <-time.After(haReadInterval):
				}
			}
		}()
	}
	t.Cleanup(r.halt)
	return r
}

// halt stops the readers (idempotent).
func (r *haReaders) halt() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.wg.Wait()
}

// stopAt lets the readers run until t, then stops them. The wait is the
// length of the observation window, not an assertion.
func (r *haReaders) stopAt(t time.Time) {
	time.Sleep(time.Until(t))
	r.halt()
}

// haReaderSummary is what the readers saw.
type haReaderSummary struct {
	reads, errors           int
	earlyErrors, lateErrors int // errors before the kill / after the grace
	firstEarly, firstLate   string
	expired                 int           // credentials served already expired
	maxGap                  time.Duration // longest time without a successful read, any reader
	detail                  string
}

func (r *haReaders) summary(killAt, electedAt time.Time) haReaderSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s haReaderSummary
	byNode := map[string][]haRead{}
	for _, rd := range r.reads {
		byNode[rd.node] = append(byNode[rd.node], rd)
		if rd.err == "" {
			s.reads++
			// Received after its expiration: served expired.
			if !rd.expiration.After(rd.end) {
				s.expired++
			}
			continue
		}
		s.errors++
		switch {
		case rd.end.Before(killAt):
			if s.earlyErrors == 0 {
				s.firstEarly = rd.err
			}
			s.earlyErrors++
		case rd.start.After(electedAt.Add(haReadGrace)):
			if s.lateErrors == 0 {
				s.firstLate = fmt.Sprintf("%s after the election: %s", rd.start.Sub(electedAt).Round(time.Millisecond), rd.err)
			}
			s.lateErrors++
		}
	}
	var nodes []string
	for n := range byNode {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	var parts []string
	for _, n := range nodes {
		var ok, bad int
		var lastOK time.Time
		var gap time.Duration
		var firstErr, lastErr time.Time
		msgs := map[string]int{}
		for _, rd := range byNode[n] {
			if rd.err != "" {
				bad++
				if firstErr.IsZero() {
					firstErr = rd.start
				}
				lastErr = rd.end
				msgs[shortError(rd.err)]++
				continue
			}
			ok++
			if !lastOK.IsZero() && rd.end.Sub(lastOK) > gap {
				gap = rd.end.Sub(lastOK)
			}
			lastOK = rd.end
		}
		if gap > s.maxGap {
			s.maxGap = gap
		}
		p := fmt.Sprintf("%s: %d ok, %d errors, longest gap between successful reads %s", n, ok, bad, gap.Round(time.Millisecond))
		if bad > 0 {
			p += fmt.Sprintf(", errors from kill%+.1fs to kill%+.1fs", firstErr.Sub(killAt).Seconds(), lastErr.Sub(killAt).Seconds())
			for m, c := range msgs {
				p += fmt.Sprintf("; %dx %q", c, m)
			}
		}
		parts = append(parts, p)
	}
	s.detail = strings.Join(parts, " | ")
	return s
}

// shortError strips the role name from a reader's error so that errors
// group by cause.
var roleInError = regexp.MustCompile(`ha-\d{3}`)

func shortError(e string) string {
	e = roleInError.ReplaceAllString(e, "<role>")
	if len(e) > 160 {
		e = e[:160] + "..."
	}
	return e
}

// logLine returns the last line of node's log matching re, or "".
func logLine(node *vaulttest.Server, re *regexp.Regexp) string {
	b, err := os.ReadFile(node.Process.LogPath)
	if err != nil {
		return ""
	}
	m := re.FindAll(b, -1)
	if len(m) == 0 {
		return ""
	}
	return string(m[len(m)-1])
}
