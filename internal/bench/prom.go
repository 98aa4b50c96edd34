package bench

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
)

// PromValue returns the value of the first series of the metric name in a
// Prometheus text exposition (any labels), and false when the body has no
// such series. It is enough for reading one gauge of the plugin's metrics
// path; it is not a parser for the whole format.
func PromValue(body []byte, name string) (float64, bool) {
	var v float64
	found := false
	promSeries(body, name, func(x float64) bool {
		v, found = x, true
		return false
	})
	return v, found
}

// PromSum returns the sum of every series of the metric name (any labels),
// and false when the body has none: the total of a counter that a label
// splits, such as the entity credentials dropped for each reason.
func PromSum(body []byte, name string) (float64, bool) {
	var sum float64
	found := false
	promSeries(body, name, func(x float64) bool {
		sum, found = sum+x, true
		return true
	})
	return sum, found
}

// promSeries calls fn with the value of each series of the metric name, in
// order, until fn returns false.
func promSeries(body []byte, name string, fn func(v float64) bool) {
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		if !bytes.HasPrefix(line, []byte(name)) {
			continue
		}
		rest := line[len(name):]
		// The name must end here: aws_resilient_roles is a prefix of
		// aws_resilient_roles_scheduled.
		if len(rest) == 0 || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if rest[0] == '{' {
			j := bytes.LastIndexByte(rest, '}')
			if j < 0 {
				continue
			}
			rest = rest[j+1:]
		}
		f := strings.Fields(string(rest))
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		if !fn(v) {
			return
		}
	}
}

// LogLineTimes returns the timestamps of the lines of a Vault server log
// that contain substr, oldest first. Vault (hclog) starts each line with an
// RFC 3339 time in milliseconds; plugin log lines come through it with the
// time Vault received them. Lines without a leading timestamp are skipped.
func LogLineTimes(path, substr string) ([]time.Time, error) {
	lines, err := LogLines(path, substr)
	out := make([]time.Time, len(lines))
	for i, l := range lines {
		out[i] = l.Time
	}
	return out, err
}

// LogLine is one line of a Vault server log: its leading timestamp and the
// whole line.
type LogLine struct {
	Time time.Time
	Text string
}

// LogLines is LogLineTimes with each line's text, for the key=value pairs
// a line carries (see LogField).
func LogLines(path, substr string) ([]LogLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []LogLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, substr) {
			continue
		}
		ts, _, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		out = append(out, LogLine{Time: t, Text: line})
	}
	return out, sc.Err()
}

// LogField returns the value of key=value in an hclog line ("" and false
// when the line has no such key).
func LogField(line, key string) (string, bool) {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return strings.Trim(v, `"`), true
		}
	}
	return "", false
}
