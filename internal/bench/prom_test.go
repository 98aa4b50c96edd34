package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPromValue(t *testing.T) {
	body := []byte(`# HELP aws_resilient_roles Roles in each state.
# TYPE aws_resilient_roles gauge
aws_resilient_roles{mount="bench-f",state="fresh"} 7
# HELP aws_resilient_roles_scheduled Roles the refresher on this node has in hand.
# TYPE aws_resilient_roles_scheduled gauge
aws_resilient_roles_scheduled{mount="bench-f"} 10000
aws_resilient_refresher_running 1
aws_resilient_retry_window_seconds{mount="a}b"} 30
`)
	tests := []struct {
		name string
		want float64
		ok   bool
	}{
		{"aws_resilient_roles_scheduled", 10000, true},
		{"aws_resilient_roles", 7, true},
		{"aws_resilient_refresher_running", 1, true},
		{"aws_resilient_retry_window_seconds", 30, true},
		{"aws_resilient_roles_sched", 0, false},
		{"aws_resilient_roles_cached", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := PromValue(body, tt.name)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("PromValue(%s) = %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestPromSum(t *testing.T) {
	body := []byte(`# TYPE aws_resilient_entity_credentials_dropped_total counter
aws_resilient_entity_credentials_dropped_total{mount="bench-g",reason="idle"} 3
aws_resilient_entity_credentials_dropped_total{mount="bench-g",reason="entity_gone"} 2
aws_resilient_entity_credentials_dropped_totals 100
aws_resilient_entity_credentials{mount="bench-g"} 1000
`)
	tests := []struct {
		name string
		want float64
		ok   bool
	}{
		{"aws_resilient_entity_credentials_dropped_total", 5, true},
		{"aws_resilient_entity_credentials", 1000, true},
		{"aws_resilient_entity", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := PromSum(body, tt.name)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("PromSum(%s) = %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestLogLineTimes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vault.log")
	log := `==> Vault server started! Log data will stream in below:
2026-12-01T04:27:18.123Z [INFO]  secrets.aws-resilient.aws-resilient_1: refresher started: roles=10
2026-12-01T04:27:19.000Z [WARN]  core: something else
2026-12-01T04:28:00.5+01:00 [INFO]  secrets.aws-resilient.aws-resilient_2: refresher started: roles=10
not a timestamp refresher started
`
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LogLineTimes(path, "refresher started")
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Time{
		time.Date(2026, 12, 1, 4, 27, 18, 123e6, time.UTC),
		time.Date(2026, 12, 1, 3, 28, 0, 5e8, time.UTC),
	}
	if len(got) != len(want) {
		t.Fatalf("got %d times, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Errorf("line %d: got %s, want %s", i, got[i], want[i])
		}
	}
}

func TestLogField(t *testing.T) {
	line := `2026-12-01T08:00:01.5Z [INFO]  secrets.aws-resilient.aws-resilient_1: first reconciler pass done: roles=10000 took=1.234s`
	for _, tt := range []struct {
		key, want string
		ok        bool
	}{
		{"roles", "10000", true},
		{"took", "1.234s", true},
		{"planned_from_index", "", false},
	} {
		if got, ok := LogField(line, tt.key); got != tt.want || ok != tt.ok {
			t.Errorf("LogField(%s) = %q, %v; want %q, %v", tt.key, got, ok, tt.want, tt.ok)
		}
	}
}
