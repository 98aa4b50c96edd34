package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
)

// Section f's reads of the whole mount (issue 46), on the filled server
// once every role is cached: a LIST of roles/ and of status/, whole and a
// page, and one scrape of the metrics path at the default
// metrics_max_roles. And the plugin's Go heap, from the runtime's own
// trace (GODEBUG=gctrace=1, which section f sets for its single server's
// plugin): what RSS holds beyond it is the runtime's and the soft memory
// limit's headroom.

// scaleListPage is the page size of the paged LISTs.
const scaleListPage = 1000

// scaleHeapTarget is the most Go heap per role the plugin may hold above
// its empty mount's at scaleTargetRoles (issue 46).
const scaleHeapTarget = 1536

// listTiming is one LIST or one scrape.
type listTiming struct {
	What string `json:"what"`
	// Limit is the page asked for; 0 the whole list.
	Limit int `json:"limit"`
	Keys  int `json:"keys"`
	Bytes int `json:"bytes"`
	// Secs is the answer's wall time; PluginCPUMs the plugin process's CPU
	// over it.
	Secs        float64 `json:"seconds"`
	PluginCPUMs float64 `json:"plugin_cpu_ms"`
}

// scaleLists times the LISTs and the scrape on the filled server.
func (r *run) scaleLists(sr *scaleRun) []listTiming {
	tb, a := r.tb, sr.a
	pid := r.scalePID(sr.s)
	timed := func(what string, limit int, get func() ([]byte, error)) listTiming {
		c0, err := bench.ReadCPU(pid)
		must(tb, err)
		t0 := time.Now()
		body, err := get()
		el := time.Since(t0)
		must(tb, err)
		c1, err := bench.ReadCPU(pid)
		must(tb, err)
		lt := listTiming{What: what, Limit: limit, Keys: countKeys(body), Bytes: len(body), Secs: el.Seconds(),
			PluginCPUMs: float64(c1-c0) / float64(time.Millisecond)}
		r.logf("f: %s (limit %d), %d roles: %d keys, %d bytes in %.2fs, plugin CPU %.0f ms", what, limit, sr.n, lt.Keys, lt.Bytes, lt.Secs, lt.PluginCPUMs)
		return lt
	}
	var out []listTiming
	for _, what := range []string{"roles", "status"} {
		for _, limit := range []int{0, scaleListPage} {
			q := ""
			if limit > 0 {
				q = "?limit=" + strconv.Itoa(limit)
			}
			path := scaleMount + "/" + what + "/" + q
			out = append(out, timed("LIST "+what+"/", limit, func() ([]byte, error) { return a.listRaw(path) }))
		}
	}
	// One scrape at the default metrics_max_roles (the section keeps it 0
	// otherwise, as its gauge is polled): a read first, so that the one
	// timed loads nothing, as in section e.
	must(tb, a.write(scaleMount+"/config/refresh", map[string]any{"metrics_max_roles": defaultMetricsMaxRoles}))
	_, err := a.getRaw(scaleMount + "/metrics")
	must(tb, err)
	sc := timed("scrape", defaultMetricsMaxRoles, func() ([]byte, error) { return a.getRaw(scaleMount + "/metrics") })
	sc.Keys = 0
	out = append(out, sc)
	must(tb, a.write(scaleMount+"/config/refresh", map[string]any{"metrics_max_roles": 0}))
	return out
}

// defaultMetricsMaxRoles is the plugin's default metrics_max_roles.
const defaultMetricsMaxRoles = 1000

// listRaw sends LIST /v1/path and returns the body as sent.
func (a *api) listRaw(path string) ([]byte, error) {
	req, err := http.NewRequest("LIST", a.addr+"/v1/"+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Vault-Token", a.token)
	resp, err := a.c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("LIST %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("LIST %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("LIST %s: HTTP %d", path, resp.StatusCode)
	}
	return b, nil
}

// keysRE finds the keys array of a LIST answer.
var keysRE = regexp.MustCompile(`"keys":\[([^\]]*)\]`)

// countKeys is how many keys a LIST answer holds (0 for anything else).
func countKeys(body []byte) int {
	m := keysRE.FindSubmatch(body)
	if m == nil || len(m[1]) == 0 {
		return 0
	}
	n := 1
	for _, c := range m[1] {
		if c == ',' {
			n++
		}
	}
	return n
}

// gctraceRE is the heap figures of a GODEBUG=gctrace=1 line: the heap at
// the cycle's start, at its end, and live ("4->4->2 MB").
var gctraceRE = regexp.MustCompile(`(\d+)->(\d+)->(\d+) MB`)

// liveHeapAt is the Go heap the last GC before t found live, in bytes
// (MiB precision, as the runtime prints it), from the gctrace lines in the
// log at path; -1 when there is none.
func liveHeapAt(path string, t time.Time) int64 {
	lines, err := bench.LogLines(path, " MB goal")
	if err != nil {
		return -1
	}
	live := int64(-1)
	for _, ln := range lines {
		if ln.Time.After(t) {
			break
		}
		if m := gctraceRE.FindStringSubmatch(ln.Text); m != nil {
			v, _ := strconv.ParseInt(m[3], 10, 64)
			live = v << 20
		}
	}
	return live
}

// scaleGCTraceEnv is the plugin environment that makes its runtime trace
// each GC to stderr, which Vault logs (at debug, as section f runs it).
const scaleGCTraceEnv = "GODEBUG=gctrace=1"

// heapRows are the Go heap rows: live heap with every role cached and per
// role above the empty mount, judged at scaleTargetRoles.
func heapRows(n int, empty, last int64, atSize func(int, bool) string) []bench.Row {
	if empty < 0 || last < 0 {
		return []bench.Row{{Section: "f", Metric: fmt.Sprintf("plugin Go heap, %d roles cached (GODEBUG=gctrace=1)", n), Value: "not seen in Vault's log"}}
	}
	per := float64(last-empty) / float64(max(n, 1))
	return []bench.Row{{Section: "f",
		Metric: fmt.Sprintf("plugin Go heap live after the last GC, %d roles cached: per role above the empty mount (%s live; empty mount %s; MiB precision)", n, mib(last), mib(empty)),
		Value:  fmt.Sprintf("%.0f B/role", per), Target: fmt.Sprintf("<= %d B/role at %d", scaleHeapTarget, scaleTargetRoles),
		Result: atSize(scaleTargetRoles, per <= scaleHeapTarget)}}
}

// listRows are the LIST and scrape rows; they carry no target (issue 46
// asks for the time, and whether the answer pages).
func listRows(n int, lists []listTiming) []bench.Row {
	var rows []bench.Row
	for _, l := range lists {
		page := "whole, one answer"
		if l.Limit > 0 {
			page = fmt.Sprintf("a page of limit=%d (after= for the next)", l.Limit)
		}
		metric := fmt.Sprintf("%s, %d roles: %s, %d keys, %.1f MiB", l.What, n, page, l.Keys, float64(l.Bytes)/(1<<20))
		if l.What == "scrape" {
			metric = fmt.Sprintf("one scrape at the default metrics_max_roles (%d), %d roles: %.1f KiB", l.Limit, n, float64(l.Bytes)/1024)
		}
		rows = append(rows, bench.Row{Section: "f", Metric: metric + fmt.Sprintf(" (plugin CPU %.0f ms)", l.PluginCPUMs), Value: fmt.Sprintf("%.2fs", l.Secs)})
	}
	return rows
}
